package actors

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/internal/mailbox"
	"github.com/kvxfer/kvxfer/kv"
)

// shard is one directory actor: it routes room messages to room actors, spawns
// a room on the first message that names it, and keeps the tombstones of
// retired rooms. It owns its maps and counts; nothing else touches them.
type shard struct {
	eng      *Engine
	capacity int // tombstones kept before the oldest is evicted
	lim      limits

	rooms map[uint64]*live
	dir   *directory             // the live rooms as Engine.Poll reads them
	peers map[string]*peerCharge // live rooms charged to each decode agent (created by its transfer info)
	// refused counts messages that would have made a room live beyond a cap.
	refusedCap, refusedShare uint64
	tombs                    map[uint64]tombEntry
	// bounces counts, per room, envelopes routed to its actor after it
	// retired, on their way back (see onRetired); parked holds the room's
	// later envelopes until they are routed, so that none overtakes them.
	bounces map[uint64]int64
	parked  map[uint64][]*envelope
	queue   []tombRef // insertion order == expiry order (one TTL for all)
	head    int

	self  *actor.PID
	timer clock.Timer
	// props spawn every room actor of the shard: the producer hands over
	// next, which the shard sets just before the (synchronous) spawn.
	props   *actor.Props
	next    *roomActor
	spawned uint64 // room actors spawned, which names them (roomName)
	// idle: room actors whose room retired, each to serve a later room
	// (begin) instead of a new spawn; at most idleMax are kept. poisoned:
	// the actors of retired rooms past that, until they terminated.
	idle     []*actor.PID
	idleMax  int
	poisoned map[string]struct{}
	// actors counts room actors spawned and not yet terminated, idle ones
	// included; closing is Close's stopRooms, answered once actors is 0.
	actors   int
	closing  chan<- any
	stopping bool // stopRooms stopped the live rooms: their Terminated is no death

	// creating: the room being routed is being created or revived;
	// announced: RoomCreated was told for it and rec is its record
	// (routeFault then closes its story); dumped: describes (or abandons)
	// sent for the request being served.
	creating, announced bool
	rec                 RoomObserver
	dumped              int
}

// live is a room with an actor: its PID, how many messages the shard routed
// to it, and the room's view (how many it handled and what a poll answers,
// written by the room).
//
// Kept at 80 bytes (a size class; one per live room): the agent is a pointer
// to its charge, opened sits beside sent. It is also the room's entry in the
// shard's directory, which pollers read.
type live struct {
	view
	pid    *actor.PID
	sent   atomic.Uint32 // written by the shard, read by pollers (directory)
	opened bool          // the scheduler's Open was routed to it
	peer   *peerCharge   // the decode agent charged for the room (nil for the scheduler)
	born   int64         // creation time, UnixNano on the engine's clock
	rec    RoomObserver  // the room's record, for onTerminated only
	id     uint64        // the room
	// slot and gen: where the directory entered it (the shard's only).
	slot, gen uint32
}

// peerCharge is one decode agent's live rooms in a shard; it is dropped when
// the last of them goes, so the shard keeps one per agent with live rooms.
type peerCharge struct {
	agent string
	rooms int
}

// limits are one shard's part of Config.RoomCap and Config.PeerRoomCap.
type limits struct {
	rooms int // live rooms in this shard
	peer  int // live rooms one decode agent's transfer infos may create in this shard
}

// refusal says why a message may not make a room live.
type refusal uint8

const (
	admitted  refusal = iota
	roomCap           // the shard has its share of Config.RoomCap live rooms
	peerShare         // the decode agent has its share of Config.PeerRoomCap
)

// admit decides whether msg, which would make a room live, may: the shard's
// live rooms stay under its cap, and a room created by a transfer info is
// charged to its agent, whose rooms stay under the per-peer share. Opens are
// charged to nobody. charged says how many live rooms an agent is charged.
func (l limits) admit(msg room.Msg, live int, charged func(agent string) int) refusal {
	if live >= l.rooms {
		return roomCap
	}
	if ti, ok := msg.(room.TransferInfo); ok && charged(ti.Agent) >= l.peer {
		return peerShare
	}
	return admitted
}

