package dict

import (
	"time"

	"github.com/kvxfer/kvxfer/kv"
)

// Scheduler side: the NixlKVSender methods, keyed by room.

// Open is the sender's constructor (rule 3): update(room, Bootstrapping).
// Dummy CP ranks and DP-rank conflicts do not arise: one rank, no CP or DP.
func (e *Engine) Open(id uint64) {
	e.smu.Lock()
	e.senders[id] = &sender{numPages: -1, auxIndex: -1, born: e.clk.Now()}
	e.smu.Unlock()
	if e.fixed {
		e.openFixed(id)
		return
	}
	e.update(id, kv.StatusBootstrapping, bySender)
}

// Init is sender.init(num_kv_indices, aux_index) (rule 7).
func (e *Engine) Init(id uint64, numPages, auxIndex int) {
	e.smu.Lock()
	defer e.smu.Unlock()
	if s := e.senders[id]; s != nil {
		s.numPages, s.auxIndex = numPages, auxIndex
	}
}

// Send is sender.send(pages, state) (rule 7): it slices, decides whether this
// is the last chunk, and enqueues it to queue[room % N]. The scheduler calls it
// only when should_send_kv_chunk holds (pages, or the last chunk), so an empty
// non-last chunk is not a call. The engine keeps the slices.
func (e *Engine) Send(id uint64, pages []int32, state [][]int32) {
	if e.fixed && !e.mayEnqueue(id) {
		return
	}
	e.smu.Lock()
	s := e.senders[id]
	if s == nil || s.failed {
		e.smu.Unlock()
		return
	}
	start := s.curr
	last := s.curr+len(pages) == s.numPages // never true before init, as in Python
	if len(pages) == 0 && !last {
		e.smu.Unlock()
		return
	}
	s.curr += len(pages)
	c := &chunk{room: id, id: s.chunkID, start: start, pages: pages, last: last, aux: s.auxIndex}
	if last {
		c.state = state
	}
	s.chunkID++
	e.smu.Unlock()
	e.queues[id%uint64(len(e.queues))].push(item{chunk: c})
}

// Abort is sender.abort() (rule 12): record, update(Failed). Upstream does not
// tell decode; Fixed does, once the room's writes drained.
func (e *Engine) Abort(id uint64) {
	if e.fixed {
		e.fail(id, kv.ReasonClientAbort, "Aborted by AbortReq.", nil, nil)
		return
	}
	e.record(id, kv.ReasonClientAbort, "Aborted by AbortReq.")
	e.update(id, kv.StatusFailed, bySender)
}

// Clear is what the scheduler does once a room is terminal (spec §2.4): after
// Failed it calls failure_exception, which clears; after Success, clear. Then
// it drops the sender. Upstream clears a live room as it is; Fixed treats that
// as the scheduler giving up (a client abort), as the actor engine does, so
// decode hears of it once the room's writes drained.
func (e *Engine) Clear(id uint64) {
	if e.fixed {
		if st, ok := e.status.get(id); ok && !st.Terminal() {
			e.Abort(id)
		}
	}
	e.smu.Lock()
	s := e.senders[id]
	failed := s != nil && s.failed
	e.smu.Unlock()
	if st, ok := e.status.get(id); failed || (ok && st == kv.StatusFailed) {
		_ = e.FailureException(id)
	} else {
		e.clear(id)
	}
	e.smu.Lock()
	if e.senders[id] == s {
		delete(e.senders, id)
	}
	e.smu.Unlock()
}

// FailureException is sender.failure_exception() (rule 10): pop the exception
// and the failure record, latch the sender failed, clear, and return the error
// upstream would raise.
func (e *Engine) FailureException(id uint64) error {
	var exc error
	var rec failure
	var hasRec bool
	if !e.fixed {
		exc, _ = e.exceptions.pop(id)
		rec, hasRec = e.failures.pop(id)
	} else {
		// Fixed pops after clear's status pop, so a worker that records an
		// error for a room it still saw present cannot leave it behind (see fail).
		rec, hasRec = e.failures.get(id)
		exc, _ = e.exceptions.get(id)
	}
	e.smu.Lock()
	if s := e.senders[id]; s != nil {
		s.failed = true
	}
	e.smu.Unlock()
	e.clear(id)
	switch {
	case exc != nil:
		return exc
	case hasRec:
		return &TransferError{Room: id, Reason: rec.reason, Msg: rec.msg}
	}
	return &TransferError{Room: id, Msg: "NIXL KVSender Exception", FromAnotherRank: true}
}

// clear is sender.clear() (rule 11).
func (e *Engine) clear(id uint64) {
	if e.fixed {
		e.clearFixed(id)
		return
	}
	e.status.pop(id)
	e.prefix.pop(id)
	e.infos.pop(id)
}

// Poll answers each room the way its sender's poll() does (rule 9): Failed if
// the sender latched failure, else check_status. Upstream has no bootstrap
// timeout; Fixed fails a room Bootstrapping past it.
func (e *Engine) Poll(rooms []uint64, out []kv.Reply) []kv.Reply {
	out = out[:0]
	for _, id := range rooms {
		out = append(out, e.poll(id))
	}
	return out
}

func (e *Engine) poll(id uint64) kv.Reply {
	e.smu.Lock()
	s := e.senders[id]
	latched := s != nil && s.failed
	var born time.Time
	if s != nil {
		born = s.born
	}
	e.smu.Unlock()
	if latched {
		return e.reply(id, kv.StatusFailed)
	}
	if e.fixed {
		return e.pollFixed(id, s != nil, born)
	}
	return e.reply(id, e.check(id))
}

func (e *Engine) reply(id uint64, st kv.Status) kv.Reply {
	r := kv.Reply{Status: st}
	if st == kv.StatusFailed {
		if f, ok := e.failures.get(id); ok {
			r.Reason = f.reason
		}
	}
	r.PrefixLen, _ = e.prefix.get(id)
	return r
}

// TransferError is upstream's KVTransferError.
type TransferError struct {
	Room            uint64
	Reason          kv.Reason
	Msg             string
	FromAnotherRank bool
}

func (t *TransferError) Error() string { return "KVTransferError(room=" + utoa(t.Room) + "): " + t.Msg }

func utoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}
