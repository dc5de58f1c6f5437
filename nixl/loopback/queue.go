package loopback

import (
	"sync"

	"github.com/kvxfer/kvxfer/nixl"
)

// job is one posted request waiting for a worker.
type job struct {
	id    nixl.XferID
	x     *xfer
	epoch uint64
}

// queue is an unbounded FIFO: pushing never blocks, so Post and timer callbacks
// can push while holding locks without risking a deadlock with the workers.
type queue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	jobs   []job
	closed bool
}

func (q *queue) init() { q.cond = sync.NewCond(&q.mu) }

func (q *queue) push(j job) {
	q.mu.Lock()
	if !q.closed {
		q.jobs = append(q.jobs, j)
		q.cond.Signal()
	}
	q.mu.Unlock()
}

// popBatch blocks until a job is available or the queue is closed (ok
// false), then moves up to max queued jobs, in order, to dst.
func (q *queue) popBatch(dst []job, max int) ([]job, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.jobs) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return dst, false
	}
	n := min(len(q.jobs), max)
	dst = append(dst, q.jobs[:n]...)
	clear(q.jobs[:n])
	q.jobs = q.jobs[n:]
	return dst, true
}

func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.jobs = nil
	q.cond.Broadcast()
	q.mu.Unlock()
}

// workerBatch is the most jobs a worker takes at once: the jobs queued while
// it was busy are copied, notified (one datagram per peer) and completed
// (one lock, one wake-up) together.
const workerBatch = 16

func (a *Agent) worker() {
	defer a.workers.Done()
	var b batch
	for {
		var ok bool
		if b.jobs, ok = a.q.popBatch(b.jobs[:0], workerBatch); !ok {
			return
		}
		a.run(&b)
	}
}
