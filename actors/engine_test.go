package actors

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/actors/xfer/xfertest"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// transfersDouble completes every posted transfer through its outcome function.
// It is a test double of the NIXL pool: never wired outside tests.
type transfersDouble struct {
	outcome func(t kv.Transfer) kv.Reason // ReasonNone: success
	never   func(t kv.Transfer) bool      // the write never completes
	async   bool
	posted  atomic.Int64
	panicOn func(t kv.Transfer) bool
	wg      sync.WaitGroup
}

func (d *transfersDouble) Post(t kv.Transfer, done kv.DoneFunc) {
	d.posted.Add(1)
	if d.panicOn != nil && d.panicOn(t) {
		panic("transfer layer bug")
	}
	if d.never != nil && d.never(t) {
		return
	}
	fail := kv.ReasonNone
	if d.outcome != nil {
		fail = d.outcome(t)
	}
	if !d.async {
		done(fail, nil)
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		done(fail, nil)
	}()
}

// nopCallbacks ignores every callback (test recorders embed it).
type nopCallbacks struct{}

func (nopCallbacks) RoomCreated(uint64)                         {}
func (nopCallbacks) Traceparent(uint64, string)                 {}
func (nopCallbacks) TransferInfo(uint64, string, int)           {}
func (nopCallbacks) TransferDone(uint64, uint32, kv.Reason)     {}
func (nopCallbacks) StatusChanged(uint64, kv.Status, kv.Reason) {}
func (nopCallbacks) Posted(*kv.Transfer)                        {}
func (nopCallbacks) RoomRetired(room.Tombstone)                 {}
func (nopCallbacks) Ignored(uint64, room.Msg)                   {}
func (nopCallbacks) TombstoneEvicted(uint64)                    {}

// recorder is an Observer (through Flat) that keeps per-room terminal counts.
type recorder struct {
	nopCallbacks
	mu        sync.Mutex
	terminals map[uint64][]kv.Status
	reasons   map[uint64]kv.Reason
	ignored   atomic.Int64
	evicted   atomic.Int64
}

func newRecorder() *recorder {
	return &recorder{terminals: map[uint64][]kv.Status{}, reasons: map[uint64]kv.Reason{}}
}

func (r *recorder) StatusChanged(id uint64, s kv.Status, why kv.Reason) {
	if !s.Terminal() {
		return
	}
	r.mu.Lock()
	r.terminals[id] = append(r.terminals[id], s)
	r.reasons[id] = why
	r.mu.Unlock()
}
func (r *recorder) Ignored(uint64, room.Msg) { r.ignored.Add(1) }
func (r *recorder) TombstoneEvicted(uint64)  { r.evicted.Add(1) }
func (r *recorder) terminal(id uint64) []kv.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]kv.Status(nil), r.terminals[id]...)
}

type fixture struct {
	t       *testing.T
	eng     *Engine
	clk     *clock.Fake
	xfer    *transfersDouble
	obs     *recorder
	notices *xfertest.Notices
}

func newFixture(t *testing.T, xfer *transfersDouble, mod func(*Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, clk: clock.NewFake(time.Unix(1000, 0)), xfer: xfer, obs: newRecorder(), notices: &xfertest.Notices{}}
	cfg := Config{Clock: f.clk, Transfers: xfer, Observer: Flat(f.obs), Notifier: f.notices, Shards: 4}
	if mod != nil {
		mod(&cfg)
	}
	eng, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.eng = eng
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.eng.Close(ctx)
	})
	return f
}

func (f *fixture) poll(id uint64) kv.Reply { return f.eng.Poll([]uint64{id}, nil)[0] }