type tombEntry struct {
	t       room.Tombstone
	expires time.Time
}

type tombRef struct {
	room    uint64
	expires time.Time
}

// idleRoomActors is how many idle room actors an engine keeps for later
// rooms, split between its shards (idleCap). An idle actor holds about 1.4
// KB, its retired room's machine included until it serves the next room;
// past the cap, a retired room's actor is stopped.
const idleRoomActors = 4096

// idleCap is one shard's part of idleRoomActors (at least 16).
func idleCap(shards int) int { return max(16, idleRoomActors/max(shards, 1)) }

// roomDispatcher runs a room actor's mailbox on the goroutine that sends to
// it when the mailbox is idle (the shard routing a message, a timer, the
// transfer pool's completion), instead of a new goroutine per scheduling:
// rooms of a shard are handled in the shard's goroutine, no goroutine is
// started and no stack grown per room message. A room's Receive never blocks
// (Transfers.Post and Notifier.Notify must not), so a sender is held only for
// the room's own work; a panic is still the room's (its mailbox recovers it).
var roomDispatcher = actor.NewSynchronizedDispatcher(300)

func newShard(e *Engine, capacity int, lim limits, dir *directory) *shard {
	return &shard{eng: e, capacity: capacity, lim: lim, rooms: map[uint64]*live{}, peers: map[string]*peerCharge{},
		tombs: map[uint64]tombEntry{}, dir: dir, bounces: map[uint64]int64{}, parked: map[uint64][]*envelope{},
		idleMax: idleCap(e.cfg.Shards), poisoned: map[string]struct{}{}}
}

// Receive handles one message. A panic anywhere in it is recovered: routing a
// room's message is guarded per room (route), so a panic fails only that room;
// anything else is logged and its asker answered (fault). A shard never dies,
// so its rooms and tombstones are never forgotten.
func (s *shard) Receive(ctx actor.Context) {
	defer func() {
		if r := recover(); r != nil {
			s.fault(ctx, r)
		}
	}()
	switch m := ctx.Message().(type) {
	case *actor.Started:
		s.self = ctx.Self()
		s.props = actor.PropsFromProducer(func() actor.Actor {
			a := s.next
			s.next = nil
			return a
		}, actor.WithMailbox(mailbox.Unbounded()), actor.WithDispatcher(roomDispatcher))
		s.armSweep()
	case *envelope:
		// Read before routing: a room actor runs on this goroutine (see
		// roomDispatcher), and one that retired marks m bounced as it sends
		// it back.
		bounced := m.bounced
		s.route(ctx, m) // recovers a panic itself: the count below is kept
		if bounced {
			s.bounceRouted(ctx, m.room)
		} else {
			s.dir.routed.Add(1)
		}
	case *envBatch:
		for i := range m.envs {
			s.route(ctx, &m.envs[i])
		}
		s.dir.routed.Add(1)
	case *pollBatch:
		for i, r := range m.rooms {
			if !m.sync && s.answerLive(r, m.answers, m.index[i]) {
				continue
			}
			s.route(ctx, &envelope{room: r, msg: room.Poll{}, answers: m.answers, index: m.index[i], sync: m.sync})
		}
	case *broadcast:
		for id, lr := range s.rooms {
			lr.sent.Add(1)
			ctx.Send(lr.pid, &envelope{room: id, msg: m.msg})
		}
		s.dir.routed.Add(1)
	case *actor.Terminated:
		s.onTerminated(m.Who)
		s.roomsStopped()
	case *stopRooms:
		s.stopRooms(ctx)
		s.closing = m.reply
		s.roomsStopped()
	case *liveReq:
		m.reply <- s.live()
	case *abandonReq:
		s.dumped = 0
		for _, lr := range s.rooms {
			ctx.Send(lr.pid, &abandonMsg{reply: m.reply})
			s.dumped++
		}
		m.reply <- dumpCount(s.dumped)
	case *retired:
		s.onRetired(ctx, m)
	case sweep:
		s.expire(s.eng.cfg.Clock.Now())
		s.armSweep()
	case *statsReq:
		m.reply <- Stats{LiveRooms: len(s.rooms), Tombstones: len(s.tombs), RoomCap: s.lim.rooms,
			RefusedRoomCap: s.refusedCap, RefusedPeerShare: s.refusedShare}
	case *dumpReq:
		s.dumped = 0
		for _, lr := range s.rooms {
			if s.dumped == m.limit {
				break
			}
			ctx.Send(lr.pid, &describe{reply: m.reply})
			s.dumped++
		}
		m.reply <- dumpCount(s.dumped)
	case *actor.Stopping:
		if s.timer != nil {
			s.timer.Stop()
		}
		s.stopRooms(ctx) // Close stopped them already, unless it gave up waiting
	}
}

