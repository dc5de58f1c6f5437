package actors

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// panicky is an Observer that panics in one callback for one room and
// records like recorder otherwise.
type panicky struct {
	*recorder
	at     string
	victim uint64
	hits   atomic.Int64 // panics thrown
}

func (p *panicky) hit(name string, id uint64) {
	if p.at == name && id == p.victim {
		p.hits.Add(1)
		panic(fmt.Sprintf("observer bug in %s", name))
	}
}

func (p *panicky) RoomCreated(id uint64)                   { p.hit("RoomCreated", id) }
func (p *panicky) Traceparent(id uint64, _ string)         { p.hit("Traceparent", id) }
func (p *panicky) TransferInfo(id uint64, _ string, _ int) { p.hit("TransferInfo", id) }
func (p *panicky) Posted(t *kv.Transfer)                   { p.hit("Posted", t.Room) }
func (p *panicky) RoomRetired(t room.Tombstone)            { p.hit("RoomRetired", t.Room) }
func (p *panicky) TransferDone(id uint64, _ uint32, _ kv.Reason) {
	p.hit("TransferDone", id)
}
func (p *panicky) StatusChanged(id uint64, s kv.Status, why kv.Reason) {
	p.hit("StatusChanged", id)
	p.recorder.StatusChanged(id, s, why)
}
func (p *panicky) Ignored(id uint64, msg room.Msg) {
	p.hit("Ignored", id)
	p.recorder.Ignored(id, msg)
}
func (p *panicky) TombstoneEvicted(id uint64) {
	p.hit("TombstoneEvicted", id)
	p.recorder.TombstoneEvicted(id)
}

// stepPanicky gives p's records (Flat's) a BindSteps that panics for p's
// victim when p.at is "BindSteps".
type stepPanicky struct {
	Observer
	p *panicky
}

type stepPanickyRoom struct {
	RoomObserver
	p  *panicky
	id uint64
}

func (s stepPanicky) RoomCreated(id uint64, at time.Time) RoomObserver {
	return stepPanickyRoom{s.Observer.RoomCreated(id, at), s.p, id}
}

func (r stepPanickyRoom) BindSteps(*StepClock) { r.p.hit("BindSteps", r.id) }

