package actors

import (
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// Observer sees what rooms do, for metrics and tracing. Each room keeps its
// own record (a RoomObserver, from RoomCreated) and calls only it, from one
// goroutine at a time, so a record needs no lock; the rest of the methods
// concern no live room and must be safe for concurrent use. A method that
// panics fails at most the room it was called for (internal_error;
// docs/engine.md, Panics).
//
// A room's story, in order: RoomCreated (first message naming it, from any
// side, or an Open reviving its tombstone: a new record each time), then on
// its record Traceparent (an Open that carried one, see Engine.OpenTraced)
// and Step for every step the live room takes, with the step's effects: the
// transfer infos and completions it received, the transfers it posted, its
// status changes, the messages it absorbed, and its retirement last (the
// record is handed over and the room never touches it again). A write that
// completes after the drain deadline let the room retire is
// LateTransferDone (called on the goroutine that reports the completion; a
// panic there is logged).
type Observer interface {
	// RoomCreated: at is when, on the engine's clock (the reading the
	// engine takes for the room's birth).
	RoomCreated(roomID uint64, at time.Time) RoomObserver
	// Ignored: a message absorbed by a tombstone, or for a room nobody named.
	Ignored(roomID uint64, msg room.Msg)
	// LateTransferDone: a write of a room that retired completed.
	LateTransferDone(roomID uint64, seq uint32, fail kv.Reason)
	TombstoneEvicted(roomID uint64)
}

// RoomObserver is one room's record. The room's actor calls it (its shard
// before the actor runs, or after it died), never two goroutines at once,
// and never after Retired.
type RoomObserver interface {
	Traceparent(traceparent string)
	// Step sees one step of the live room (msg: the message stepped, nil
	// for a step of the actor's own), before any of its effects is
	// executed; fx (its slices) is valid during the call only. What the record reads of
	// it, in this order: Info (a decode transfer info that reached the
	// live room; one refused by the room cap, or absorbed by a tombstone,
	// is not seen), Done (a completion), Posts, Published with Status and
	// Reason, Ignored (msg absorbed by the live room; not with Retire), and
	// Retire with Tomb, which hands the record over. A record that panics
	// fails the room unless the step concluded it (its effects still run).
	Step(msg room.Msg, fx room.Effects)
	// Abandoned hands the record of a room still live over: the engine
	// stops (its rooms' actors stop), or Engine.AbandonRecords was called
	// (an observer closing). The room goes on unobserved.
	Abandoned()
	// BindSteps hands the record the room's actor's StepClock, once, as
	// the actor handles its first message (before any callback of that
	// step), so that the callbacks of one step may share one reading of
	// the clock: the reading the actor takes for the deadlines it arms in
	// the same step. Callbacks outside a step (the shard's: creation, a
	// dead actor's retirement) find the clock outside a step. A record
	// that keeps no time ignores it.
	BindSteps(c *StepClock)
}

// StepClock is the engine's clock (Config.Clock) as a room's actor reads
// it. Within one message the actor handles (a step), the first Now reads the
// clock and the rest of the step gets that reading; outside a step every Now
// reads the clock. It belongs to one room's actor: only the goroutine
// running that actor (or its shard, once the actor died) may use it.
//
// It is a struct, not an interface, so that a record calls it directly:
// an interface with a call per callback, and two calls per step to begin
// and end it (found by a type assertion each step), cost about 280
// instructions per room.
type StepClock struct {
	clk      clock.Clock
	at       time.Time
	in, read bool
	// Since's value, valid this step if sinceOK.
	sinceOK bool
	since   time.Duration
}

// NewStepClock returns a StepClock over clk, outside any step.
func NewStepClock(clk clock.Clock) *StepClock { return &StepClock{clk: clk} }

// Begin starts a step; End ends it.
func (c *StepClock) Begin() { c.in, c.read, c.sinceOK = true, false, false }

// End ends the step.
func (c *StepClock) End() { c.in, c.sinceOK = false, false }

// Now is the step's reading of the clock (taken by the step's first Now),
// or the clock itself outside a step.
func (c *StepClock) Now() time.Time {
	if !c.in {
		return c.clk.Now()
	}
	if !c.read {
		c.at, c.read = c.clk.Now(), true
	}
	return c.at
}

// Since is the step's time less base (an observer's origin of time),
// computed at the step's first call and kept for the rest of the step (one
// observer per engine: one base), and true; outside a step it is 0 and
// false. The step's time is its reading of the clock, or with own set (an
// observer on another clock than the engine's) one reading of own. It keeps
// what a record would otherwise keep per step in the actor, whose lines are
// in the cache while it runs.
func (c *StepClock) Since(base time.Time, own clock.Clock) (time.Duration, bool) {
	if !c.in {
		return 0, false
	}
	if !c.sinceOK {
		var now time.Time
		if own != nil {
			now = own.Now()
		} else {
			now = c.Now()
		}
		c.since, c.sinceOK = now.Sub(base), true
	}
	return c.since, true
}

// Since0 is Since's value if this step computed it already (inlined: the
// callbacks after a step's first).
func (c *StepClock) Since0() (time.Duration, bool) { return c.since, c.sinceOK }

// NopObserver ignores everything.
type NopObserver struct{}

func (NopObserver) RoomCreated(uint64, time.Time) RoomObserver { return nopRoom{} }
func (NopObserver) Ignored(uint64, room.Msg)                   {}
func (NopObserver) LateTransferDone(uint64, uint32, kv.Reason) {}
func (NopObserver) TombstoneEvicted(uint64)                    {}
func (nopRoom) Traceparent(string)                             {}
func (nopRoom) Step(room.Msg, room.Effects)                    {}
func (nopRoom) Abandoned()                                     {}
func (nopRoom) BindSteps(*StepClock)                           {}

type nopRoom struct{}

// Callbacks is an Observer in per-call form: every callback names its room,
// and a step's effects come as one call per fact, in RoomObserver.Step's
// order. Flat adapts one into an Observer, for observers that keep no
// record per room (counters, logs, test recorders): its methods are called
// from many goroutines and must be safe for concurrent use.
type Callbacks interface {
	RoomCreated(roomID uint64)
	Traceparent(roomID uint64, traceparent string)
	TransferInfo(roomID uint64, agent string, required int)
	StatusChanged(roomID uint64, s kv.Status, why kv.Reason)
	Posted(t *kv.Transfer)
	// TransferDone is also called for a write that completed after its
	// room retired.
	TransferDone(roomID uint64, seq uint32, fail kv.Reason)
	RoomRetired(t room.Tombstone)
	Ignored(roomID uint64, msg room.Msg)
	TombstoneEvicted(roomID uint64)
}

// Flat makes an Observer of c. If c is a RefusalObserver, so is the result.
func Flat(c Callbacks) Observer {
	if r, ok := c.(RefusalObserver); ok {
		return flatRefusals{flat{c}, r}
	}
	return flat{c}
}

type flat struct{ c Callbacks }

type flatRefusals struct {
	flat
	RefusalObserver
}

func (f flat) RoomCreated(id uint64, _ time.Time) RoomObserver {
	f.c.RoomCreated(id)
	return &flatRoom{c: f.c, id: id}
}
func (f flat) Ignored(id uint64, msg room.Msg) { f.c.Ignored(id, msg) }
func (f flat) LateTransferDone(id uint64, seq uint32, fail kv.Reason) {
	f.c.TransferDone(id, seq, fail)
}
func (f flat) TombstoneEvicted(id uint64) { f.c.TombstoneEvicted(id) }

type flatRoom struct {
	c  Callbacks
	id uint64
}

func (r *flatRoom) Traceparent(tp string) { r.c.Traceparent(r.id, tp) }
func (r *flatRoom) Abandoned()            {}
func (r *flatRoom) BindSteps(*StepClock)  {}

func (r *flatRoom) Step(msg room.Msg, fx room.Effects) {
	if fx.Info.Seen {
		r.c.TransferInfo(r.id, fx.Info.Agent, fx.Info.Required)
	}
	if fx.Done.Seen {
		r.c.TransferDone(r.id, fx.Done.Seq, fx.Done.Fail)
	}
	for i := range fx.Posts {
		r.c.Posted(&fx.Posts[i])
	}
	if fx.Published {
		r.c.StatusChanged(r.id, fx.Status, fx.Reason)
	}
	if fx.Ignored && !fx.Retire {
		r.c.Ignored(r.id, msg)
	}
	if fx.Retire {
		r.c.RoomRetired(fx.Tomb)
	}
}

// observe hands one step of a room to its record (rec; nil: none, as for a
// tombstone's step), and has the Observer count a message that no live room
// absorbed.
func observe(e *Engine, rec RoomObserver, id uint64, msg room.Msg, fx room.Effects) {
	if rec != nil {
		rec.Step(msg, fx)
	}
	if fx.Ignored && (rec == nil || fx.Retire) {
		e.cfg.Observer.Ignored(id, msg)
	}
}

// failedSteps is the end of a room's story that the engine tells a record
// itself (a room refused, or failed by a panic its rules could not handle),
// in two steps, so that a record that panics at the first may still get the
// second: the room fails (t.Reason), then retires as t.
func failedSteps(t room.Tombstone) (room.Msg, [2]room.Effects) {
	return room.Fail{Reason: t.Reason}, [2]room.Effects{
		{Published: true, Status: kv.StatusFailed, Reason: t.Reason, View: tombReply(t)},
		{Retire: true, Tomb: t, View: tombReply(t)},
	}
}

// failedStory tells rec failedSteps(t), each step's panic recovered.
func failedStory(rec RoomObserver, t room.Tombstone) {
	msg, fx := failedSteps(t)
	for i := range fx {
		recoverFrom(func() { rec.Step(msg, fx[i]) })
	}
}
