package libnixl_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
)

// TestOwnerSpinsOnlyWithACoreFree: while a request is in flight the owner
// goroutine polls it on its own, back to back, only while a processor is
// free (cores.Free); with none free it waits for its PollInterval (an hour
// here) and serves calls meanwhile. The request is held in flight by a target
// without a progress thread that is not called: it completes once the target
// progresses.
func TestOwnerSpinsOnlyWithACoreFree(t *testing.T) {
	var free atomic.Bool
	t.Cleanup(libnixl.SetCoreFree(free.Load)) // registered first: restored after the agents closed
	a := newAgentOpts(t, "spin-a", libnixl.Options{PollInterval: time.Hour})
	c := newAgentOpts(t, "spin-c", libnixl.Options{NoProgressThread: true})
	src, dst := alloc(t, a, 4096), alloc(t, c, 4096)
	if _, err := a.Register(nixl.DRAM, whole(src)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Register(nixl.DRAM, whole(dst)); err != nil {
		t.Fatal(err)
	}
	md, _ := c.LocalMetadata()
	peer, err := a.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	x, err := a.Create(nixl.Write, nixl.DRAM, whole(src), peer, nixl.DRAM, whole(dst), []byte("spin"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := a.Post(x); err != nil || st != nixl.InProgress {
		t.Skipf("the write did not stay in flight (%v, %v): nothing to poll", st, err)
	}
	before := a.OwnerPolls()
	out := make([]nixl.Status, 1)
	for range 50 { // calls are served; the owner does not poll on its own
		if err := a.Poll([]nixl.XferID{1 << 40}, out); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.OwnerPolls(); n != before {
		t.Fatalf("with no core free the owner polled %d times on its own", n-before)
	}
	free.Store(true)
	testrig.Eventually(t, 10*time.Second, "the owner polling with a core free", func() bool {
		return a.OwnerPolls() > before
	})
	// The target progresses: the write completes.
	testrig.Eventually(t, 10*time.Second, "the write done", func() bool {
		_, _ = c.Notifs(nil)
		if err := a.Poll([]nixl.XferID{x}, out); err != nil {
			t.Fatal(err)
		}
		return out[0].State == nixl.Done
	})
	if err := a.Release(x); err != nil {
		t.Fatal(err)
	}
}
