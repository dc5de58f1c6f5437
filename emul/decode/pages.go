package decode

import (
	"context"
	"sync"
)

// freeList hands out decode KV pages, aux slots or state slots, like decode's
// token-to-KV pool allocator and metadata-buffer allocator. A room that cannot
// get what it needs waits for a release: pages are the resource a pinned room
// leaks, so running out must slow the workload, not fail it.
//
// put makes entries the next to be handed out (last in, first out): a page
// freed on kvxfer's word that nothing is in flight is reused at once, so a
// write that still lands shows up in the next room. putBack queues entries
// behind every free one, as SGLang's FIFO allocator does: for pages freed
// with writes possibly in flight (0.5.18 and 0.5.20 free at once after an
// ABORT; a release timeout), where a late write is the protocol's hazard and
// not kvxfer's.
type freeList struct {
	mu    sync.Mutex
	free  []int32
	total int
	freed chan struct{} // closed (and replaced) on every release
}

func newFreeList(n int) *freeList {
	f := &freeList{total: n, freed: make(chan struct{})}
	for i := n - 1; i >= 0; i-- {
		f.free = append(f.free, int32(i))
	}
	return f
}

// take returns n entries, waiting for releases while fewer are free. n larger
// than the whole list can never be served: ok is false at once.
func (f *freeList) take(ctx context.Context, n int) ([]int32, bool) {
	if n > f.total {
		return nil, false
	}
	for {
		f.mu.Lock()
		if len(f.free) >= n {
			out := append([]int32(nil), f.free[len(f.free)-n:]...)
			f.free = f.free[:len(f.free)-n]
			f.mu.Unlock()
			return out, true
		}
		ch := f.freed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false
		}
	}
}

func (f *freeList) put(xs []int32) {
	if len(xs) == 0 {
		return
	}
	f.mu.Lock()
	f.free = append(f.free, xs...)
	close(f.freed)
	f.freed = make(chan struct{})
	f.mu.Unlock()
}

func (f *freeList) putBack(xs []int32) {
	if len(xs) == 0 {
		return
	}
	f.mu.Lock()
	f.free = append(append(make([]int32, 0, len(f.free)+len(xs)), xs...), f.free...)
	close(f.freed)
	f.freed = make(chan struct{})
	f.mu.Unlock()
}

// held is the number of entries taken and not yet put back.
func (f *freeList) held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total - len(f.free)
}
