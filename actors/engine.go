package actors

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/internal/dispatch"
	"github.com/kvxfer/kvxfer/internal/mailbox"
	"github.com/kvxfer/kvxfer/kv"
)

// Transfers posts a room's writes. The NIXL transfer pool implements it; Post
// must not block, and done must be called exactly once per Post, from any
// goroutine, with kv.ReasonNone on success. signal is the notifications held
// back from a HoldSignal transfer's writes (nil otherwise). A done called
// inside Post is stepped once the posting step is done; a later one may run
// the room's handling of it on the calling goroutine (a room actor's mailbox
// runs on its sender's goroutine when idle), so call done holding no lock
// that Post, Notify or the Observer might take.
type Transfers interface {
	Post(t kv.Transfer, done kv.DoneFunc)
}

// Notifier carries a room's notices to decode (KV_STATUS failure, ABORT_ACK).
// The transport decides whether the decode speaks a protocol that wants them.
// Notify must not block: it runs in the room's handling, which may be on its
// shard's goroutine.
type Notifier interface {
	Notify(roomID uint64, n room.Notice)
}

// RefusalObserver is an Observer that also hears of refused rooms (optional):
// a message that would have made a room live beyond Config.RoomCap
// (peerShare false) or beyond its decode agent's Config.PeerRoomCap (true).
// A refused Open also shows as a room created and retired Failed/room_cap.
type RefusalObserver interface {
	RoomRefused(roomID uint64, peerShare bool)
}

// Config configures an Engine. Transfers is required; the rest has defaults.
type Config struct {
	Room         room.Config
	Shards       int           // directory shards; default 4 × GOMAXPROCS
	TombstoneTTL time.Duration // default 600 s
	TombstoneCap int           // across all shards; default 262,144
	// RoomCap caps live rooms across all shards (split evenly; each shard
	// refuses at its share). Default DefaultRoomCap(MemoryLimit()). A message
	// that would create or revive a room beyond it is refused (room_cap).
	RoomCap int
	// PeerRoomCap caps the live rooms one decode agent's transfer infos may
	// create (split over the shards too); default RoomCap / 2, so one decode
	// cannot take every room. Rooms the scheduler opened first are charged to
	// nobody.
	PeerRoomCap int
	// PollTimeout bounds how long Poll and PollSync wait for a room's
	// answer, on Clock (default 10 s). A room that has not answered by then
	// (its actor died with the poll in its mailbox, or is stuck) is answered
	// Failed/internal_error, so no poll blocks the scheduler's loop forever.
	PollTimeout time.Duration
	Clock       clock.Clock // default the wall clock
	Transfers   Transfers
	Notifier    Notifier
	Observer    Observer
	Logger      *slog.Logger

	hooks testHooks // tests only
}

// testHooks inject panics where no callback reaches (tests only; nil
// otherwise): the shard's own step of a tombstone or new room, a room actor
// taking a message, and a room actor handling a panic.
type testHooks struct {
	shardStep func(roomID uint64, msg room.Msg)
	roomMsg   func(roomID uint64, msg any)
	roomFault func(roomID uint64)
}

// withDefaults fills zero fields with the documented defaults and validates.
func (c *Config) withDefaults() (Config, error) {
	out := c.defaulted()
	if err := out.Room.Validate(); err != nil {
		return out, err
	}
	if out.Transfers == nil {
		return out, errors.New("actors: Config.Transfers is required")
	}
	return out, nil
}

