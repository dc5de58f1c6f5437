package libnixl_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// TestOwnerWakesPollers: a request that ends while nobody polls it is seen by
// the owner goroutine's own progress, which calls the OnProgress wakers; a
// poller parked on the wake-up then finds it terminal. After stop, no call.
func TestOwnerWakesPollers(t *testing.T) {
	a, b := newAgent(t, "wake-a"), newAgent(t, "wake-b")
	src, dst := alloc(t, a, 4<<20), alloc(t, b, 4<<20)
	pattern(src, 9)
	for _, r := range []struct {
		ag  nixl.Agent
		mem []byte
	}{{a, src}, {b, dst}} {
		if _, err := r.ag.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(r.mem, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	md, _ := b.LocalMetadata()
	peer, err := a.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	woke := make(chan struct{}, 1)
	stop := a.OnProgress(func() {
		select {
		case woke <- struct{}{}:
		default:
		}
	})
	x, err := a.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}, peer, nixl.DRAM, []nixl.Desc{nixl.DescOf(dst, 0)}, []byte("wake"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.Post(x)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]nixl.Status, 1)
	t.Logf("post: %v", st)
	for st == nixl.InProgress {
		// Park: only the owner's progress can end it now. The bound turns a
		// lost wake-up into a failure; the test does not depend on timing.
		select {
		case <-woke:
		case <-time.After(30 * time.Second):
			t.Fatal("no OnProgress wake-up while the request was in flight")
		}
		if err := a.Poll([]nixl.XferID{x}, out); err != nil {
			t.Fatal(err)
		}
		st = out[0].State
	}
	if st != nixl.Done || !bytes.Equal(src, dst) {
		t.Fatalf("state %v (%v), bytes equal %v", st, out[0].Err, bytes.Equal(src, dst))
	}
	stop()
	select { // drain a wake-up from before stop
	case <-woke:
	default:
	}
	if err := a.Release(x); err != nil {
		t.Fatal(err)
	}
	y := mustCreate(t, a, src, dst, peer)
	if _, err := a.Post(y); err != nil {
		t.Fatal(err)
	}
	waitAll(t, a, y)
	select {
	case <-woke:
		t.Fatal("a waker was called after its stop")
	default:
	}
}

func mustCreate(t *testing.T, a nixl.Agent, src, dst []byte, peer string) nixl.XferID {
	t.Helper()
	x, err := a.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}, peer, nixl.DRAM, []nixl.Desc{nixl.DescOf(dst, 0)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return x
}