// waitStatus polls until the room reports want. Polling is how the scheduler
// observes the engine; the bound only turns a hang into a failure.
func (f *fixture) waitStatus(id uint64, want kv.Status) kv.Reply {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := f.poll(id)
		if r.Status == want {
			return r
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("room %d: status %v/%v, want %v", id, r.Status, r.Reason, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// settle waits until every message sent so far has been handled: a PollSync
// of a room travels the same shard and room mailboxes as the messages before it.
func (f *fixture) settle(ids ...uint64) { f.eng.PollSync(ids, nil) }

func info(agent string, n int, required int) room.TransferInfo {
	ps := make([]int32, n)
	for i := range ps {
		ps[i] = int32(100 + i)
	}
	return room.TransferInfo{Agent: agent, From: kv.Endpoint{IP: "127.0.0.1", Port: 9000}, DstPages: ps, DstAux: 1, Required: required}
}

func TestEngineHappyPathTwoAgents(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, nil)
	const id = 77
	f.eng.Open(id)
	f.eng.TransferInfo(id, info("a", 4, 2))
	if r := f.poll(id); r.Status != kv.StatusBootstrapping {
		t.Fatalf("one of two infos: %v", r.Status)
	}
	ti := info("b", 4, 2)
	ti.PrefixLen = 16
	f.eng.TransferInfo(id, ti)
	if r := f.poll(id); r.Status != kv.StatusWaitingForInput || r.PrefixLen != 16 {
		t.Fatalf("all infos: %+v", r)
	}
	f.eng.Init(id, 4, 2)
	f.eng.Send(id, []int32{1, 2}, nil)
	f.eng.Send(id, []int32{3, 4}, nil)
	f.waitStatus(id, kv.StatusSuccess)
	if got := f.xfer.posted.Load(); got != 4 {
		t.Fatalf("posted %d transfers, want 2 chunks × 2 agents", got)
	}
	f.eng.Clear(id)
	f.settle(id)
	if st := f.eng.Stats(); st.LiveRooms != 0 || st.Tombstones != 1 {
		t.Fatalf("after clear: %+v", st)
	}
	if got := f.obs.terminal(id); len(got) != 1 || got[0] != kv.StatusSuccess {
		t.Fatalf("terminal answers %v", got)
	}
}

func TestEngineAbortBeforeSender(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, nil)
	const id = 5
	f.eng.DecodeAbort(id, kv.Endpoint{IP: "10.1.1.1", Port: 4242})
	f.settle(id)
	if st := f.eng.Stats(); st.LiveRooms != 0 || st.Tombstones != 1 {
		t.Fatalf("an abort for an unknown room should leave only a tombstone: %+v", st)
	}
	if n := f.notices.Of(id); len(n) != 1 || n[0].Kind != room.AbortAck {
		t.Fatalf("decode should get its ABORT_ACK at once: %+v", n)
	}
	f.eng.Open(id)
	r := f.poll(id)
	if r.Status != kv.StatusFailed || r.Reason != kv.ReasonDecodeAbort {
		t.Fatalf("sender opened after the abort polls %+v", r)
	}
	f.eng.TransferInfo(id, info("a", 1, 1)) // late: absorbed
	f.eng.Clear(id)
	f.settle(id)
	if st := f.eng.Stats(); st.LiveRooms != 0 {
		t.Fatalf("live rooms after clear: %+v", st)
	}
}

func TestEnginePollUnknownRoomIsFailed(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, nil)
	if r := f.poll(123); r.Status != kv.StatusFailed || r.Reason != kv.ReasonInvalidRequest {
		t.Fatalf("unknown room polls %+v; upstream's WaitingForInput default is the bug", r)
	}
	f.eng.Send(123, []int32{1}, nil) // no room: counted, dropped
	f.settle(123)
	if f.obs.ignored.Load() != 1 || f.eng.Stats().LiveRooms != 0 {
		t.Fatalf("a send for an unknown room created state")
	}
}

func TestEngineDeadlinesUseTheInjectedClock(t *testing.T) {
	f := newFixture(t, &transfersDouble{never: func(kv.Transfer) bool { return true }}, nil)
	const id = 9
	f.eng.Open(id)
	f.eng.TransferInfo(id, info("a", 1, 1))
	f.eng.Init(id, 1, 0)
	f.eng.Send(id, []int32{1}, nil)
	if r := f.poll(id); r.Status != kv.StatusTransferring {
		t.Fatalf("status %v", r.Status)
	}
	f.clk.Advance(59 * time.Second)
	if r := f.poll(id); r.Status != kv.StatusTransferring {
		t.Fatalf("failed before the transfer deadline: %v", r.Status)
	}
	f.clk.Advance(2 * time.Second)
	r := f.waitStatus(id, kv.StatusFailed)
	if r.Reason != kv.ReasonTransferTimeout {
		t.Fatalf("reason %v", r.Reason)
	}
	if n := f.notices.Of(id); len(n) != 0 {
		t.Fatalf("decode told before the drain deadline: %+v", n)
	}
	f.clk.Advance(11 * time.Second) // drain deadline
	f.settle(id)
	if n := f.notices.Of(id); len(n) != 1 || !n[0].DrainExpired {
		t.Fatalf("after the drain deadline: %+v", n)
	}
	f.clk.Advance(301 * time.Second) // linger: the scheduler never cleared
	f.settle(id)
	if st := f.eng.Stats(); st.LiveRooms != 0 {
		t.Fatalf("room still live after linger: %+v", st)
	}
	if r := f.poll(id); r.Status != kv.StatusFailed {
		t.Fatalf("tombstone polls %v", r.Status)
	}
}

