package control

import (
	"sync"

	"github.com/kvxfer/kvxfer/kv"
)

// slotBinding is one generation of one status-table slot: the room the
// client opened in it. Writes to the slot go through it, under its mutex, so
// that once the binding is closed (the client cleared the room, or reused or
// lost the slot) nothing writes for it again: a reused slot never shows a
// stale status. The room actor (Publish) is the writer of every change; the
// consumer writes the reset at open and the answer of one poll after the open
// (offer), which covers an open that ended at a tombstone or a refusal with
// no room actor to publish.
type slotBinding struct {
	mu     sync.Mutex
	r      *region
	slot   uint32
	gen    uint32
	room   uint64
	closed bool

	written bool
	cur     kv.Reply
	code    uint8 // reason code as written
}

// reset writes the slot's new generation, not yet written (readers answer
// Bootstrapping until kvxferd writes a status).
func (b *slotBinding) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.r.writeSlot(b.slot, b.room, packSlotWord(b.gen, kv.StatusBootstrapping, 0, false), 0)
}

// Publish is the room actor's write (StatusSlot).
func (b *slotBinding) Publish(r kv.Reply) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || (b.written && (r == b.cur || progress(r.Status) < progress(b.cur.Status))) {
		return
	}
	if b.written && b.cur.Status.Terminal() {
		return // absorbing
	}
	b.write(r, uint8(r.Reason))
}

// offer writes a polled answer unless the slot already holds as much.
func (b *slotBinding) offer(r kv.Reply) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || (b.written && progress(r.Status) <= progress(b.cur.Status)) {
		return
	}
	b.write(r, uint8(r.Reason))
}

// close ends the binding; lost also fails a room that was not terminal in
// the table (client_lost). It reports whether the room was terminal.
func (b *slotBinding) close(lost bool) (terminal bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	terminal = b.written && b.cur.Status.Terminal()
	if lost && !b.closed && !terminal {
		b.write(kv.Reply{Status: kv.StatusFailed}, ReasonClientLost)
	}
	b.closed = true
	return terminal
}

func (b *slotBinding) write(r kv.Reply, code uint8) {
	b.written, b.cur, b.code = true, r, code
	b.r.writeSlot(b.slot, b.room, packSlotWord(b.gen, r.Status, code, true), int64(r.PrefixLen))
}

// statusSink hands bindings to the room actors that claim them
// (StatusSink): the consumer deposits a room's binding before it
// routes the room's Open, and the room actor claims it once it has handled
// that Open.
type statusSink struct {
	mu      sync.Mutex
	pending map[uint64]*slotBinding
}

func newStatusSink() *statusSink { return &statusSink{pending: map[uint64]*slotBinding{}} }

func (s *statusSink) Claim(roomID uint64) StatusSlot {
	s.mu.Lock()
	b, ok := s.pending[roomID]
	delete(s.pending, roomID)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	return b
}

func (s *statusSink) deposit(b *slotBinding) {
	s.mu.Lock()
	s.pending[b.room] = b
	s.mu.Unlock()
}

// withdraw removes b if it is still unclaimed.
func (s *statusSink) withdraw(b *slotBinding) {
	s.mu.Lock()
	if s.pending[b.room] == b {
		delete(s.pending, b.room)
	}
	s.mu.Unlock()
}

// SinkEngine is an Engine whose room actors can publish to a status table (the
// daemon adapts the actors' engine to it). Without it shm_attach answers
// CodeUnsupported.
type SinkEngine interface {
	// SetStatusSink makes every room opened from now on publish to s; nil
	// removes the sink (rooms that already claimed a slot keep it).
	SetStatusSink(s StatusSink)
}

// StatusSink is where a SinkEngine's room actors claim their status slots.
type StatusSink interface {
	// Claim is called on the room actor's goroutine when the room handles
	// the scheduler's Open: it returns the slot the room publishes to from
	// now on, or nil (no slot was deposited for the room: an open over
	// request/reply).
	Claim(roomID uint64) StatusSlot
}

// StatusSlot receives one room's poll answers, in the order the room made
// them, from the room's one writer. Publish is cheap and does not block on
// anything a room waits for.
type StatusSlot interface {
	Publish(r kv.Reply)
}
