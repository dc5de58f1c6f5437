package actors

import (
	"sync/atomic"

	"github.com/kvxfer/kvxfer/actors/room"
)

// StatusSink is where room actors publish what a poll of their room answers,
// for the shared-memory status table of transport/control (issue 12). The
// room actor is the writer of its room's slot: after every message it handles
// it hands its poll answer to the slot it claimed.
type StatusSink interface {
	// Claim is called on the room actor's goroutine, once, when the room has
	// been opened by the scheduler: it returns the slot this incarnation of
	// the room publishes to, or nil (a room opened over request/reply).
	Claim(roomID uint64) StatusSlot
}

// StatusSlot receives one room's poll answers, in the order the room made
// them, from the room actor's goroutine. Publish must be cheap and must not
// block on anything a room waits for.
type StatusSlot interface {
	Publish(r room.Reply)
}

// sinks maps engines to their sink, copied on write (an engine sets its sink
// once or twice in its life; every room actor reads it): no lock.
var sinks atomic.Pointer[map[*Engine]StatusSink]

// SetStatusSink makes every room opened from now on publish to s; nil
// removes the sink (rooms that already claimed a slot keep it).
func (e *Engine) SetStatusSink(s StatusSink) {
	for {
		old := sinks.Load()
		next := map[*Engine]StatusSink{}
		if old != nil {
			for k, v := range *old {
				next[k] = v
			}
		}
		if s == nil {
			delete(next, e)
		} else {
			next[e] = s
		}
		if sinks.CompareAndSwap(old, &next) {
			return
		}
	}
}

func sinkOf(e *Engine) StatusSink {
	if m := sinks.Load(); m != nil {
		return (*m)[e]
	}
	return nil
}

// statusSlot is a room actor's part: the slot it claimed (none until the
// room is opened and a sink is set; noSlot once a claim found none).
type statusSlot struct{ s StatusSlot }

type noSlotT struct{}

func (noSlotT) Publish(room.Reply) {}

var noSlot StatusSlot = noSlotT{}

// publish is called by the room actor after each message it handles.
func (p *statusSlot) publish(e *Engine, m *room.Machine) {
	if p.s == nil {
		if !m.Tombstone().Opened {
			return
		}
		sink := sinkOf(e)
		if sink == nil {
			return
		}
		if p.s = sink.Claim(m.Room()); p.s == nil {
			p.s = noSlot
		}
	}
	p.s.Publish(m.Reply())
}