func TestEnginePanicFailsOnlyThatRoom(t *testing.T) {
	x := &transfersDouble{panicOn: func(t kv.Transfer) bool { return t.Room == 13 }}
	f := newFixture(t, x, nil)
	for _, id := range []uint64{12, 13, 14} {
		f.eng.Open(id)
		f.eng.TransferInfo(id, info("a", 1, 1))
		f.eng.Init(id, 1, 0)
		f.eng.Send(id, []int32{1}, nil)
	}
	f.waitStatus(12, kv.StatusSuccess)
	f.waitStatus(14, kv.StatusSuccess)
	r := f.waitStatus(13, kv.StatusFailed)
	if r.Reason != kv.ReasonInternalError {
		t.Fatalf("panicking room failed with %v", r.Reason)
	}
	// The write whose Post panicked never reports back: the drain deadline
	// ends the wait, and decode hears about it with the reason.
	f.clk.Advance(11 * time.Second)
	f.settle(13)
	if n := f.notices.Of(13); len(n) != 1 || n[0].Reason != kv.ReasonInternalError || !n[0].DrainExpired {
		t.Fatalf("notices after the drain deadline: %+v", n)
	}
}

func TestEngineTombstoneTTLAndCap(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, func(c *Config) {
		c.Shards = 1
		c.TombstoneCap = 3
		c.TombstoneTTL = 100 * time.Second
	})
	for id := uint64(1); id <= 5; id++ {
		f.eng.Abort(id) // client abort of unknown rooms: tombstones only
	}
	f.settle(1)
	if st := f.eng.Stats(); st.Tombstones != 3 || f.obs.evicted.Load() != 2 {
		t.Fatalf("cap 3: %+v, evicted %d", st, f.obs.evicted.Load())
	}
	f.clk.Advance(101 * time.Second)
	f.settle(1)
	if st := f.eng.Stats(); st.Tombstones != 0 {
		t.Fatalf("after TTL: %+v", st)
	}
}

func TestEnginePeerLost(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, nil)
	f.eng.Open(1)
	f.eng.TransferInfo(1, info("a", 1, 1))
	f.eng.Open(2)
	f.eng.TransferInfo(2, info("b", 1, 1))
	f.settle(1, 2)
	f.eng.PeerLost("a")
	if r := f.waitStatus(1, kv.StatusFailed); r.Reason != kv.ReasonPeerLost {
		t.Fatalf("reason %v", r.Reason)
	}
	if r := f.poll(2); r.Status != kv.StatusWaitingForInput {
		t.Fatalf("room of another agent: %v", r.Status)
	}
}

func TestEngineRoomsDump(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, nil)
	for id := uint64(1); id <= 10; id++ {
		f.eng.Open(id)
	}
	f.eng.Abort(3)
	f.settle(1, 3)
	rooms := f.eng.Rooms(100)
	if len(rooms) != 9 {
		t.Fatalf("dump has %d non-terminal rooms, want 9", len(rooms))
	}
	if got := f.eng.Rooms(4); len(got) != 4 {
		t.Fatalf("limit 4 gave %d", len(got))
	}
}

func TestEnginePollAfterCloseAnswersShutdown(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, nil)
	f.eng.Open(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.eng.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if r := f.poll(1); r.Status != kv.StatusFailed || r.Reason != kv.ReasonShutdown {
		t.Fatalf("poll after close: %+v", r)
	}
	if st := f.eng.Stats(); st != (Stats{}) {
		t.Fatalf("stats after close: %+v", st)
	}
}

// TestEngineRegistryCompacted: the engine's process registry is one bucket
// (compactRegistry), every process the actor system registered when it was
// made is still found in it, and room actors spawned and retired through it
// are found while live and gone after.
func TestEngineRegistryCompacted(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, nil)
	reg := f.eng.system.ProcessRegistry
	if n := len(reg.LocalPIDs.LocalPIDs); n != 1 {
		t.Fatalf("registry buckets: %d, want 1", n)
	}
	if p, ok := reg.GetLocal("eventstream"); !ok || p == nil {
		t.Fatal("the actor system's event stream is no longer registered")
	}
	for _, pid := range f.eng.shards {
		if _, ok := reg.GetLocal(pid.Id); !ok {
			t.Fatalf("shard %s not registered", pid.Id)
		}
	}
	before := reg.LocalPIDs.LocalPIDs[0].Count()
	f.eng.Open(1)
	if r := f.poll(1); r.Status != kv.StatusBootstrapping {
		t.Fatalf("poll: %+v", r)
	}
	if n := reg.LocalPIDs.LocalPIDs[0].Count(); n != before+1 {
		t.Fatalf("registry entries with one live room: %d, want %d", n, before+1)
	}
	f.eng.Clear(1)
	if r := f.poll(1); r.Status != kv.StatusFailed {
		t.Fatalf("poll after clear: %+v", r)
	}
	if n := reg.LocalPIDs.LocalPIDs[0].Count(); n != before+1 {
		t.Fatalf("registry entries once the room retired: %d, want %d (its actor kept idle)", n, before+1)
	}
	f.eng.Open(1) // a new incarnation, served by the idle actor
	if r := f.poll(1); r.Status != kv.StatusBootstrapping {
		t.Fatalf("poll of the room opened again: %+v", r)
	}
	if n := reg.LocalPIDs.LocalPIDs[0].Count(); n != before+1 {
		t.Fatalf("registry entries with the room opened again: %d, want %d (no new actor)", n, before+1)
	}
}

