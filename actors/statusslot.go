package actors

import (
	"sync/atomic"

	"github.com/kvxfer/kvxfer/kv"
)

// StatusSink is where room actors publish what a poll of their room answers,
// for the shared-memory status table of transport/control. The
// room actor is the writer of its room's slot: after every step it hands its
// poll answer to the slot it claimed.
type StatusSink interface {
	// Claim is called on the room actor's goroutine when the room handles
	// the scheduler's Open: it returns the slot the room publishes to from
	// now on, or nil (an open over request/reply: the room keeps what it had).
	Claim(roomID uint64) StatusSlot
}

// StatusSlot receives one room's poll answers, in the order the room made
// them, from the room actor's goroutine. Publish must be cheap and must not
// block on anything a room waits for.
type StatusSlot interface {
	Publish(r kv.Reply)
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

// statusSlot is a room actor's part: the slot its room publishes to (nil:
// none).
type statusSlot struct{ s StatusSlot }

// publish is called by the room actor with each step's poll answer r
// (roomActor.out). The room claims a slot when it handles the scheduler's
// Open (open; a room revived by an Open starts with that step), and only
// then: a slot deposited for a later open of the same room id can never
// receive what the room answered before that open (a stale status).
func (p *statusSlot) publish(e *Engine, id uint64, open bool, r kv.Reply) {
	if open {
		if sink := sinkOf(e); sink != nil {
			if s := sink.Claim(id); s != nil {
				p.s = s
			}
		}
	}
	if p.s != nil {
		p.s.Publish(r)
	}
}
