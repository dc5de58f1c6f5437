package daemon

import (
	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/transport/control"
)

// ctlEngine is the actors' engine as the control API drives it. The control
// API declares the interfaces it calls and imports nothing of actors (a
// transport never does); the room ops match as they are, and the status sink
// of the shared-memory table is adapted here.
type ctlEngine struct{ *actors.Engine }

var (
	_ control.Engine       = ctlEngine{}
	_ control.TracedOpener = ctlEngine{}
	_ control.SinkEngine   = ctlEngine{}
	_ control.BatchEngine  = ctlEngine{}
	_ control.BatchEngine  = cpDummyEngine{}
)

// NewRecordBatch gives the shared-memory ring an engine batch: a drain's
// records reach each shard as one mailbox message.
func (e ctlEngine) NewRecordBatch() control.RecordBatch { return e.Engine.NewBatch() }

// SetStatusSink makes every room opened from now on publish to s; nil
// removes the sink.
func (e ctlEngine) SetStatusSink(s control.StatusSink) {
	if s == nil {
		e.Engine.SetStatusSink(nil)
		return
	}
	e.Engine.SetStatusSink(statusSink{s})
}

// statusSink is the control API's sink as the room actors claim from it.
type statusSink struct{ s control.StatusSink }

// Claim returns a nil interface, not a nil slot in a non-nil one, when the
// control API has no slot for the room: the room actor keeps what it had.
func (a statusSink) Claim(roomID uint64) actors.StatusSlot {
	if slot := a.s.Claim(roomID); slot != nil {
		return slot
	}
	return nil
}
