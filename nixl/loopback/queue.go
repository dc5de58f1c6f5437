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

// pop blocks until a job is available or the queue is closed (ok false).
func (q *queue) pop() (job, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.jobs) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return job{}, false
	}
	j := q.jobs[0]
	q.jobs[0] = job{}
	q.jobs = q.jobs[1:]
	return j, true
}

func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.jobs = nil
	q.cond.Broadcast()
	q.mu.Unlock()
}

func (a *Agent) worker() {
	defer a.workers.Done()
	for {
		j, ok := a.q.pop()
		if !ok {
			return
		}
		a.run(j)
	}
}
