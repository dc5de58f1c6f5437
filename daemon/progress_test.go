package daemon

import (
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/cuda/cudafake"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// noWaker is an agent without the optional progress interfaces.
type noWaker struct{ nixl.Agent }

// TestWrappersKeepProgress: WithCUDAIPC and WithFileMapping pass the agent's
// nixl.Waker and nixl.Dueer on (the transfer pool parks on the wake-up; a
// wrapper that hid them made it poll every millisecond), keep their own
// methods (ImportVRAM, Attach), and add neither to an agent that has none.
func TestWrappersKeepProgress(t *testing.T) {
	g := cudafake.New(1)
	v, err := loopback.NewVRAM("progress-vram", loopback.Options{Dir: t.TempDir()}, g.Process())
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	la, err := loopback.New("progress-host", loopback.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer la.Close()
	for _, c := range []struct {
		name          string
		a             Agent
		waker, dueer  bool
		vram, mapping bool
	}{
		{"cuda over loopback VRAM", WithCUDAIPC(v, g.Process()), true, true, true, true},
		{"cuda over file mapping over loopback", WithCUDAIPC(WithFileMapping(la), g.Process()), true, true, true, true},
		{"file mapping over loopback", WithFileMapping(la), true, true, false, true},
		{"file mapping over an agent without wake-ups", WithFileMapping(noWaker{la}), false, false, false, true},
		{"cuda over file mapping over an agent without wake-ups", WithCUDAIPC(WithFileMapping(noWaker{la}), g.Process()), false, false, true, true},
	} {
		_, w := c.a.(nixl.Waker)
		_, d := c.a.(nixl.Dueer)
		_, vi := c.a.(VRAMImporter)
		if w != c.waker || d != c.dueer || vi != c.vram {
			t.Errorf("%s: Waker %v Dueer %v VRAMImporter %v, want %v %v %v", c.name, w, d, vi, c.waker, c.dueer, c.vram)
		}
	}
	// A batch through the wrappers is the agent's own (libnixl's, one hop),
	// and so is whether it polls itself.
	self := selfPolling{la, new(int)}
	for _, a := range []Agent{WithFileMapping(self), WithCUDAIPC(WithFileMapping(self), g.Process())} {
		if !nixl.PollsItself(a) {
			t.Errorf("%T: a self-polling agent's wrapper says it does not poll itself", a)
		}
		before := *self.batches
		if err := a.(nixl.Batcher).Batch(func(nixl.Requests) {}); err != nil || *self.batches != before+1 {
			t.Errorf("%T: Batch %v, the agent's batches %d → %d, want one more", a, err, before, *self.batches)
		}
	}
	if nixl.PollsItself(WithFileMapping(la)) {
		t.Error("a wrapper over loopback, which does not poll itself, says it does")
	}
	// The wake-up registered through the wrapper is the agent's own: an
	// injected fault (which wakes pollers) reaches it, and stop removes it.
	woken := 0
	stop := WithCUDAIPC(WithFileMapping(la), g.Process()).(nixl.Waker).OnProgress(func() { woken++ })
	la.SetFault("nobody", loopback.Fault{Fail: true})
	if woken == 0 {
		t.Fatal("the agent's wake-up did not reach the one registered through the wrappers")
	}
	stop()
	n := woken
	la.SetFault("nobody", loopback.Fault{})
	if woken != n {
		t.Fatal("woken after stop")
	}
}

// selfPolling is an agent that says it polls itself and counts its batches.
type selfPolling struct {
	nixl.Agent
	batches *int
}

func (s selfPolling) PollsItself() bool { return true }

func (s selfPolling) Batch(f func(nixl.Requests)) error {
	*s.batches++
	f(s.Agent)
	return nil
}
