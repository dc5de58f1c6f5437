package loopback

import (
	"container/heap"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// mono is the agent's clock in nanoseconds since New (Options.Clock; the real
// clock's Now carries the monotonic reading, so this is monotonic).
func (a *Agent) mono() int64 { return int64(a.clk.Now().Sub(a.base)) }

// dueEntry is a delayed post waiting for its due time.
type dueEntry struct {
	due   int64
	x     *xfer
	epoch uint64
}

// dueHeap orders delayed posts by due time (a min-heap). Entries of posts that
// ended or were posted again are dropped when they reach the top.
type dueHeap []dueEntry

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(v any)        { *h = append(*h, v.(dueEntry)) }
func (h *dueHeap) Pop() any {
	old := *h
	n := len(old) - 1
	e := old[n]
	old[n] = dueEntry{}
	*h = old[:n]
	return e
}

func (h *dueHeap) push(e dueEntry) { heap.Push(h, e) }

var (
	_ nixl.Waker = (*Agent)(nil)
	_ nixl.Dueer = (*Agent)(nil)
)

// OnProgress implements nixl.Waker. wake is called, outside every lock of the
// agent, after a worker finished a request (copied, failed, or landed a
// delayed post), a request was failed by a fault or a dropped peer, or the
// agent closed. A delayed post that becomes due is reported by Due, not by
// wake: nothing fires at a due time.
func (a *Agent) OnProgress(wake func()) (stop func()) { return a.wakers.OnProgress(wake) }

// wake calls every registered waker (nixl.Wakers: under its lock, so none is
// called after its stop returned; they must not call back into the agent).
func (a *Agent) wake() { a.wakers.Wake() }

// Due implements nixl.Dueer: the earliest due time (monotonic clock) of the
// requests posted with injected latency and still in flight; such a request
// completes in the first Poll at or after it.
func (a *Agent) Due() (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(a.dues) > 0 {
		e := a.dues[0]
		if e.x.epoch == e.epoch && e.x.state == nixl.InProgress {
			return a.base.Add(time.Duration(e.due)), true
		}
		heap.Pop(&a.dues)
	}
	return time.Time{}, false
}
