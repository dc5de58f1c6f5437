package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
)

// shard is one directory actor: it routes room messages to room actors, spawns
// a room on the first message that names it, and keeps the tombstones of
// retired rooms. It owns its maps; nothing else touches them.
type shard struct {
	eng      *Engine
	capacity int // tombstones kept before the oldest is evicted

	rooms map[uint64]*live
	tombs map[uint64]tombEntry
	queue []tombRef // insertion order == expiry order (one TTL for all)
	head  int

	self  *actor.PID
	timer clock.Timer
}

// live is a room with an actor: its PID, how many messages the shard routed
// to it, and the room's last report of how many it handled and what a poll
// answers (see view).
type live struct {
	pid        *actor.PID
	sent, seen uint32
	reply      room.Reply
}

type tombEntry struct {
	t       room.Tombstone
	expires time.Time
}

type tombRef struct {
	room    uint64
	expires time.Time
}

func newShard(e *Engine, capacity int) *shard {
	return &shard{eng: e, capacity: capacity, rooms: map[uint64]*live{}, tombs: map[uint64]tombEntry{}}
}

func (s *shard) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		s.self = ctx.Self()
		s.armSweep()
	case *envelope:
		s.route(ctx, m)
	case *pollBatch:
		for i, r := range m.rooms {
			s.route(ctx, &envelope{room: r, msg: room.Poll{}, answers: m.answers, index: m.index[i], sync: m.sync})
		}
	case *broadcast:
		for id, lr := range s.rooms {
			lr.sent++
			ctx.Send(lr.pid, &envelope{room: id, msg: m.msg})
		}
	case *view:
		if lr, ok := s.rooms[m.room]; ok && lr.pid.Equal(m.pid) {
			lr.seen, lr.reply = m.seen, m.reply
		}
	case *retired:
		s.onRetired(ctx, m)
	case sweep:
		s.expire(s.eng.cfg.Clock.Now())
		s.armSweep()
	case *statsReq:
		m.reply <- Stats{LiveRooms: len(s.rooms), Tombstones: len(s.tombs)}
	case *dumpReq:
		n := 0
		for _, lr := range s.rooms {
			if n == m.limit {
				break
			}
			ctx.Send(lr.pid, &describe{reply: m.reply})
			n++
		}
		m.reply <- dumpCount(n)
	case *actor.Stopping:
		if s.timer != nil {
			s.timer.Stop()
		}
	}
}

// route delivers a room message to the room's actor, or steps it through the
// room's tombstone, or creates the room if the message may name a new one.
func (s *shard) route(ctx actor.Context, env *envelope) {
	if lr, ok := s.rooms[env.room]; ok {
		if _, poll := env.msg.(room.Poll); poll && !env.sync && lr.seen == lr.sent {
			answer(env, lr.reply) // the room has handled everything routed to it
			return
		}
		lr.sent++
		ctx.Send(lr.pid, env)
		return
	}
	var m *room.Machine
	if te, ok := s.tombs[env.room]; ok {
		m = room.FromTombstone(&s.eng.cfg.Room, te.t)
	} else if room.Creates(env.msg) {
		m = room.New(&s.eng.cfg.Room, env.room)
		s.eng.cfg.Observer.RoomCreated(env.room)
	} else {
		s.unknownRoom(env)
		return
	}
	fx := m.Step(env.msg)
	if fx.Revived {
		s.eng.cfg.Observer.RoomCreated(env.room) // a tombstone came back to life
	}
	if !m.Retired() {
		// The room is (again) alive: it gets an actor, which executes this
		// first step's effects once it runs.
		delete(s.tombs, env.room)
		pid := ctx.Spawn(actor.PropsFromProducer(func() actor.Actor {
			return newRoomActor(s.eng, m, fx, env, ctx.Self())
		}))
		s.rooms[env.room] = &live{pid: pid, reply: m.Reply()}
		return
	}
	// Still (or at once) a tombstone: nothing here can post or arm.
	execStateless(s.eng, env, m, fx)
	s.keepTombstone(m.Tombstone())
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
	delete(s.rooms, id)
	s.keepTombstone(m.tomb)
	// Poison, not Stop: whatever was routed to the room before this point is
	// still handled (bounced back here, to the tombstone) before it stops.
	ctx.Poison(lr.pid)
}

func (s *shard) keepTombstone(t room.Tombstone) {
	now := s.eng.cfg.Clock.Now()
	exp := now.Add(s.eng.cfg.TombstoneTTL)
	if _, ok := s.tombs[t.Room]; !ok && len(s.tombs) >= s.capacity {
		s.evictOldest()
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
			s.eng.cfg.Observer.TombstoneEvicted(ref.room)
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
