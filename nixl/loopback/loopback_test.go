package loopback_test

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/nixltest"
)

var agentSeq atomic.Int64

func newAgent(t testing.TB) *loopback.Agent {
	t.Helper()
	a, err := loopback.New(fmt.Sprintf("agent-%d", agentSeq.Add(1)), loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return a
}

func pair(t *testing.T) nixltest.Pair {
	return nixltest.Pair{
		A: newAgent(t), B: newAgent(t),
		Alloc: func(t testing.TB, ag nixl.Agent, n int) []byte {
			b, err := ag.(*loopback.Agent).Alloc(n)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Inject: func(ag nixl.Agent, peer string, f nixltest.Fault) {
			lf := loopback.Fault{Fail: f.Fail, Hang: f.Hang, Disconnect: f.Disconnect}
			if f.Latency > 0 {
				lf.Latency = loopback.Fixed(f.Latency)
			}
			ag.(*loopback.Agent).SetFault(peer, lf)
		},
	}
}

func TestConformance(t *testing.T) { nixltest.Run(t, pair) }

// TestNoLeak runs transfers in every fault mode, closes, and checks that every
// goroutine, mapping file and socket is gone.
func TestNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	var dirs []string
	t.Run("work", func(t *testing.T) {
		p := pair(t)
		dirs = append(dirs, p.A.(*loopback.Agent).Dir(), p.B.(*loopback.Agent).Dir())
		a, b := p.A.(*loopback.Agent), p.B.(*loopback.Agent)
		src, _, err := a.AllocRegistered(nixl.DRAM, 0, 8192)
		if err != nil {
			t.Fatal(err)
		}
		dst, _, err := b.AllocRegistered(nixl.VRAM, 1, 8192)
		if err != nil {
			t.Fatal(err)
		}
		md, _ := b.LocalMetadata()
		peer, err := a.LoadPeer(md)
		if err != nil {
			t.Fatal(err)
		}
		a.SetFault(peer, loopback.Fault{Latency: loopback.Uniform(time.Hour, 2*time.Hour)})
		x1, err := a.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src[:4096], 0)}, peer, nixl.VRAM, []nixl.Desc{nixl.DescOf(dst[:4096], 1)}, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Post(x1); err != nil {
			t.Fatal(err)
		}
		a.SetFault(peer, loopback.Fault{Hang: true})
		x2, _ := a.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src[4096:], 0)}, peer, nixl.VRAM, []nixl.Desc{nixl.DescOf(dst[4096:], 1)}, nil)
		if _, err := a.Post(x2); err != nil {
			t.Fatal(err)
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("agent directory %s still exists: %v", d, err)
		}
	}
}

func TestRegisterRules(t *testing.T) {
	a := newAgent(t)
	heap := make([]byte, 4096)
	if _, err := a.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(heap, 0)}); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("registering Go heap: %v", err)
	}
	b, err := a.Alloc(10000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(b, 2)}); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("DRAM with a device id: %v", err)
	}
	full := b[:cap(b)]
	if _, err := a.Register(nixl.DRAM, []nixl.Desc{{Addr: nixl.DescOf(full, 0).Addr, Len: 1 << 20}}); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("region larger than the allocation: %v", err)
	}
	id, err := a.Register(nixl.VRAM, []nixl.Desc{nixl.DescOf(b[:4096], 0), nixl.DescOf(b[4096:], 0)})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(b); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("Free with registrations: %v", err)
	}
	if err := a.Deregister(id); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(b); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("double Free: %v", err)
	}
}

// TestPeerGone: when the peer agent closes, the copy still lands in the mapping
// this process holds, but the notification cannot be delivered: the request
// fails with ErrRemoteDisconnect and later posts fail fast.
func TestPeerGone(t *testing.T) {
	a := newAgent(t)
	b, err := loopback.New("gone", loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	src, _, _ := a.AllocRegistered(nixl.DRAM, 0, 4096)
	dst, _, _ := b.AllocRegistered(nixl.DRAM, 0, 4096)
	md, _ := b.LocalMetadata()
	peer, err := a.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	x, err := a.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}, peer, nixl.DRAM, []nixl.Desc{nixl.DescOf(dst, 0)}, []byte("n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Post(x); err != nil {
		t.Fatal(err)
	}
	st := make([]nixl.Status, 1)
	deadline := time.Now().Add(20 * time.Second)
	for {
		a.Poll([]nixl.XferID{x}, st)
		if st[0].State != nixl.InProgress {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("request never settled")
		}
		runtime.Gosched()
	}
	if st[0].State != nixl.Failed || !errors.Is(st[0].Err, nixl.ErrRemoteDisconnect) {
		t.Fatalf("request to a closed peer: %v %v", st[0].State, st[0].Err)
	}
	if _, err := a.Post(x); !errors.Is(err, nixl.ErrRemoteDisconnect) {
		t.Fatalf("post after peer loss: %v", err)
	}
	if _, err := a.LoadPeer(md); err != nil { // already loaded: no-op
		t.Fatal(err)
	}
	if err := a.DropPeer(peer); err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadPeer(md); !errors.Is(err, nixl.ErrRemoteDisconnect) {
		t.Fatalf("loading a closed peer's metadata: %v", err)
	}
}

// TestDropPeerInFlight: dropping a peer settles its in-flight requests as ErrPeerUnknown.
func TestDropPeerInFlight(t *testing.T) {
	a, b := newAgent(t), newAgent(t)
	src, _, _ := a.AllocRegistered(nixl.DRAM, 0, 4096)
	dst, _, _ := b.AllocRegistered(nixl.DRAM, 0, 4096)
	md, _ := b.LocalMetadata()
	peer, _ := a.LoadPeer(md)
	a.SetFault(peer, loopback.Fault{Hang: true})
	x, _ := a.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}, peer, nixl.DRAM, []nixl.Desc{nixl.DescOf(dst, 0)}, nil)
	a.Post(x)
	if err := a.DropPeer(peer); err != nil {
		t.Fatal(err)
	}
	st := make([]nixl.Status, 1)
	a.Poll([]nixl.XferID{x}, st)
	if st[0].State != nixl.Failed || !errors.Is(st[0].Err, nixl.ErrPeerUnknown) {
		t.Fatalf("in-flight request after DropPeer: %v %v", st[0].State, st[0].Err)
	}
	if err := a.Release(x); err != nil {
		t.Fatal(err)
	}
}

func TestUniform(t *testing.T) {
	f := loopback.Uniform(time.Millisecond, 2*time.Millisecond)
	for range 100 {
		if d := f(); d < time.Millisecond || d > 2*time.Millisecond {
			t.Fatalf("Uniform gave %v", d)
		}
	}
	if d := loopback.Uniform(3, 1)(); d != 3 {
		t.Fatalf("Uniform(3,1) = %v", d)
	}
}
