package clock

import (
	"container/heap"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the time source of the engine.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine (Real) or in the goroutine that
	// advances the clock (Fake) once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop prevents the call if it has not happened; it reports whether it did.
	Stop() bool
}

// Real is the wall clock.
type Real struct{}

func (Real) Now() time.Time                            { return time.Now() }
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Fake is a clock that moves only when Advance is called. It is safe for
// concurrent use. Now is a load, not a lock: the engine reads the clock once
// per message on every shard and room goroutine, and a benchmark on a fake
// clock (to run deadlines forward without waiting) must not make them queue
// on a lock that the real clock does not have.
type Fake struct {
	mu     sync.Mutex // Advance, and the timers
	cur    atomic.Pointer[time.Time]
	seq    uint64
	timers timerHeap
}

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake {
	f := &Fake{}
	f.set(start)
	return f
}

// set moves the clock to t (under mu, or before the clock is shared).
func (f *Fake) set(t time.Time) { f.cur.Store(&t) }

func (f *Fake) Now() time.Time { return *f.cur.Load() }

func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	t := &fakeTimer{clock: f, at: f.Now().Add(d), seq: f.seq, fn: fn, index: -1}
	heap.Push(&f.timers, t)
	return t
}

// Advance moves the clock forward by d and runs every timer that came due, in
// due order, in the caller's goroutine.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	target := f.Now().Add(d)
	for len(f.timers) > 0 && !f.timers[0].at.After(target) {
		t := heap.Pop(&f.timers).(*fakeTimer)
		if t.at.After(f.Now()) {
			f.set(t.at)
		}
		f.mu.Unlock()
		t.fn()
		f.mu.Lock()
	}
	f.set(target)
	f.mu.Unlock()
}

// Pending returns the number of armed timers.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

type fakeTimer struct {
	clock *Fake
	at    time.Time
	seq   uint64
	fn    func()
	index int
}

func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.clock.timers, t.index)
	return true
}

type timerHeap []*fakeTimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].at.Equal(h[j].at) {
		return h[i].seq < h[j].seq
	}
	return h[i].at.Before(h[j].at)
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*fakeTimer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.index = -1
	*h = old[:len(old)-1]
	return t
}
