package bench

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/xfer/xfertest"
	"github.com/kvxfer/kvxfer/bench/dict"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// Kind names an engine under test.
type Kind string

const (
	// Upstream is the dict engine with SGLang's rules at the spec baseline.
	Upstream Kind = "upstream"
	// UpstreamPre30352 is Upstream with Failed not sticky (before #30352).
	UpstreamPre30352 Kind = "upstream-pre30352"
	// Fixed is the dict engine with the best dict-based repair.
	Fixed Kind = "fixed"
	// Actors is kvxfer's actor engine.
	Actors Kind = "actors"
)

// Kinds lists the three engines every scenario runs against.
func Kinds() []Kind { return []Kind{Upstream, Fixed, Actors} }

// Target is one engine over an xfertest pool (its transfer layer), a notice log (its
// decode notifier) and a fake clock, with the controls scenarios need.
type Target struct {
	Kind    Kind
	Engine  Engine
	Gate    *xfertest.Pool
	Notices *xfertest.Notices
	Clock   *clock.Fake
	dict    *dict.Engine
	act     *actors.Engine
}

// NewTarget starts an engine of kind k.
func NewTarget(k Kind) (*Target, error) {
	t := &Target{Kind: k, Gate: xfertest.New(), Notices: &xfertest.Notices{}, Clock: clock.NewFake(time.Unix(1_000_000, 0))}
	switch k {
	case Upstream, UpstreamPre30352, Fixed:
		v := dict.Upstream
		if k == Fixed {
			v = dict.Fixed
		}
		e, err := dict.New(dict.Config{Variant: v, Transfers: t.Gate, Notifier: t.Notices, Clock: t.Clock,
			Hooks: &dict.Hooks{}, NonStickyFailed: k == UpstreamPre30352})
		if err != nil {
			return nil, err
		}
		t.dict, t.Engine = e, e
	case Actors:
		e, err := actors.New(actors.Config{Transfers: t.Gate, Notifier: t.Notices, Clock: t.Clock, Shards: 4})
		if err != nil {
			return nil, err
		}
		t.act, t.Engine = e, e
	default:
		return nil, fmt.Errorf("bench: unknown engine kind %q", k)
	}
	return t, nil
}

// Dict returns the dict engine, or nil for the actor engine.
func (t *Target) Dict() *dict.Engine { return t.dict }

// Pause stops the engine at p for the first event match accepts. Engines
// without that window (the actor engine has none; Fixed has no
// read-then-write update) get an inert Pausepoint: reached and released.
func (t *Target) Pause(p dict.Point, match func(dict.Event) bool) *dict.Pausepoint {
	if !t.HasWindow(p) {
		return dict.Inert()
	}
	return dict.Pause(t.dict.Hooks(), p, match)
}

// HasWindow reports whether the engine has the race window at p.
func (t *Target) HasWindow(p dict.Point) bool { return t.dict != nil && t.dict.HasPoint(p) }

// SettleBootstrap returns once the engine handled every decode message sent
// before the call (actor engine: a poll of the rooms travels their mailboxes
// behind those messages).
func (t *Target) SettleBootstrap(rooms ...uint64) {
	if t.dict != nil {
		t.dict.SettleBootstrap()
		return
	}
	t.barrier(rooms)
}

// SettleWorkers returns once the engine handled every chunk sent and every
// completion reported before the call. No write may be held.
func (t *Target) SettleWorkers(rooms ...uint64) {
	if t.dict != nil {
		t.dict.SettleWorkers()
		return
	}
	t.barrier(rooms)
}

// Settle is SettleBootstrap then SettleWorkers: every decode message, chunk
// and completion sent before the call has been handled.
func (t *Target) Settle(rooms ...uint64) {
	if t.dict != nil {
		t.dict.Settle()
		return
	}
	t.barrier(rooms)
}

// barrier returns once each room handled everything already in its mailbox
// (completions included): the actor engine's PollSync, else a poll.
func (t *Target) barrier(rooms []uint64) {
	if s, ok := t.Engine.(interface {
		PollSync([]uint64, []kv.Reply) []kv.Reply
	}); ok {
		s.PollSync(rooms, nil)
		return
	}
	t.Engine.Poll(rooms, nil)
}

// Poll polls one room.
func (t *Target) Poll(id uint64) kv.Reply { return t.Engine.Poll([]uint64{id}, nil)[0] }

// WaitTerminal polls until the room is terminal or bound passes, and returns
// the last answer. Dict engines answer from their maps, so a settled dict
// engine needs one poll; the actor engine may still be passing messages
// between a room and its timers.
func (t *Target) WaitTerminal(id uint64, bound time.Duration) kv.Reply {
	r := t.Poll(id)
	if t.dict != nil {
		return r
	}
	end := time.Now().Add(bound)
	for !r.Status.Terminal() && time.Now().Before(end) {
		runtime.Gosched()
		r = t.Poll(id)
	}
	return r
}

// Quiesce advances the fake clock by grace in steps of step, polling the
// rooms after each step as the scheduler does every loop (Fixed enforces its
// bootstrap timeout in poll; the actor engine's deadlines chain), then
// returns the final answers and the rooms still non-terminal: pinned.
func (t *Target) Quiesce(rooms []uint64, grace, step time.Duration) (final []kv.Reply, pinned []uint64) {
	for d := time.Duration(0); d < grace; d += step {
		t.Clock.Advance(step)
		t.barrier(rooms)
	}
	for _, id := range rooms {
		r := t.WaitTerminal(id, 2*time.Second)
		final = append(final, r)
		if !r.Status.Terminal() {
			pinned = append(pinned, id)
		}
	}
	return final, pinned
}

// Live counts what the engine still holds: for a dict engine, the entries in
// its maps (tombstones excluded), for the actor engine its live rooms.
func (t *Target) Live() int {
	if t.dict != nil {
		return t.dict.Leaks().Total()
	}
	return t.act.Stats().LiveRooms
}

// Leaks returns the dict engine's per-map counts (zero for the actor engine).
func (t *Target) Leaks() dict.Leaks {
	if t.dict != nil {
		return t.dict.Leaks()
	}
	return dict.Leaks{}
}

// Close releases every held write and stops the engine.
func (t *Target) Close() error {
	t.Gate.ReleaseAll()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return t.Engine.Close(ctx)
}