func (c *Config) defaulted() Config {
	out := *c
	if r := out.Room; r == (room.Config{HoldCompletion: r.HoldCompletion}) {
		out.Room = room.DefaultConfig()
		out.Room.HoldCompletion = r.HoldCompletion
	}
	if out.Shards <= 0 {
		out.Shards = 4 * runtime.GOMAXPROCS(0)
	}
	if out.TombstoneTTL <= 0 {
		out.TombstoneTTL = 600 * time.Second
	}
	if out.TombstoneCap <= 0 {
		out.TombstoneCap = 1 << 18
	}
	if out.RoomCap <= 0 {
		out.RoomCap = DefaultRoomCap(MemoryLimit())
	}
	if out.PeerRoomCap <= 0 {
		out.PeerRoomCap = defaultPeerRoomCap(out.RoomCap)
	}
	if out.PollTimeout <= 0 {
		out.PollTimeout = DefaultPollTimeout
	}
	if out.Clock == nil {
		out.Clock = clock.Real{}
	}
	if out.Notifier == nil {
		out.Notifier = dropNotices{}
	}
	if out.Observer == nil {
		out.Observer = NopObserver{}
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out
}

// DefaultPollTimeout is Config.PollTimeout's default: polls answer in
// microseconds; only a room that cannot answer is waited for this long.
const DefaultPollTimeout = 10 * time.Second

// Engine is the scheduler- and decode-facing API over the room actors. Its
// methods are safe for concurrent use; messages from one goroutine to one room
// keep their order.
type Engine struct {
	cfg    Config
	system *actor.ActorSystem
	shards []*actor.PID
	dirs   []*directory // dirs[i] is shards[i]'s rooms, for Poll
	closed chan struct{}
	// stopped is closed once the shards are stopped: a request still waiting
	// for their answer then gets the shutdown answer instead of blocking.
	stopped chan struct{}
	// loops run the shards' mailboxes (one goroutine each), ended by Close.
	loops []*dispatch.Loop
}

// New starts an engine.
func New(cfg Config) (*Engine, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	compactRegistry(sys)
	e := &Engine{cfg: c, system: sys, closed: make(chan struct{}), stopped: make(chan struct{})}
	capPerShard := (c.TombstoneCap + c.Shards - 1) / c.Shards
	lim := shardLimits(c.RoomCap, c.PeerRoomCap, c.Shards)
	for i := 0; i < c.Shards; i++ {
		dir := newDirectory()
		e.dirs = append(e.dirs, dir)
		// One long-lived goroutine per shard (dispatch.Loop): its rooms run
		// on it, so its stack is grown once, not per burst of messages.
		loop := dispatch.NewLoop(300)
		e.loops = append(e.loops, loop)
		props := actor.PropsFromProducer(func() actor.Actor { return newShard(e, capPerShard, lim, dir) },
			actor.WithSupervisor(actor.NewOneForOneStrategy(0, 0, func(any) actor.Directive { return actor.StopDirective })),
			actor.WithMailbox(mailbox.Unbounded()), // no allocation per message (internal/mailbox)
			actor.WithDispatcher(loop))
		e.shards = append(e.shards, sys.Root.Spawn(props))
	}
	if w, ok := c.Observer.(EngineWatcher); ok {
		w.WatchEngine(e)
	}
	return e, nil
}

// compactRegistry gives the actor system's process registry one bucket
// instead of protoactor's 1,024. Each bucket is a 32-way concurrent map, so
// the registry is 32,768 Go maps, and at any realistic number of rooms nearly
// every room actor's entry lands in an empty one, whose first entry allocates
// a whole group of eight slots (288 B): about 250 B per live room at 10,000
// rooms and 285 B at 1,000, plus 2.8 MB per engine. One bucket keeps 32 maps
// behind 32 locks, which is plenty: a room's PID caches its process, so the
// registry is written once per spawn and stop and read once per PID. The
// entries the system registered when it was made are moved over; nothing
// else holds the system yet.
func compactRegistry(sys *actor.ActorSystem) {
	old := sys.ProcessRegistry.LocalPIDs.LocalPIDs
	keep := old[0]
	for _, b := range old[1:] {
		b.IterCb(func(id string, p any) { keep.Set(id, p) }) // no goroutines, unlike Items
	}
	sys.ProcessRegistry.LocalPIDs = &actor.SliceMap{LocalPIDs: slices.Clone(old[:1])}
}

// shardLimits splits the caps over the shards, rounding up, so the total is
// at least the configured cap and every shard admits at least one room.
func shardLimits(roomCap, peerCap, shards int) limits {
	return limits{rooms: (roomCap + shards - 1) / shards, peer: (peerCap + shards - 1) / shards}
}

// Clock is the clock the engine runs on (Config.Clock).
func (e *Engine) Clock() clock.Clock { return e.cfg.Clock }

func (e *Engine) shardFor(roomID uint64) *actor.PID { return e.shards[e.shardIndex(roomID)] }

func (e *Engine) route(roomID uint64, msg room.Msg) {
	e.toShard(e.shardIndex(roomID), &envelope{room: roomID, msg: msg})
}

// toShard hands shard s a mailbox message that carries room messages (an
// envelope, a Batch part, a broadcast), counted for Poll (see directory).
func (e *Engine) toShard(s int, m any) {
	e.dirs[s].enq.Add(1)
	e.system.Root.Send(e.shards[s], m)
}

// Scheduler side.

// Open records that the scheduler created the sender of a room.
func (e *Engine) Open(roomID uint64) { e.route(roomID, room.Open{}) }

// OpenTraced is Open with the scheduler's W3C traceparent: the room's span
// joins that trace (RoomObserver.Traceparent, called by the room when the
// Open reaches it). A panicking Traceparent fails the room (internal_error).
func (e *Engine) OpenTraced(roomID uint64, traceparent string) {
	e.toShard(e.shardIndex(roomID), &envelope{room: roomID, msg: room.Open{}, trace: traceparent})
}

// Init is sender.init(numPages, auxIndex).
func (e *Engine) Init(roomID uint64, numPages, auxIndex int) {
	e.route(roomID, room.Init{NumPages: numPages, AuxIndex: auxIndex})
}

// Send is sender.send(pages, state): one chunk. The engine keeps the slices.
func (e *Engine) Send(roomID uint64, pages []int32, state [][]int32) {
	e.route(roomID, room.Send{Pages: pages, State: state})
}

// Abort is the scheduler's sender.abort() (client abort).
func (e *Engine) Abort(roomID uint64) { e.route(roomID, room.Abort{}) }

// Clear is sender.clear().
func (e *Engine) Clear(roomID uint64) { e.route(roomID, room.Clear{}) }

// Poll answers the status of a batch of rooms. Each room is read from its
// shard's directory, the engine's status table, with atomic loads and no
// message, when that answer follows every call the caller made before the
// poll (Open, Init, Send, Abort, Clear, TransferInfo, ...: the shard has
// routed them and the room has handled all it was routed; see directory).
// Any other room is asked through its directory shard, one message per shard
// for the rest of the batch: the shard answers from the room's view if the
// room has handled everything routed to it, and otherwise the room answers
// itself. So a poll never misses the caller's earlier calls, and a status
// change a room made on its own (a completion, a deadline) shows once the
// room has published it. out is reused when it has the capacity. Every room
// is answered within Config.PollTimeout: one that has not answered by then
// is answered Failed/internal_error.
func (e *Engine) Poll(rooms []uint64, out []kv.Reply) []kv.Reply {
	return e.poll(rooms, out, false)
}

// PollSync is Poll answered by every room itself, after everything already in
// its mailbox (completions and deadlines included): a barrier for tests and
// shutdown, slower than Poll.
func (e *Engine) PollSync(rooms []uint64, out []kv.Reply) []kv.Reply {
	return e.poll(rooms, out, true)
}

func (e *Engine) poll(rooms []uint64, out []kv.Reply, sync bool) []kv.Reply {
	out = append(out[:0], make([]kv.Reply, len(rooms))...)
	if len(rooms) == 0 {
		return out
	}
	if sync || e.isClosed() {
		return e.ask(rooms, out, sync)
	}
	// Read what the directory can answer; ask the shards for the rest.
	var rest []int
	for i, id := range rooms {
		if r, ok := e.dirs[e.shardIndex(id)].read(id); ok {
			out[i] = r
		} else {
			rest = append(rest, i)
		}
	}
	switch {
	case len(rest) == 0:
		return out
	case len(rest) == len(rooms):
		return e.ask(rooms, out, false)
	}
	ids := make([]uint64, len(rest))
	for k, i := range rest {
		ids[k] = rooms[i]
	}
	for k, r := range e.ask(ids, make([]kv.Reply, len(ids)), false) {
		out[rest[k]] = r
	}
	return out
}

func (e *Engine) isClosed() bool {
	select {
	case <-e.closed:
		return true
	default:
		return false
	}
}

// ask has the shards answer a poll of rooms into out (len(rooms)).
func (e *Engine) ask(rooms []uint64, out []kv.Reply, sync bool) []kv.Reply {
	answers := make(chan pollAnswer, len(rooms))
	// Armed before the rooms are asked: a poll that reached a room is
	// already under its deadline.
	expired := make(chan struct{})
	timer := e.cfg.Clock.AfterFunc(e.cfg.PollTimeout, func() { close(expired) })
	defer timer.Stop()
	batches := make([]*pollBatch, len(e.shards))
	for i, r := range rooms {
		s := e.shardIndex(r)
		if batches[s] == nil {
			batches[s] = &pollBatch{answers: answers, sync: sync}
		}
		batches[s].rooms = append(batches[s].rooms, r)
		batches[s].index = append(batches[s].index, i)
	}
	for s, b := range batches {
		if b != nil {
			e.system.Root.Send(e.shards[s], b)
		}
	}
	answered := make([]bool, len(rooms))
	rest := func(r kv.Reply) []kv.Reply {
		for i := range out {
			if !answered[i] {
				out[i] = r
			}
		}
		return out
	}
	for range rooms {
		select {
		case a := <-answers:
			out[a.index], answered[a.index] = a.reply, true
		case <-e.stopped:
			return rest(kv.Reply{Status: kv.StatusFailed, Reason: kv.ReasonShutdown})
		case <-expired:
			e.cfg.Logger.Error("rooms did not answer a poll in time; answered internal_error", "timeout", e.cfg.PollTimeout)
			return rest(kv.Reply{Status: kv.StatusFailed, Reason: kv.ReasonInternalError})
		}
	}
	return out
}

func (e *Engine) shardIndex(roomID uint64) int {
	// Rooms are random 63-bit ids, but mix anyway so sequential ids in tests
	// and benchmarks spread too.
	h := roomID * 0x9E3779B97F4A7C15
	return int((h >> 32) % uint64(len(e.shards)))
}

// Decode side.

// TransferInfo delivers one decode agent's transfer info for a room.
// A room it would create is charged to ti.Agent (Config.PeerRoomCap).
func (e *Engine) TransferInfo(roomID uint64, ti room.TransferInfo) {
	e.route(roomID, ti)
}

// Batch collects room messages for one hand-off (a decode frame's, a drain
// of the scheduler's shared-memory ring): Flush sends
// each shard its part as one mailbox message (a part is also sent as soon as
// it holds batchPart messages), instead of one per message, and
// the shard routes them in the order they were added. Messages to one room
// keep their order, within a batch and against the engine's other calls made
// by the same goroutine after Flush. A Batch belongs to one goroutine; it is
// reusable after Flush. What each method does to a room is exactly what the
// Engine method of the same name does.
type Batch struct {
	e *Engine
	// parts holds, per shard, the messages added since its part was last
	// sent. It is scratch space, reused: what a shard is sent is an exact
	// copy (send), since a part made for more messages than it got (the
	// most a batch may hold, or as many as the last one held) cost up to
	// 2.3 KB per hand-off, and parts of a ring drain or a decode frame vary
	// from one message to dozens.
	parts [][]envelope
}

// envBatch is one shard's part of a Batch, routed in order.
type envBatch struct{ envs []envelope }

// NewBatch returns an empty Batch for this engine.
func (e *Engine) NewBatch() *Batch {
	return &Batch{e: e, parts: make([][]envelope, len(e.shards))}
}

func (b *Batch) add(roomID uint64, msg room.Msg) { b.addEnv(envelope{room: roomID, msg: msg}) }

func (b *Batch) addEnv(env envelope) {
	s := b.e.shardIndex(env.room)
	b.parts[s] = append(b.parts[s], env)
	if len(b.parts[s]) == batchPart {
		// A full part goes at once: its shard starts on it while the
		// rest of the batch is being built.
		b.send(s)
	}
}

// send hands shard s a copy of its part and empties the scratch space.
func (b *Batch) send(s int) {
	part := b.parts[s]
	b.e.toShard(s, &envBatch{envs: append(make([]envelope, 0, len(part)), part...)})
	clear(part) // the scratch keeps no message alive
	b.parts[s] = part[:0]
}

// batchPart is how many messages a shard's part of a Batch holds before it
// is sent without waiting for Flush.
const batchPart = 32

// Len is how many messages wait for Flush (parts already sent when full
// are not counted).
func (b *Batch) Len() int {
	n := 0
	for _, p := range b.parts {
		n += len(p)
	}
	return n
}

// Open adds Engine.Open(roomID).
func (b *Batch) Open(roomID uint64) { b.add(roomID, room.Open{}) }

// OpenTraced adds Engine.OpenTraced(roomID, traceparent).
func (b *Batch) OpenTraced(roomID uint64, traceparent string) {
	b.addEnv(envelope{room: roomID, msg: room.Open{}, trace: traceparent})
}

// Init adds Engine.Init(roomID, numPages, auxIndex).
func (b *Batch) Init(roomID uint64, numPages, auxIndex int) {
	b.add(roomID, room.Init{NumPages: numPages, AuxIndex: auxIndex})
}

// Send adds Engine.Send(roomID, pages, state); the engine keeps the slices.
func (b *Batch) Send(roomID uint64, pages []int32, state [][]int32) {
	b.add(roomID, room.Send{Pages: pages, State: state})
}

// Abort adds Engine.Abort(roomID).
func (b *Batch) Abort(roomID uint64) { b.add(roomID, room.Abort{}) }

// Clear adds Engine.Clear(roomID).
func (b *Batch) Clear(roomID uint64) { b.add(roomID, room.Clear{}) }

// TransferInfo adds Engine.TransferInfo(roomID, ti).
func (b *Batch) TransferInfo(roomID uint64, ti room.TransferInfo) { b.add(roomID, ti) }

// Fail adds Engine.Fail(roomID, why).
func (b *Batch) Fail(roomID uint64, why kv.Reason) { b.add(roomID, room.Fail{Reason: why}) }

// DecodeAbort adds Engine.DecodeAbort(roomID, from).
func (b *Batch) DecodeAbort(roomID uint64, from kv.Endpoint) {
	b.add(roomID, room.DecodeAbort{From: from})
}

// Flush sends what was added, one message per shard that has any.
func (b *Batch) Flush() {
	for s, p := range b.parts {
		if len(p) > 0 {
			b.send(s)
		}
	}
}

// DecodeAbort delivers decode's ABORT for a room.
func (e *Engine) DecodeAbort(roomID uint64, from kv.Endpoint) {
	e.route(roomID, room.DecodeAbort{From: from})
}

// DecodeAbortGen delivers an ABORT that carries SGLang 0.5.22+'s deferred-release
// generation, which the ABORT_ACK echoes.
func (e *Engine) DecodeAbortGen(roomID uint64, from kv.Endpoint, gen uint64) {
	e.route(roomID, room.DecodeAbort{From: from, Gen: gen, HasGen: true})
}

// Fail fails one room from outside its rules, e.g. a malformed frame that named
// it. A room nobody opened yet is created failed, so its sender fails when opened.
func (e *Engine) Fail(roomID uint64, why kv.Reason) { e.route(roomID, room.Fail{Reason: why}) }

// PeerLost fails every live room that has a transfer info from agent.
func (e *Engine) PeerLost(agent string) {
	for s := range e.shards {
		e.toShard(s, &broadcast{msg: room.PeerLost{Agent: agent}})
	}
}

// Stats counts live rooms and tombstones across the shards, and the messages
// refused because they would have made a room live beyond a cap.
type Stats struct {
	LiveRooms  int
	Tombstones int
	RoomCap    int // the live-room cap in force (the shards' shares summed)
	// RefusedRoomCap: refused at the room cap; RefusedPeerShare: refused at
	// the decode agent's share.
	RefusedRoomCap   uint64
	RefusedPeerShare uint64
}

// Stats asks every shard for its counts.
func (e *Engine) Stats() Stats {
	var st Stats
	for _, sh := range e.gather(func(reply chan<- any) any { return &statsReq{reply: reply} }) {
		s := sh.(Stats)
		st.LiveRooms += s.LiveRooms
		st.Tombstones += s.Tombstones
		st.RoomCap += s.RoomCap
		st.RefusedRoomCap += s.RefusedRoomCap
		st.RefusedPeerShare += s.RefusedPeerShare
	}
	return st
}

// Live counts the live rooms by the status a poll answers, summed from what
// each room last reported to its shard, one message per shard (a metrics
// scrape; not for a hot path).
func (e *Engine) Live() LiveRooms {
	var out LiveRooms
	for _, v := range e.gather(func(reply chan<- any) any { return &liveReq{reply: reply} }) {
		l := v.(LiveRooms)
		for i := range out.ByStatus {
			out.ByStatus[i] += l.ByStatus[i]
		}
		if l.NonTerminal > 0 && (out.NonTerminal == 0 || l.OldestNonTerminal.Before(out.OldestNonTerminal)) {
			out.OldestNonTerminal = l.OldestNonTerminal
		}
		out.NonTerminal += l.NonTerminal
	}
	return out
}

// AbandonRecords has every live room hand its Observer record over as
// abandoned (RoomObserver.Abandoned) and returns once they all have: an
// observer that closes before the engine emits what the rooms recorded so
// far. The rooms go on unobserved.
func (e *Engine) AbandonRecords() {
	reply := make(chan any, 256)
	for _, s := range e.shards {
		e.system.Root.Send(s, &abandonReq{reply: reply})
	}
	counts, want, got := 0, 0, 0
	for counts < len(e.shards) || got < want {
		select {
		case v := <-reply:
			switch v := v.(type) {
			case dumpCount:
				counts++
				want += int(v)
			case abandoned:
				got++
			}
		case <-e.stopped:
			return
		}
	}
}

// EngineWatcher is an Observer that wants to know the engines it observes
// (New tells it), e.g. to read Engine.Live at scrape time.
type EngineWatcher interface {
	WatchEngine(e *Engine)
}

// RoomInfo describes one live room for the /debug/rooms dump.
type RoomInfo struct {
	Room     uint64 `json:"room"`
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	Phase    string `json:"phase"`
	Inflight int    `json:"inflight"`
	Agents   []string
	Age      time.Duration `json:"age_ns"`
}

// Rooms returns up to limit live rooms that are not yet terminal (the silent
// pins, if any), for the /debug/rooms dump. Each room describes itself. The
// limit applies per shard before the terminal rooms are dropped: each shard
// describes at most limit of its room actors, finished ones (Success or Failed,
// not yet retired) included, so the dump can list fewer than limit pins while
// more exist. It is a debugging aid, not a census: Stats counts rooms.
func (e *Engine) Rooms(limit int) []RoomInfo {
	var out []RoomInfo
	for _, r := range e.describe(limit) {
		if r.Status != kv.StatusSuccess.String() && r.Status != kv.StatusFailed.String() && len(out) < limit {
			out = append(out, r)
		}
	}
	return out
}

// describe has up to limit rooms per shard describe themselves.
func (e *Engine) describe(limit int) []RoomInfo {
	reply := make(chan any, 256)
	for _, s := range e.shards {
		e.system.Root.Send(s, &dumpReq{limit: limit, reply: reply})
	}
	var out []RoomInfo
	counts, want := 0, 0
	for counts < len(e.shards) || len(out) < want {
		var v any
		select {
		case v = <-reply:
		case <-e.stopped:
			return out
		}
		switch v := v.(type) {
		case dumpCount:
			counts++
			want += int(v)
		case RoomInfo:
			out = append(out, v)
		}
	}
	return out
}

func (e *Engine) gather(req func(chan<- any) any) []any {
	reply := make(chan any, len(e.shards))
	for _, s := range e.shards {
		e.system.Root.Send(s, req(reply))
	}
	out := make([]any, 0, len(e.shards))
	for range e.shards {
		select {
		case v := <-reply:
			out = append(out, v)
		case <-e.stopped:
			return out
		}
	}
	return out
}

// Close fails every live room with reason shutdown, waits until no room has a
// write in flight (or ctx ends), then stops every actor and timer.
func (e *Engine) Close(ctx context.Context) error {
	if e.isClosed() {
		return errors.New("actors: engine already closed")
	}
	close(e.closed)
	for s := range e.shards {
		e.toShard(s, &broadcast{msg: room.Fail{Reason: kv.ReasonShutdown}})
	}
	var waitErr error
	for {
		busy := 0
		for _, r := range e.describe(math.MaxInt) {
			busy += r.Inflight
		}
		if busy == 0 {
			break
		}
		select {
		case <-ctx.Done():
			waitErr = fmt.Errorf("actors: closing with %d writes still in flight: %w", busy, ctx.Err())
		case <-time.After(time.Millisecond):
			continue
		}
		break
	}
	// Room actors are not protoactor children of their shards (shard.go,
	// roomActor): each shard stops its own, idle ones included, and answers
	// once all terminated.
	stopped := make(chan any, len(e.shards))
	for _, s := range e.shards {
		e.system.Root.Send(s, &stopRooms{reply: stopped})
	}
	giveUp := time.NewTimer(10 * time.Second) // as StopFuture's own bound
	for range e.shards {
		select {
		case <-stopped:
			continue
		case <-giveUp.C:
			if waitErr == nil {
				waitErr = errors.New("actors: closing with room actors still stopping after 10 s")
			}
		}
		break
	}
	giveUp.Stop()
	for _, s := range e.shards {
		if err := e.system.Root.StopFuture(s).Wait(); err != nil && waitErr == nil {
			waitErr = err
		}
	}
	close(e.stopped)
	e.system.Shutdown()
	for _, l := range e.loops {
		l.Close()
	}
	return waitErr
}

type dropNotices struct{}

func (dropNotices) Notify(uint64, room.Notice) {}
