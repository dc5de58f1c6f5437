package libnixl_test

import (
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
)

// BenchmarkCallHop: one call to the owner goroutine that touches no NIXL
// state (Poll of an unknown request), back to back: the fixed cost of the
// hop onto the owner's OS thread and back, which every Post and Poll pays.
//
//	go test -run '^$' -bench CallHop ./nixl/libnixl/
func BenchmarkCallHop(b *testing.B) {
	a := newAgent(b, "hop")
	ids, out := []nixl.XferID{1 << 40}, make([]nixl.Status, 1)
	b.ReportAllocs()
	for b.Loop() {
		if err := a.Poll(ids, out); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSmallWrite: one 4 KiB WRITE to a second agent in this process,
// posted and waited for as a transfer pool does (Post, Poll, park on
// nixl.Waker, Poll): the per-transfer cost of the binding when the copy
// itself is next to nothing.
//
//	go test -run '^$' -bench SmallWrite ./nixl/libnixl/
func BenchmarkSmallWrite(b *testing.B) {
	a, c := newAgent(b, "small-a"), newAgent(b, "small-b")
	src, dst := alloc(b, a, 4096), alloc(b, c, 4096)
	if _, err := a.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}); err != nil {
		b.Fatal(err)
	}
	if _, err := c.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(dst, 0)}); err != nil {
		b.Fatal(err)
	}
	md, _ := c.LocalMetadata()
	peer, err := a.LoadPeer(md)
	if err != nil {
		b.Fatal(err)
	}
	x, err := a.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}, peer, nixl.DRAM, []nixl.Desc{nixl.DescOf(dst, 0)}, []byte("s"))
	if err != nil {
		b.Fatal(err)
	}
	woke := make(chan struct{}, 1)
	defer a.OnProgress(func() {
		select {
		case woke <- struct{}{}:
		default:
		}
	})()
	ids, out := []nixl.XferID{x}, make([]nixl.Status, 1)
	b.ReportAllocs()
	for b.Loop() {
		st, err := a.Post(x)
		if err != nil {
			b.Fatal(err)
		}
		for st == nixl.InProgress {
			if err := a.Poll(ids, out); err != nil {
				b.Fatal(err)
			}
			if st = out[0].State; st == nixl.InProgress {
				<-woke
			}
		}
		if st != nixl.Done {
			b.Fatalf("state %v: %v", st, out[0].Err)
		}
	}
	b.StopTimer()
	if err := a.Release(x); err != nil {
		b.Fatal(err)
	}
}
