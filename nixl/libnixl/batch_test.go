package libnixl_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// inTime runs f and fails the test if it has not returned within limit: a
// batch's call that hopped onto the owner goroutine (which runs the batch)
// would wait for itself forever. It exits the test binary rather than
// t.Fatal or panic: both run the test's cleanup, whose Close would wait for
// that owner too.
func inTime(t *testing.T, limit time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(limit):
		fmt.Fprintf(os.Stderr, "--- FAIL: %s: %s did not return within %v (a call inside the batch hopped?)\n", t.Name(), what, limit)
		os.Exit(1)
	}
}

// TestBatchWritesAndReleases: a WRITE created and posted in one batch lands
// the bytes, and a second batch polls it to Done and releases it (the
// request is gone afterwards); the calls run in place, so the batches return.
func TestBatchWritesAndReleases(t *testing.T) {
	p := newPair(t, "batch", 64<<10)
	a, src, dst := p.a, p.src, p.dst
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	var x nixl.XferID
	var st nixl.State
	var berr, perr error
	inTime(t, 10*time.Second, "create and post", func() {
		berr = a.Batch(func(r nixl.Requests) {
			if x, perr = r.Create(nixl.Write, nixl.DRAM, whole(src), p.peer, nixl.DRAM, whole(dst), []byte("b")); perr != nil {
				return
			}
			st, perr = r.Post(x)
		})
	})
	if berr != nil || perr != nil {
		t.Fatalf("batch: %v, calls: %v", berr, perr)
	}
	out := make([]nixl.Status, 1)
	deadline := time.Now().Add(10 * time.Second)
	for st == nixl.InProgress {
		inTime(t, 10*time.Second, "poll and release", func() {
			berr = a.Batch(func(r nixl.Requests) {
				if perr = r.Poll([]nixl.XferID{x}, out); perr == nil && out[0].State == nixl.Done {
					perr = r.Release(x)
				}
			})
		})
		if berr != nil || perr != nil {
			t.Fatalf("batch: %v, calls: %v", berr, perr)
		}
		if st = out[0].State; st == nixl.InProgress {
			if time.Now().After(deadline) {
				t.Fatal("the write is still in flight after 10 s")
			}
			select {
			case <-p.woke:
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	if st != nixl.Done {
		t.Fatalf("state %v: %v", st, out[0].Err)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("decode memory does not hold the bytes written")
	}
	// Released (or, if Post completed it, still there to release): once
	// released, the request is unknown.
	if err := a.Release(x); err != nil && !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("Release after the batch: %v", err)
	}
	if err := a.Poll([]nixl.XferID{x}, out); err != nil || out[0].State != nixl.Failed || !errors.Is(out[0].Err, nixl.ErrInvalid) {
		t.Fatalf("a released request polls %+v (%v), want Failed/ErrInvalid", out[0], err)
	}
}

// TestBatchRequestsEndWithIt: the Requests a batch handed out refuse calls
// once it returned.
func TestBatchRequestsEndWithIt(t *testing.T) {
	a := newAgent(t, "batch-end")
	var kept nixl.Requests
	if err := a.Batch(func(r nixl.Requests) { kept = r }); err != nil {
		t.Fatal(err)
	}
	out := make([]nixl.Status, 1)
	if err := kept.Poll([]nixl.XferID{1}, out); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("Poll on a batch's requests after it ended: %v, want ErrInvalid", err)
	}
	if _, err := kept.Post(1); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("Post on a batch's requests after it ended: %v, want ErrInvalid", err)
	}
}

// TestBatchPanicReachesTheCaller: a panic inside a batch is raised in the
// caller, and the agent goes on serving calls.
func TestBatchPanicReachesTheCaller(t *testing.T) {
	a := newAgent(t, "batch-panic")
	got := func() (p any) {
		defer func() { p = recover() }()
		_ = a.Batch(func(nixl.Requests) { panic("boom") })
		return nil
	}()
	if got != "boom" {
		t.Fatalf("recovered %v, want boom", got)
	}
	out := make([]nixl.Status, 1)
	inTime(t, 10*time.Second, "a call after the panic", func() {
		if err := a.Poll([]nixl.XferID{1 << 40}, out); err != nil {
			t.Errorf("Poll after the panic: %v", err)
		}
	})
	if out[0].State != nixl.Failed || !errors.Is(out[0].Err, nixl.ErrInvalid) {
		t.Fatalf("unknown request polls %+v, want Failed/ErrInvalid", out[0])
	}
}

// TestBatchAfterClose: a closed agent runs no batch.
func TestBatchAfterClose(t *testing.T) {
	a := newAgent(t, "batch-closed")
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := a.Batch(func(nixl.Requests) { ran = true }); !errors.Is(err, nixl.ErrClosed) || ran {
		t.Fatalf("Batch after Close: %v (ran %v), want ErrClosed without running", err, ran)
	}
}
