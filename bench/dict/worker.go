package dict

import (
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// chunk is a TransferKVChunk.
type chunk struct {
	room  uint64
	id    int
	start int // index_slice start: pages this room sent before this chunk
	pages []int32
	state [][]int32
	last  bool
	aux   int // prefill_aux_index; -1 when init never ran
}

type item struct {
	chunk   *chunk
	barrier chan struct{}
}

// fifo is FastQueue: an unbounded deque with a condition variable.
type fifo struct {
	mu     sync.Mutex
	cond   *sync.Cond
	items  []item
	closed bool
}

func newFifo() *fifo {
	q := &fifo{}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *fifo) push(it item) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		if it.barrier != nil {
			close(it.barrier)
		}
		return
	}
	q.items = append(q.items, it)
	q.mu.Unlock()
	q.cond.Signal()
}

func (q *fifo) pop() (item, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.items) == 0 {
		return item{}, false
	}
	it := q.items[0]
	q.items[0] = item{}
	q.items = q.items[1:]
	return it, true
}

func (q *fifo) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}

func (e *Engine) workerLoop(q *fifo) {
	defer e.wg.Done()
	for {
		it, ok := q.pop()
		if !ok {
			return
		}
		if it.barrier != nil {
			close(it.barrier)
			continue
		}
		e.process(it.chunk)
	}
}

// stepError is an exception raised inside the worker's try block.
type stepError struct {
	reason kv.Reason
	msg    string
}

func (s *stepError) Error() string { return s.msg }

// process is transfer_worker's body for one chunk (rule 8).
func (e *Engine) process(c *chunk) {
	ev := Event{Room: c.room, Chunk: c.id, Last: c.last}
	skipped := true
	defer func() {
		ev.Point, ev.Skip = WorkerDone, skipped
		e.hooks.at(ev)
	}()
	ev.Point = WorkerDequeued
	e.hooks.at(ev)

	if e.fixed {
		// Counted before the status check: a failure that sees no write in
		// flight has then already been seen by this check (drain.go).
		e.beginChunk(c.room)
		st, ok := e.status.get(c.room)
		if !ok || st == kv.StatusFailed {
			if !ok {
				e.dropOrphan(c.room)
			}
			e.endChunk(c.room)
			return
		}
		err := e.transfer(c, ev)
		e.endChunk(c.room)
		if err != nil {
			e.workerFailed(c.room, err)
			return
		}
		skipped = false
		return
	}

	if e.check(c.room) == kv.StatusFailed { // not when cleared: absent reads WaitingForInput
		return
	}
	if err := e.transfer(c, ev); err != nil {
		e.workerFailed(c.room, err)
		return
	}
	skipped = false
}

// transfer runs the try block: assert transfer_infos, update(Transferring),
// post the chunk to every non-dummy agent, wait for every completion, then
// update(Success) and pop on the last chunk, else update(Transferring).
func (e *Engine) transfer(c *chunk, ev Event) error {
	inner, ok := e.infos.get(c.room)
	if !ok {
		return &stepError{kv.ReasonInternalError, fmt.Sprintf("AssertionError: room %d not in transfer_infos", c.room)}
	}
	ev.Point = WorkerBeforeTransferring
	e.hooks.at(ev)
	e.update(c.room, kv.StatusTransferring, byWorker)

	infos := sortedInfos(inner)
	res := make(chan kv.Reason, len(infos))
	posted := 0
	if e.fixed {
		// Build every write first, so a chunk that cannot go to one agent
		// posts nothing to the others.
		ts := make([]kv.Transfer, 0, len(infos))
		for i := range infos {
			if infos[i].Dummy {
				continue
			}
			t, err := e.build(c, &infos[i])
			if err != nil {
				return err
			}
			ts = append(ts, t)
		}
		for _, t := range ts {
			e.cfg.Transfers.Post(t, func(f kv.Reason, _ [][]byte) { res <- f })
			posted++
		}
	} else {
		for i := range infos {
			if infos[i].Dummy {
				continue
			}
			t, err := e.build(c, &infos[i])
			if err != nil {
				return err // writes already posted to other agents stay in flight
			}
			e.cfg.Transfers.Post(t, func(f kv.Reason, _ [][]byte) { res <- f })
			posted++
		}
	}
	ev.Point = WorkerPosted
	e.hooks.at(ev)
	if e.cfg.Waiter != nil && posted > 0 {
		e.cfg.Waiter.Wait(c.room) // upstream's busy-wait on the handles (spec §5.2 step 5)
	}

	fail := kv.ReasonNone
	for i := 0; i < posted; i++ {
		if f := <-res; f != kv.ReasonNone {
			if !e.fixed {
				// Upstream raises at the first "ERR" without waiting for the
				// other handles.
				return &stepError{f, "NIXL transfer failed: " + f.String()}
			}
			if fail == kv.ReasonNone {
				fail = f
			}
		}
	}
	if fail != kv.ReasonNone {
		return &stepError{fail, "NIXL transfer failed: " + fail.String()}
	}
	ev.Point = WorkerBeforeFinish
	e.hooks.at(ev)
	if c.last {
		e.update(c.room, kv.StatusSuccess, byWorker)
		e.infos.pop(c.room)
		e.prefix.pop(c.room)
	} else {
		e.update(c.room, kv.StatusTransferring, byWorker)
	}
	return nil
}

// build makes the write of one chunk to one agent (spec §5.2): the KV pages
// with dst = dst_kv_indices[index_slice] (a shorter dst truncates the source,
// with a warning upstream), and on the last chunk the aux slot and state.
func (e *Engine) build(c *chunk, in *room.TransferInfo) (kv.Transfer, error) {
	if e.cfg.RequireRegistration && !e.peers.has(in.Agent) {
		return kv.Transfer{}, &stepError{kv.ReasonInvalidRequest, fmt.Sprintf("KeyError: %q", in.Agent)}
	}
	src := c.pages
	dst := pySlice(in.DstPages, c.start, c.start+len(c.pages))
	if len(dst) < len(src) {
		src = src[:len(dst)]
	}
	t := kv.Transfer{Room: c.room, Seq: e.seq.Add(1), Agent: in.Agent, Chunk: c.id, Last: c.last, SrcPages: src, DstPages: dst}
	if c.last {
		if c.aux < 0 {
			return kv.Transfer{}, &stepError{kv.ReasonInvalidRequest, "prefill_aux_index is missing"}
		}
		t.SrcAux, t.DstAux = c.aux, in.DstAux
		if len(c.state) > 0 {
			t.SrcState, t.DstState = c.state, in.DstState
		}
	}
	return t, nil
}

// pySlice is Python's s[lo:hi] for 0 <= lo <= hi: clamped, never a panic.
func pySlice(s []int32, lo, hi int) []int32 {
	if lo > len(s) {
		lo = len(s)
	}
	if hi > len(s) {
		hi = len(s)
	}
	return s[lo:hi:hi]
}

// workerFailed is the except block (L1222-1233): exceptions[room] = e,
// record_failure, update(Failed). Nothing goes to decode upstream. For a
// cleared room the update is a no-op but the two records stay (P6).
func (e *Engine) workerFailed(id uint64, err error) {
	why := kv.ReasonTransferError
	if se, ok := err.(*stepError); ok {
		why = se.reason
	}
	if e.fixed {
		e.fail(id, why, err.Error(), err, nil)
		return
	}
	e.exceptions.set(id, err)
	e.record(id, why, err.Error())
	e.update(id, kv.StatusFailed, byWorker)
}