// stopRooms stops every live room's actor. Room actors are not protoactor
// children of their shard (see routeOne), so stopping the shard would not
// stop them.
func (s *shard) stopRooms(ctx actor.Context) {
	s.stopping = true
	for id, lr := range s.rooms {
		ctx.Stop(lr.pid)
		s.forget(id, lr) // stopped by the engine's Close: no death
	}
	for _, pid := range s.idle {
		ctx.Stop(pid)
	}
	s.idle = nil
}

// roomsStopped answers Close's stopRooms once no room actor of the shard is
// left.
func (s *shard) roomsStopped() {
	if s.closing != nil && s.actors == 0 {
		s.closing <- struct{}{}
		s.closing = nil
	}
}

// fault handles a panic recovered from Receive outside route: it is logged,
// and a request that waits for an answer gets one.
func (s *shard) fault(ctx actor.Context, r any) {
	s.eng.cfg.Logger.Error("directory shard panicked", "message", fmt.Sprintf("%T", ctx.Message()), "panic", fmt.Sprint(r))
	switch m := ctx.Message().(type) {
	case *statsReq:
		m.reply <- Stats{LiveRooms: len(s.rooms), Tombstones: len(s.tombs), RoomCap: s.lim.rooms,
			RefusedRoomCap: s.refusedCap, RefusedPeerShare: s.refusedShare}
	case *dumpReq:
		m.reply <- dumpCount(s.dumped)
	case *abandonReq:
		m.reply <- dumpCount(s.dumped)
	case *liveReq:
		m.reply <- LiveRooms{}
	case *stopRooms:
		m.reply <- struct{}{}
	case sweep:
		s.armSweep()
	}
}

// live counts the shard's live rooms by the status their view answers.
func (s *shard) live() LiveRooms {
	var l LiveRooms
	oldest := int64(0)
	for _, lr := range s.rooms {
		_, r, _ := lr.load()
		if int(r.Status) < len(l.ByStatus) {
			l.ByStatus[r.Status]++
		}
		if !r.Status.Terminal() {
			if l.NonTerminal == 0 || lr.born < oldest {
				oldest = lr.born
			}
			l.NonTerminal++
		}
	}
	if l.NonTerminal > 0 {
		l.OldestNonTerminal = time.Unix(0, oldest)
	}
	return l
}

// route delivers a room message to the room's actor, or steps it through the
// room's tombstone, or creates the room if the message may name a new one. A
// panic while doing so (the tombstone's step, an Observer or Notifier call)
// fails that room and touches nothing else (routeFault).
func (s *shard) route(ctx actor.Context, env *envelope) {
	s.creating, s.announced, s.rec = false, false, nil
	defer func() {
		if r := recover(); r != nil {
			s.routeFault(ctx, env, r)
		}
	}()
	s.routeOne(ctx, env)
}