// TestIdleRoomActorsCapped: a shard keeps at most its part of
// idleRoomActors of the actors of retired rooms; the others are stopped, and
// new rooms are served by the kept ones before any is spawned.
func TestIdleRoomActorsCapped(t *testing.T) {
	for _, c := range []struct{ shards, want int }{{0, 4096}, {1, 4096}, {8, 512}, {256, 16}, {4096, 16}} {
		if got := idleCap(c.shards); got != c.want {
			t.Fatalf("idleCap(%d) = %d, want %d", c.shards, got, c.want)
		}
	}
	f := newFixture(t, &transfersDouble{}, func(c *Config) { c.Shards = 1 })
	idleCap := idleCap(1)
	actors := func() int { return len(roomActorPIDs(f.eng)) }
	ids := make([]uint64, idleCap+300)
	for i := range ids {
		ids[i] = uint64(i + 1)
		f.eng.Open(ids[i])
	}
	f.eng.PollSync(ids, nil)
	if n := actors(); n != len(ids) {
		t.Fatalf("room actors with %d live rooms: %d", len(ids), n)
	}
	for _, id := range ids {
		f.eng.Clear(id)
	}
	f.eng.PollSync(ids, nil)
	deadline := time.Now().Add(20 * time.Second)
	for actors() != idleCap {
		if time.Now().After(deadline) {
			t.Fatalf("room actors once every room retired: %d, want %d", actors(), idleCap)
		}
		time.Sleep(time.Millisecond)
	}
	for i := range ids[:idleCap] {
		ids[i] += uint64(len(ids))
		f.eng.Open(ids[i])
	}
	for i, r := range f.eng.PollSync(ids[:idleCap], nil) {
		if r.Status != kv.StatusBootstrapping {
			t.Fatalf("room %d opened on an idle actor polls %+v", ids[i], r)
		}
	}
	if n := actors(); n != idleCap {
		t.Fatalf("room actors after %d new rooms on %d idle actors: %d", idleCap, idleCap, n)
	}
}

// TestRoomActorNames: the shard tells its room actors' PIDs (roomName)
// from its own and from others'.
func TestRoomActorNames(t *testing.T) {
	for _, n := range []uint64{1, 7, 0xabc, 1<<64 - 1} {
		if pid := (&actor.PID{Id: roomName("$12", n)}); !isRoomActor(pid) {
			t.Fatalf("%q not taken for a room actor", pid.Id)
		}
	}
	for _, id := range []string{"$12", "$12/r", "$12/rx1", "$12/s1", "eventstream"} {
		if isRoomActor(&actor.PID{Id: id}) {
			t.Fatalf("%q taken for a room actor", id)
		}
	}
}

// TestEngineCloseStopsRoomActors: room actors are not protoactor children of
// their shards, so Close stops them itself; once it returns none is left in
// the registry (live rooms and retired ones alike).
func TestEngineCloseStopsRoomActors(t *testing.T) {
	errs := &errorCount{}
	eng, err := New(Config{Clock: clock.NewFake(time.Unix(0, 0)), Transfers: &transfersDouble{}, Logger: slog.New(errs)})
	if err != nil {
		t.Fatal(err)
	}
	rooms := func() int { return len(roomActorPIDs(eng)) }
	ids := make([]uint64, 200)
	for i := range ids {
		ids[i] = uint64(i + 1)
		eng.Open(ids[i])
		if i%2 == 0 {
			eng.Clear(ids[i]) // retires: its actor is poisoned
		}
	}
	eng.PollSync(ids, nil)
	if n := rooms(); n < len(ids)/2 {
		t.Fatalf("room actors before Close: %d, want at least %d", n, len(ids)/2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := eng.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rooms(); n != 0 {
		t.Fatalf("room actors after Close: %d", n)
	}
	if n := errs.n.Load(); n != 0 {
		t.Fatalf("%d errors logged by Close (a room stopped by Close is no dead actor)", n)
	}
}

// errorCount is a slog handler that counts error records.
type errorCount struct{ n atomic.Int64 }

func (h *errorCount) Enabled(context.Context, slog.Level) bool { return true }
func (h *errorCount) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		h.n.Add(1)
	}
	return nil
}
func (h *errorCount) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *errorCount) WithGroup(string) slog.Handler      { return h }
