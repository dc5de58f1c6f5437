package workload

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/bench"
	"github.com/kvxfer/kvxfer/bench/dict"
	"github.com/kvxfer/kvxfer/internal/clock"
)

// Rig is one engine under test with its fake clock (deadlines pass only when
// the workload says so) and the counters around it.
type Rig struct {
	Kind    bench.Kind
	Engine  bench.Engine
	Clock   *clock.Fake
	Tap     *Tap
	Notices *Notices
	dict    *dict.Engine
	act     *actors.Engine
	aborted *abortSet
}

// NewRig starts an engine of kind k posting through tr. Every engine gets
// its defaults (4 transfer workers for the dict engines, as
// SGLANG_DISAGGREGATION_QUEUE_SIZE; 4×GOMAXPROCS shards for the actors).
func NewRig(k bench.Kind, tr actors.Transfers) (*Rig, error) {
	r := &Rig{Kind: k, Clock: clock.NewFake(time.Unix(1_000_000, 0)), Notices: &Notices{}, aborted: &abortSet{}}
	r.Tap = newTap(tr, r.aborted)
	switch k {
	case bench.Upstream, bench.UpstreamPre30352, bench.Fixed:
		v := dict.Upstream
		if k == bench.Fixed {
			v = dict.Fixed
		}
		cfg := dict.Config{Variant: v, Transfers: r.Tap, Notifier: r.Notices, Clock: r.Clock,
			NonStickyFailed: k == bench.UpstreamPre30352}
		if w, ok := tr.(dict.Waiter); ok {
			cfg.Waiter = w // writes complete while the posting worker waits (dict.Direct)
		}
		e, err := dict.New(cfg)
		if err != nil {
			return nil, err
		}
		r.dict, r.Engine = e, e
	case bench.Actors:
		// No live-room cap: the dict engines have none, and the full
		// suite holds 100,000 rooms (the default cap, sized from the
		// machine's memory, is at most 32,768).
		e, err := actors.New(actors.Config{Transfers: r.Tap, Notifier: r.Notices, Clock: r.Clock,
			RoomCap: 1 << 24, PeerRoomCap: 1 << 24})
		if err != nil {
			return nil, err
		}
		r.act, r.Engine = e, e
	default:
		return nil, fmt.Errorf("workload: unknown engine kind %q", k)
	}
	return r, nil
}

// Settle returns once a dict engine handled every decode frame, chunk and
// completion sent before the call. The actor engine needs nothing: a poll
// travels each room's mailbox behind what was sent to it.
func (r *Rig) Settle() {
	if r.dict != nil {
		r.dict.Settle()
	}
}

// SettleBootstrap returns once a dict engine handled every decode frame sent
// before the call.
func (r *Rig) SettleBootstrap() {
	if r.dict != nil {
		r.dict.SettleBootstrap()
	}
}

// Live counts what the engine holds: map entries (tombstones excluded) for a
// dict engine, live rooms for the actor engine.
func (r *Rig) Live() int {
	if r.dict != nil {
		return r.dict.Leaks().Total()
	}
	return r.act.Stats().LiveRooms
}

// Leaks returns a dict engine's per-map counts (zero for the actors).
func (r *Rig) Leaks() dict.Leaks {
	if r.dict != nil {
		return r.dict.Leaks()
	}
	return dict.Leaks{}
}

// Close stops the engine.
func (r *Rig) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.Engine.Close(ctx)
}

// abortSet records the rooms the workload aborted, with the number of chunks
// the scheduler had sent before it issued the abort.
type abortSet struct{ m sync.Map }

func (s *abortSet) add(id uint64, sent int) { s.m.Store(id, sent) }

// after reports whether chunk of room was sent after the room's abort was
// issued: a write the engine should never have posted.
func (s *abortSet) after(id uint64, chunk int) bool {
	v, ok := s.m.Load(id)
	return ok && chunk >= v.(int)
}