// routeFault fails the room whose message panicked in route. A live room is
// sent Fail(internal_error), and then the message itself if it is a poll (so
// the room answers it after failing). A tombstone is kept as it is (its room's
// story is over; a late message cannot change it), and a poll answered from
// it. A room that was being created or revived is kept as a Failed
// internal_error tombstone, its story closed if RoomCreated was told.
func (s *shard) routeFault(ctx actor.Context, env *envelope, r any) {
	s.eng.cfg.Logger.Error("routing a room message panicked; failing the room", "room", env.room, "panic", fmt.Sprint(r))
	if lr, ok := s.rooms[env.room]; ok {
		lr.sent.Add(1)
		ctx.Send(lr.pid, &envelope{room: env.room, msg: room.Fail{Reason: kv.ReasonInternalError}})
		if env.answers != nil {
			lr.sent.Add(1)
			env.sync = true
			ctx.Send(lr.pid, env)
		}
		return
	}
	if te, ok := s.tombs[env.room]; ok && !s.creating {
		answer(env, tombReply(te.t))
		return
	}
	_, open := env.msg.(room.Open)
	t := room.Tombstone{Room: env.room, Status: kv.StatusFailed, Reason: kv.ReasonInternalError, Opened: open}
	if te, ok := s.tombs[env.room]; ok {
		t.Opened = t.Opened || te.t.Opened
	}
	if s.announced {
		failedStory(s.rec, t)
	}
	s.keepTombstone(t)
	answer(env, tombReply(t))
}

// onTerminated hears that a room actor stopped (the shard is its parent:
// protoactor tells the parent). The shard stops an actor itself only once
// its room retired (poisoned) or when the engine closes (stopRooms), so any
// other is a room actor that died: its room becomes a Failed internal_error
// tombstone at once, which answers its polls (those already in the dead
// actor's mailbox end by Engine's poll deadline).
func (s *shard) onTerminated(who *actor.PID) {
	if !isRoomActor(who) {
		return
	}
	s.actors--
	if _, ok := s.poisoned[who.Id]; ok {
		delete(s.poisoned, who.Id) // retired first, as every room normally does
		return
	}
	if s.stopping {
		return // stopped by stopRooms, which forgot its rooms
	}
	// A death: rare enough for scans.
	if i := slices.IndexFunc(s.idle, who.Equal); i >= 0 {
		s.idle = slices.Delete(s.idle, i, i+1)
		return
	}
	id, lr, ok := s.roomOf(who)
	if !ok {
		return
	}
	s.eng.cfg.Logger.Error("room actor died; keeping a Failed tombstone", "room", id)
	s.forget(id, lr)
	t := room.Tombstone{Room: id, Status: kv.StatusFailed, Reason: kv.ReasonInternalError, Opened: lr.opened}
	if lr.hand() { // the dead actor's record is the shard's now
		failedStory(lr.rec, t)
	}
	s.keepTombstone(t)
}

// roomName names a shard's n-th room actor: "<shard>/r<n hex>". An actor
// serves rooms in turn, so its name says nothing of its room.
func roomName(shard string, n uint64) string {
	var b [48]byte
	out := append(b[:0], shard...)
	out = append(out, "/r"...)
	return string(strconv.AppendUint(out, n, 16))
}

// isRoomActor tells a room actor's PID (roomName) from a shard's.
func isRoomActor(pid *actor.PID) bool {
	name := pid.Id[strings.LastIndexByte(pid.Id, '/')+1:]
	if len(name) < 2 || name[0] != 'r' {
		return false
	}
	_, err := strconv.ParseUint(name[1:], 16, 64)
	return err == nil
}

// roomOf finds the live room that actor who serves. A room actor dies only
// when its panic handling panics too, so a scan of the shard's rooms here
// costs less than a map from actors to rooms kept for every room.
func (s *shard) roomOf(who *actor.PID) (uint64, *live, bool) {
	for id, lr := range s.rooms {
		if lr.pid.Equal(who) {
			return id, lr, true
		}
	}
	return 0, nil, false
}

// answerLive answers a poll of room id from its live room's view when the
// room has handled everything routed to it, as routeOne does for a poll
// envelope, without making one: most rooms of a batched poll are answered
// here. false: the poll goes the envelope's way (route).
func (s *shard) answerLive(id uint64, answers chan<- pollAnswer, index int) bool {
	if len(s.bounces) > 0 && s.bounces[id] > 0 {
		return false // messages bouncing off its retired actor come first
	}
	lr, ok := s.rooms[id]
	if !ok {
		return false
	}
	r, ok := lr.settled()
	if ok {
		answers <- pollAnswer{index: index, reply: r}
	}
	return ok
}

