package control

import (
	"sync"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
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
	cur     room.Reply
	code    uint8 // reason code as written
}

// reset writes the slot's new generation, not yet written (readers answer
// Bootstrapping until kvxferd writes a status).
func (b *slotBinding) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.r.writeSlot(b.slot, b.room, packSlotWord(b.gen, room.Bootstrapping, 0, false), 0)
}

// Publish is the room actor's write (actors.StatusSlot).
func (b *slotBinding) Publish(r room.Reply) {
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
func (b *slotBinding) offer(r room.Reply) {
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
		b.write(room.Reply{Status: room.Failed}, ReasonClientLost)
	}
	b.closed = true
	return terminal
}

func (b *slotBinding) write(r room.Reply, code uint8) {
	b.written, b.cur, b.code = true, r, code
	b.r.writeSlot(b.slot, b.room, packSlotWord(b.gen, r.Status, code, true), int64(r.PrefixLen))
}

// statusSink hands bindings to the room actors that claim them
// (actors.StatusSink): the consumer deposits a room's binding before it
// routes the room's Open, and the room actor claims it once it has handled
// that Open.
type statusSink struct {
	mu      sync.Mutex
	pending map[uint64]*slotBinding
}

func newStatusSink() *statusSink { return &statusSink{pending: map[uint64]*slotBinding{}} }

func (s *statusSink) Claim(roomID uint64) actors.StatusSlot {
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

// SinkEngine is an Engine whose room actors can publish to a status table
// (*actors.Engine). Without it shm_attach answers CodeUnsupported.
type SinkEngine interface {
	SetStatusSink(s actors.StatusSink)
}
