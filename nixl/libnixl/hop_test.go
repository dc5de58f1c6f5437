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
	p := newPair(b, "small", 4096)
	a := p.a
	x, err := a.Create(nixl.Write, nixl.DRAM, whole(p.src), p.peer, nixl.DRAM, whole(p.dst), []byte("s"))
	if err != nil {
		b.Fatal(err)
	}
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
				<-p.woke
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