// settled is what a poll of the room answers, if the room has handled
// everything its shard routed to it (shard goroutine only: sent is the
// shard's).
func (lr *live) settled() (kv.Reply, bool) {
	seen, r, ok := lr.load()
	return r, ok && seen == lr.sent.Load()
}

func (s *shard) routeOne(ctx actor.Context, env *envelope) {
	if !env.bounced && len(s.bounces) > 0 && s.bounces[env.room] > 0 {
		// Earlier messages to this room are bouncing off its retired actor:
		// this one waits for them (bounceRouted), or it would overtake them
		// (a poll answered by the tombstone before a bounced Open revives
		// the room, a Send ignored by it).
		s.parked[env.room] = append(s.parked[env.room], env)
		return
	}
	if lr, ok := s.rooms[env.room]; ok {
		if _, poll := env.msg.(room.Poll); poll && !env.sync {
			if r, ok := lr.settled(); ok {
				answer(env, r)
				return
			}
		}
		if _, open := env.msg.(room.Open); open {
			lr.opened = true
		}
		lr.sent.Add(1)
		ctx.Send(lr.pid, env)
		return
	}
	var m *room.Machine
	created, revived := false, false
	if te, ok := s.tombs[env.room]; ok {
		m, revived = room.FromTombstone(&s.eng.cfg.Room, te.t), true
	} else if room.Creates(env.msg) {
		m, created = room.New(&s.eng.cfg.Room, env.room), true
	} else {
		s.unknownRoom(env)
		return
	}
	if h := s.eng.cfg.hooks.shardStep; h != nil {
		h(env.room, env.msg)
	}
	// Step is pure: a refused message leaves no trace of this step.
	fx := m.Step(env.msg)
	alive := !m.Retired()
	if alive {
		if why := s.lim.admit(env.msg, len(s.rooms), s.charged); why != admitted {
			s.refuse(env, why)
			return
		}
	}
	var rec RoomObserver
	var born time.Time // the room's creation (one reading for its record and its entry)
	if created || fx.Revived || alive {
		born = s.eng.cfg.Clock.Now()
	}
	failTrace := false
	if created || fx.Revived {
		s.creating = true
		rec = s.eng.cfg.Observer.RoomCreated(env.room, born) // new, or a tombstone came back to life
		s.rec, s.announced = rec, true
		if env.trace != "" {
			failTrace = !traced(s.eng, rec, env)
		}
	}
	if alive {
		// The room is (again) alive: it gets an actor, which executes this
		// first step's effects once it runs. The machine and the record are
		// the actor's from the spawn on: what the shard needs of them is
		// taken before.
		_, open := env.msg.(room.Open)
		lr := &live{id: env.room, opened: open || m.Tombstone().Opened, born: born.UnixNano(), rec: rec}
		lr.store(0, fx.View)
		if revived { // a lookup less per new room: the maps are large
			delete(s.tombs, env.room)
		}
		lr.pid = s.roomActor(ctx)
		ctx.Send(lr.pid, &begin{m: m, lr: lr, fx: fx, env: env})
		if ti, ok := env.msg.(room.TransferInfo); ok {
			c := s.peers[ti.Agent]
			if c == nil {
				c = &peerCharge{agent: ti.Agent}
				s.peers[ti.Agent] = c
			}
			c.rooms++
			lr.peer = c
		}
		s.rooms[env.room] = lr
		s.dir.add(lr)
		if failTrace {
			lr.sent.Add(1)
			ctx.Send(lr.pid, &envelope{room: env.room, msg: room.Fail{Reason: kv.ReasonInternalError}})
		}
		return
	}
	// Still (or at once) a tombstone: nothing here can post or arm.
	observe(s.eng, rec, env.room, env.msg, fx)
	execStateless(s.eng, env, env.room, fx)
	s.keepTombstone(m.Tombstone())
}

