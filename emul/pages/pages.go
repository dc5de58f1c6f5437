// Package pages is the emulators' page model: a pool of KV page, aux slot or
// state slot indices, as SGLang's token-to-KV pool allocator and
// metadata-buffer allocator hand them out. The decode emulator (emul/decode)
// takes a room's destination pages from it and frees them only on kvxfer's
// word (or the protocol's timeout); the scheduler emulator (emul/sched) takes
// the prefill pages it fills and sends. The demo runs both.
package pages

import (
	"context"
	"sync"
)

// Pool hands out indices. A room that cannot get what it needs waits in Take
// for a release: pages are the resource a pinned room leaks, so running out
// must slow the workload, not fail it.
//
// Put makes entries the next to be handed out (last in, first out): a page
// freed on kvxfer's word that nothing is in flight is reused at once, so a
// write that still lands shows up in the next room. PutBack queues entries
// behind every free one, as SGLang's FIFO allocator does: for pages freed
// with writes possibly in flight (0.5.18 and 0.5.20 free at once after an
// ABORT; a release timeout), where a late write is the protocol's hazard and
// not kvxfer's. A Pool is safe for concurrent use.
type Pool struct {
	mu    sync.Mutex
	free  []int32
	total int
	freed chan struct{} // closed (and replaced) on every release
}

// New is a pool of the indices 0..n-1, handed out lowest first.
func New(n int) *Pool {
	p := &Pool{total: n, freed: make(chan struct{})}
	for i := n - 1; i >= 0; i-- {
		p.free = append(p.free, int32(i))
	}
	return p
}

// TryTake returns n entries if that many are free, without waiting.
func (p *Pool) TryTake(n int) ([]int32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.takeLocked(n)
}

func (p *Pool) takeLocked(n int) ([]int32, bool) {
	if n < 0 || len(p.free) < n {
		return nil, false
	}
	out := append([]int32(nil), p.free[len(p.free)-n:]...)
	p.free = p.free[:len(p.free)-n]
	return out, true
}

// Take returns n entries, waiting for releases while fewer are free. n larger
// than the whole pool can never be served: ok is false at once, as it is when
// ctx ends first.
func (p *Pool) Take(ctx context.Context, n int) ([]int32, bool) {
	if n > p.total {
		return nil, false
	}
	for {
		p.mu.Lock()
		if out, ok := p.takeLocked(n); ok {
			p.mu.Unlock()
			return out, true
		}
		ch := p.freed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false
		}
	}
}

// Put frees xs to be handed out next (LIFO).
func (p *Pool) Put(xs []int32) {
	if len(xs) == 0 {
		return
	}
	p.mu.Lock()
	p.free = append(p.free, xs...)
	p.releasedLocked()
	p.mu.Unlock()
}

// PutBack frees xs behind every free entry (FIFO).
func (p *Pool) PutBack(xs []int32) {
	if len(xs) == 0 {
		return
	}
	p.mu.Lock()
	p.free = append(append(make([]int32, 0, len(p.free)+len(xs)), xs...), p.free...)
	p.releasedLocked()
	p.mu.Unlock()
}

func (p *Pool) releasedLocked() {
	close(p.freed)
	p.freed = make(chan struct{})
}

// Held is the number of entries taken and not yet put back.
func (p *Pool) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total - len(p.free)
}