// runRooms drives rooms through a whole story that reaches every Observer
// callback (a traced open, a duplicate Open that is ignored, a transfer info,
// a posted and completed write, success, clear and retirement), and fails the
// test unless every room but victim succeeds, victim ends terminal, every
// poll returns and no room is left live. It returns victim's last answer.
func runRooms(t *testing.T, f *fixture, ids []uint64, victim uint64) kv.Reply {
	t.Helper()
	for _, id := range ids {
		f.eng.OpenTraced(id, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		f.eng.Open(id) // ignored: a duplicate
		f.eng.TransferInfo(id, info("a", 2, 1))
		f.eng.Init(id, 2, 0)
		f.eng.Send(id, []int32{1, 2}, nil)
	}
	for _, id := range ids {
		if id != victim {
			f.waitStatus(id, kv.StatusSuccess)
		}
	}
	var last kv.Reply
	deadline := time.Now().Add(20 * time.Second)
	for last = f.poll(victim); !last.Status.Terminal(); last = f.poll(victim) {
		if time.Now().After(deadline) {
			t.Fatalf("victim %d still %v", victim, last.Status)
		}
		time.Sleep(time.Millisecond)
	}
	for _, id := range ids {
		f.eng.Clear(id)
	}
	f.settle(ids...)
	f.clk.Advance(20 * time.Second) // a write the victim never posted drains
	f.settle(ids...)
	for _, id := range ids {
		if id == victim {
			continue
		}
		if got := f.obs.terminal(id); len(got) != 1 || got[0] != kv.StatusSuccess {
			t.Fatalf("room %d: terminal answers %v, want one Success", id, got)
		}
	}
	if st := f.eng.Stats(); st.LiveRooms != 0 {
		t.Fatalf("rooms still live: %+v %+v", st, f.eng.Rooms(10))
	}
	return last
}

// An Observer that panics at any one of its callbacks, for one room, fails
// at most that room (internal_error); every other room succeeds, every poll
// returns, nothing is left live, and the engine keeps serving new rooms.
func TestObserverPanicAtEveryCallback(t *testing.T) {
	for _, at := range []string{"RoomCreated", "Traceparent", "TransferInfo", "StatusChanged", "Posted",
		"TransferDone", "RoomRetired", "Ignored", "TombstoneEvicted", "BindSteps"} {
		t.Run(at, func(t *testing.T) {
			const victim = 3
			obs := &panicky{recorder: newRecorder(), at: at, victim: victim}
			f := newFixture(t, &transfersDouble{}, func(c *Config) {
				c.Observer = stepPanicky{Flat(obs), obs}
				c.Shards = 2
				c.TombstoneCap = 4 // tombstones are evicted, the victim's too
			})
			f.obs = obs.recorder
			last := runRooms(t, f, []uint64{1, 2, victim, 4, 5, 6}, victim)
			// A panic once the room has succeeded cannot fail it: at its
			// retirement or its tombstone's eviction, or at the completion
			// that concluded it (the record sees a step once the rules took
			// it: the step's effects still run, and decode and the scheduler
			// both hear Success). Any earlier one does.
			want := kv.Reply{Status: kv.StatusFailed, Reason: kv.ReasonInternalError}
			if at == "RoomRetired" || at == "TombstoneEvicted" || at == "TransferDone" {
				want = kv.Reply{Status: kv.StatusSuccess}
			}
			if last.Status != want.Status || last.Reason != want.Reason {
				t.Fatalf("victim ended %v/%v, want %v/%v", last.Status, last.Reason, want.Status, want.Reason)
			}
			// Decode hears what the scheduler does (invariant 10).
			done, failed := f.notices.Count(victim, room.Completion), f.notices.Count(victim, room.FailureStatus)
			if (want.Status == kv.StatusSuccess) != (done == 1 && failed == 0) || done > 1 {
				t.Fatalf("victim ended %v; decode told done %d times, failure %d times", want.Status, done, failed)
			}
			// Evict every tombstone, the victim's among them.
			for id := uint64(100); id < 110; id++ {
				f.eng.Abort(id)
			}
			f.settle(victim, 100, 101)
			if obs.hits.Load() == 0 {
				t.Fatalf("the observer never panicked at %s", at)
			}
			// The engine still serves: a new room, and the victim's id again.
			runRooms(t, f, []uint64{200, 201}, 0)
			if r := f.poll(victim); r.Status != kv.StatusFailed {
				t.Fatalf("victim's id after eviction polls %+v", r)
			}
		})
	}
}

// The shard's own step of a new room or a tombstone panics: the new room is
// kept as a Failed internal_error tombstone and answers at once; a retired
// room's tombstone is kept as it was; every other room succeeds.
func TestShardStepPanicFailsOnlyThatRoom(t *testing.T) {
	const victim, retiredOK = 3, 4
	armed := make(chan struct{})
	f := newFixture(t, &transfersDouble{}, func(c *Config) {
		c.Shards = 2
		c.hooks.shardStep = func(id uint64, msg room.Msg) {
			if id == victim {
				panic("shard step bug")
			}
			select {
			case <-armed:
				if id == retiredOK {
					panic("shard step bug on a tombstone")
				}
			default:
			}
		}
	})
	runRooms(t, f, []uint64{1, 2, retiredOK, 5}, 0)
	f.eng.Open(victim)
	if r := f.poll(victim); r.Status != kv.StatusFailed || r.Reason != kv.ReasonInternalError {
		t.Fatalf("victim polls %+v, want Failed/internal_error", r)
	}
	close(armed)
	f.eng.TransferInfo(retiredOK, info("a", 1, 1)) // late: steps the tombstone, which panics
	if r := f.poll(retiredOK); r.Status != kv.StatusSuccess {
		t.Fatalf("retired room polls %+v after a panic on its tombstone, want Success", r)
	}
	runRooms(t, f, []uint64{6, 7, 8}, 0)
}

// A room actor that dies (its panic handling panics too) is seen by its
// shard: its room becomes a Failed internal_error tombstone that answers at
// once, it is no longer routed, and a poll lost in the dead actor's mailbox
// ends by the poll deadline, on the engine's clock.
func TestDeadRoomActorBecomesFailedTombstone(t *testing.T) {
	const victim = 3
	f := newFixture(t, &transfersDouble{}, func(c *Config) {
		c.Shards = 2
		c.PollTimeout = 5 * time.Second
		c.hooks.roomMsg = func(id uint64, msg any) {
			if env, ok := msg.(*envelope); ok && id == victim && env.sync {
				panic("room bug")
			}
		}
		c.hooks.roomFault = func(id uint64) { panic("panic handling bug") }
	})
	ids := []uint64{1, 2, victim, 4}
	for _, id := range ids {
		f.eng.Open(id)
	}
	f.settle(1, 2, 4)
	live := f.eng.Stats().LiveRooms
	lost := make(chan kv.Reply)
	go func() { lost <- f.eng.PollSync([]uint64{victim}, nil)[0] }()
	deadline := time.Now().Add(20 * time.Second)
	for f.eng.Stats().LiveRooms != live-1 {
		if time.Now().After(deadline) {
			t.Fatalf("the dead room is still routed: %+v", f.eng.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if r := f.poll(victim); r.Status != kv.StatusFailed || r.Reason != kv.ReasonInternalError {
		t.Fatalf("dead room polls %+v, want Failed/internal_error", r)
	}
	select {
	case r := <-lost:
		t.Fatalf("the poll lost in the dead mailbox answered %+v before its deadline", r)
	default:
	}
	f.clk.Advance(5 * time.Second)
	if r := <-lost; r.Status != kv.StatusFailed || r.Reason != kv.ReasonInternalError {
		t.Fatalf("lost poll answered %+v at its deadline, want Failed/internal_error", r)
	}
	for _, id := range []uint64{1, 2, 4} {
		f.eng.TransferInfo(id, info("a", 2, 1))
		f.eng.Init(id, 2, 0)
		f.eng.Send(id, []int32{1, 2}, nil)
		f.waitStatus(id, kv.StatusSuccess)
	}
	f.eng.Open(victim) // opened again: a new incarnation, served
	f.eng.TransferInfo(victim, info("a", 1, 1))
	f.eng.Init(victim, 1, 0)
	f.eng.Send(victim, []int32{1}, nil)
	f.waitStatus(victim, kv.StatusSuccess)
}

// recordPanics is an Observer whose victim room's record panics when it is
// abandoned, and which panics on the victim's late completion; every other
// callback records nothing.
type recordPanics struct {
	NopObserver
	victim    uint64
	hits      atomic.Int64
	abandoned atomic.Int64
}

type recordPanicsRoom struct {
	nopRoom
	p  *recordPanics
	id uint64
}

func (p *recordPanics) RoomCreated(id uint64, _ time.Time) RoomObserver {
	return &recordPanicsRoom{p: p, id: id}
}
func (p *recordPanics) LateTransferDone(id uint64, _ uint32, _ kv.Reason) {
	if id == p.victim {
		p.hits.Add(1)
		panic("observer bug in LateTransferDone")
	}
}
func (r *recordPanicsRoom) BindSteps(*StepClock) {}
func (r *recordPanicsRoom) Abandoned() {
	r.p.abandoned.Add(1)
	if r.id == r.p.victim {
		r.p.hits.Add(1)
		panic("observer bug in Abandoned")
	}
}

// heldTransfers keeps every done function until the test calls it.
type heldTransfers struct {
	mu   sync.Mutex
	done map[uint64][]kv.DoneFunc
}

func (h *heldTransfers) Post(t kv.Transfer, done kv.DoneFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done == nil {
		h.done = map[uint64][]kv.DoneFunc{}
	}
	h.done[t.Room] = append(h.done[t.Room], done)
}

func (h *heldTransfers) take(id uint64) []kv.DoneFunc {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.done[id]
	delete(h.done, id)
	return d
}

// The record callbacks that concern a room no longer live panic: a late
// completion (the room retired at its drain deadline) and an abandoned
// record (Engine.AbandonRecords). Only the victim is touched: every other
// room's record is still handed over, AbandonRecords returns, and the engine
// keeps serving.
func TestObserverPanicLateAndAbandoned(t *testing.T) {
	const victim = 3
	obs := &recordPanics{victim: victim}
	xf := &heldTransfers{}
	clk := clock.NewFake(time.Unix(1000, 0))
	eng, err := New(Config{Clock: clk, Transfers: xf, Observer: obs, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Close(ctx)
	})
	ids := []uint64{1, 2, victim, 4}
	for _, id := range ids {
		eng.Open(id)
		eng.TransferInfo(id, info("a", 2, 1))
		eng.Init(id, 2, 0)
		eng.Send(id, []int32{1, 2}, nil)
	}
	eng.PollSync(ids, nil)
	// Every room is live: abandoning their records panics on the victim's.
	eng.AbandonRecords()
	if n := obs.abandoned.Load(); n != int64(len(ids)) {
		t.Fatalf("%d records abandoned, want %d", n, len(ids))
	}
	// The victim's write never completes in time: it fails at the transfer
	// deadline, retires at the drain deadline, then the write completes.
	for _, id := range []uint64{1, 2, 4} {
		for _, d := range xf.take(id) {
			d(kv.ReasonNone, nil)
		}
	}
	for _, id := range []uint64{1, 2, 4} {
		if r := eng.PollSync([]uint64{id}, nil)[0]; r.Status != kv.StatusSuccess {
			t.Fatalf("room %d polls %+v, want Success", id, r)
		}
	}
	eng.Clear(victim)
	eng.PollSync([]uint64{victim}, nil)
	clk.Advance(time.Minute) // transfer, then drain deadline
	eng.PollSync([]uint64{victim}, nil)
	clk.Advance(time.Minute)
	if r := eng.PollSync([]uint64{victim}, nil)[0]; r.Status != kv.StatusFailed {
		t.Fatalf("victim polls %+v, want Failed", r)
	}
	if st := eng.Stats(); st.LiveRooms != 3 {
		t.Fatalf("live rooms %+v, want the three successful ones", st)
	}
	for _, d := range xf.take(victim) {
		d(kv.ReasonNone, nil) // late: LateTransferDone panics
	}
	if obs.hits.Load() != 2 {
		t.Fatalf("the observer panicked %d times, want 2 (Abandoned, LateTransferDone)", obs.hits.Load())
	}
	// The engine still serves, the victim's id too.
	for _, id := range []uint64{10, victim} {
		eng.Open(id)
		eng.TransferInfo(id, info("a", 1, 1))
		eng.Init(id, 1, 0)
		eng.Send(id, []int32{1}, nil)
		eng.PollSync([]uint64{id}, nil)
		for _, d := range xf.take(id) {
			d(kv.ReasonNone, nil)
		}
		if r := eng.PollSync([]uint64{id}, nil)[0]; r.Status != kv.StatusSuccess {
			t.Fatalf("room %d after the panics polls %+v, want Success", id, r)
		}
	}
}