// roomActor returns an idle room actor, or a new one. A new one is
// spawned with the shard as its parent (its failures and its Terminated
// come here) but not as a protoactor child: the child set is a map of
// two-string keys per actor (86 B, and two lookups on every spawn and
// stop). The shard stops its room actors itself (stopRooms) and counts them
// until they terminated.
func (s *shard) roomActor(ctx actor.Context) *actor.PID {
	if n := len(s.idle); n > 0 {
		pid := s.idle[n-1]
		s.idle[n-1] = nil
		s.idle = s.idle[:n-1]
		return pid
	}
	s.next = newRoomActor(s.eng)
	s.spawned++
	pid, err := actor.DefaultSpawner(s.eng.system, roomName(s.self.Id, s.spawned), s.props, ctx)
	if err != nil {
		panic(err) // names are unique per shard: not reached
	}
	s.actors++
	return pid
}

// traced gives an Open's traceparent to the room's record. A panicking
// Traceparent fails the room (internal_error) once the Open is handled: it
// reports false.
func traced(e *Engine, rec RoomObserver, env *envelope) bool {
	if p := recoverFrom(func() { rec.Traceparent(env.trace) }); p != nil {
		e.cfg.Logger.Error("observer panicked on a traceparent; failing the room", "room", env.room, "panic", fmt.Sprint(p))
		return false
	}
	return true
}

// refuse turns away a message that would make a room live beyond a cap: the
// room is not created (nor revived), the refusal is counted, and what is kept
// is a Failed room_cap tombstone, which the TTL and the tombstone cap bound.
// An Open's room answers polls Failed/room_cap (a later Open starts a new
// incarnation, admitted once rooms have freed up). A transfer info is stepped
// through that tombstone, so decode is told at once (KV_STATUS failure, as for
// any info that reaches a failed room) and frees its pages; the tombstone then
// fails the sender when the scheduler opens the room.
func (s *shard) refuse(env *envelope, why refusal) {
	if why == peerShare {
		s.refusedShare++
	} else {
		s.refusedCap++
	}
	obs := s.eng.cfg.Observer
	if ro, ok := obs.(RefusalObserver); ok {
		ro.RoomRefused(env.room, why == peerShare)
	}
	t := room.Tombstone{Room: env.room, Status: kv.StatusFailed, Reason: kv.ReasonRoomCap}
	if _, open := env.msg.(room.Open); open {
		// The scheduler's room: it gets a (short) story of its own.
		t.Opened = true
		rec := obs.RoomCreated(env.room, s.eng.cfg.Clock.Now())
		s.rec, s.announced = rec, true
		msg, fx := failedSteps(t)
		rec.Step(msg, fx[0])
		s.announced = false
		rec.Step(msg, fx[1])
		s.keepTombstone(t)
		return
	}
	m := room.FromTombstone(&s.eng.cfg.Room, t)
	fx := m.Step(env.msg)
	observe(s.eng, nil, env.room, env.msg, fx)
	execStateless(s.eng, env, env.room, fx)
	s.keepTombstone(t)
}

// unknownRoom answers a poll for a room nobody named with room.UnknownReply;
// anything else is counted and dropped.
func (s *shard) unknownRoom(env *envelope) {
	if _, ok := env.msg.(room.Poll); ok {
		answer(env, room.UnknownReply)
		return
	}
	s.eng.cfg.Observer.Ignored(env.room, env.msg)
}

func (s *shard) onRetired(ctx actor.Context, m *retired) {
	id := m.tomb.Room
	lr, ok := s.rooms[id]
	if !ok || !lr.pid.Equal(m.pid) {
		return
	}
	s.forget(id, lr)
	// Whatever was routed to the room before this point is still handled
	// by its actor, ahead of anything sent to the actor later: it bounces
	// back here, to the tombstone. Those envelopes are counted until they
	// are routed again (see directory.read). The actor then serves a later
	// room (its begin comes after them), or is poisoned (Poison, not Stop,
	// for the same order).
	if seen, _, _ := lr.load(); int32(lr.sent.Load()-seen) > 0 {
		n := int64(lr.sent.Load() - seen)
		s.bounces[id] += n
		s.dir.bouncing.Add(n)
	}
	if len(s.idle) < s.idleMax && !s.stopping {
		s.idle = append(s.idle, lr.pid)
	} else {
		s.poisoned[lr.pid.Id] = struct{}{}
		ctx.Poison(lr.pid)
	}
	s.keepTombstoneAt(m.tomb, m.at)
}

// bounceRouted counts out a bounced envelope of room id, routed again; after
// the room's last one, its parked envelopes are routed in order. (The
// directory's count drops last, so that a reader never sees none bouncing
// while a parked message is not yet routed.)
func (s *shard) bounceRouted(ctx actor.Context, id uint64) {
	if n := s.bounces[id] - 1; n > 0 {
		s.bounces[id] = n
	} else {
		delete(s.bounces, id)
		envs := s.parked[id]
		delete(s.parked, id)
		for _, env := range envs {
			s.route(ctx, env)
		}
	}
	s.dir.bouncing.Add(-1)
}

// charged is how many live rooms agent is charged in this shard.
func (s *shard) charged(agent string) int {
	if c := s.peers[agent]; c != nil {
		return c.rooms
	}
	return 0
}

// forget drops a live room, its directory entry and its charge to its
// decode agent.
func (s *shard) forget(id uint64, lr *live) {
	delete(s.rooms, id)
	s.dir.remove(lr)
	if c := lr.peer; c != nil {
		if c.rooms--; c.rooms <= 0 {
			delete(s.peers, c.agent)
		}
	}
}

// keepTombstone keeps t, retired now.
func (s *shard) keepTombstone(t room.Tombstone) { s.keepTombstoneAt(t, s.eng.cfg.Clock.Now()) }

// keepTombstoneAt keeps t, retired at now, for the TTL.
func (s *shard) keepTombstoneAt(t room.Tombstone, now time.Time) {
	exp := now.Add(s.eng.cfg.TombstoneTTL)
	if len(s.tombs) >= s.capacity {
		if _, ok := s.tombs[t.Room]; !ok {
			s.evictOldest()
		}
	}
	s.tombs[t.Room] = tombEntry{t: t, expires: exp}
	s.queue = append(s.queue, tombRef{room: t.Room, expires: exp})
}

// expire drops tombstones whose TTL passed. Queue entries whose tombstone was
// revived or refreshed since are skipped (their expiry no longer matches).
func (s *shard) expire(now time.Time) {
	for s.head < len(s.queue) && !s.queue[s.head].expires.After(now) {
		ref := s.queue[s.head]
		s.head++
		if te, ok := s.tombs[ref.room]; ok && te.expires.Equal(ref.expires) {
			delete(s.tombs, ref.room)
		}
	}
	s.compact()
}

func (s *shard) evictOldest() {
	for s.head < len(s.queue) {
		ref := s.queue[s.head]
		s.head++
		if te, ok := s.tombs[ref.room]; ok && te.expires.Equal(ref.expires) {
			delete(s.tombs, ref.room)
			obs := s.eng.cfg.Observer
			if p := recoverFrom(func() { obs.TombstoneEvicted(ref.room) }); p != nil {
				s.eng.cfg.Logger.Error("observer panicked on an evicted tombstone", "room", ref.room, "panic", fmt.Sprint(p))
			}
			return
		}
	}
}

// compact reclaims the consumed head of the queue once it is half of it.
func (s *shard) compact() {
	if s.head > 1024 && s.head*2 > len(s.queue) {
		s.queue = append(s.queue[:0], s.queue[s.head:]...)
		s.head = 0
	}
}

func (s *shard) armSweep() {
	every := s.eng.cfg.TombstoneTTL / 8
	if every < time.Second {
		every = time.Second
	}
	self, root := s.self, s.eng.system.Root
	s.timer = s.eng.cfg.Clock.AfterFunc(every, func() { root.Send(self, sweep{}) })
}

func tombReply(t room.Tombstone) kv.Reply { return kv.Reply{Status: t.Status, Reason: t.Reason} }
