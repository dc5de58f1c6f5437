package actors

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
)

// roomActor owns one room.Machine and executes its effects: it posts transfers,
// answers polls, sends notices, arms the one deadline and retires. It holds no
// rule of its own.
type roomActor struct {
	eng   *Engine
	m     *room.Machine
	shard *actor.PID
	self  *actor.PID
	born  time.Time
	timer clock.Timer
	gone  bool // retired: routed messages go back to the shard

	first    room.Effects // the shard stepped the first message
	firstEnv *envelope

	recv     uint32     // envelopes handled (the shard counts what it routed)
	reported room.Reply // last view sent to the shard
	repRecv  uint32

	pendingDone *room.XferDone // a completion being observed, not yet stepped
	slot        statusSlot     // the status-table slot it publishes to (statusslot.go)
}

func newRoomActor(e *Engine, m *room.Machine, first room.Effects, env *envelope, shard *actor.PID) *roomActor {
	return &roomActor{eng: e, m: m, shard: shard, first: first, firstEnv: env, born: e.cfg.Clock.Now()}
}

// Receive handles one message. A panic anywhere in it (the room's rules, an
// effect, a callback: Observer, Notifier, Transfers) is recovered here and
// fails this room with internal_error (see fault); nothing else is touched.
func (a *roomActor) Receive(ctx actor.Context) {
	defer func() {
		if r := recover(); r != nil {
			a.fault(ctx, r)
		}
	}()
	if h := a.eng.cfg.hooks.roomMsg; h != nil {
		h(a.m.Room(), ctx.Message())
	}
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.self = ctx.Self()
		a.reported = a.m.Reply() // the shard took this view when it spawned us
		fx, env := a.first, a.firstEnv
		a.first = room.Effects{}
		a.exec(ctx, env, fx)
		a.firstEnv = nil
		a.report(ctx)
	case *envelope:
		if a.gone {
			// Retired while this was queued: the shard, which has seen our
			// retirement by now, routes it to the tombstone.
			ctx.Send(a.shard, msg)
			return
		}
		a.recv++
		a.exec(ctx, msg, a.m.Step(msg.msg))
		a.report(ctx)
	case xferDone:
		done := room.XferDone{Seq: msg.seq, Fail: msg.fail, Signal: msg.signal}
		a.pendingDone = &done // stepped by fault if the observer panics
		a.eng.cfg.Observer.TransferDone(a.m.Room(), msg.seq, msg.fail)
		a.pendingDone = nil
		a.stepDirect(ctx, done)
		a.report(ctx)
	case deadline:
		a.stepDirect(ctx, room.Deadline{Gen: msg.gen})
		a.report(ctx)
	case *describe:
		st, why := a.m.Status()
		msg.reply <- RoomInfo{Room: a.m.Room(), Status: st.String(), Reason: why.String(), Phase: a.m.Phase(),
			Inflight: a.m.Inflight(), Agents: a.m.Agents(), Age: a.eng.cfg.Clock.Now().Sub(a.born)}
	case *actor.Stopping:
		if a.timer != nil {
			a.timer.Stop()
		}
	}
}

// report tells the shard what a poll answers now when that, or the count of
// handled envelopes, changed; the shard answers polls from it (see view).
func (a *roomActor) report(ctx actor.Context) {
	a.slot.publish(a.eng, a.m)
	if a.gone {
		return
	}
	r := a.m.Reply()
	if r == a.reported && a.recv == a.repRecv {
		return
	}
	a.reported, a.repRecv = r, a.recv
	ctx.Send(a.shard, &view{pid: a.self, room: a.m.Room(), seen: a.recv, reply: r})
}

func (a *roomActor) stepDirect(ctx actor.Context, msg room.Msg) {
	if a.gone {
		a.eng.cfg.Observer.Ignored(a.m.Room(), msg)
		return
	}
	a.exec(ctx, nil, a.m.Step(msg))
}

// fault handles a panic recovered from Receive: the room fails with
// internal_error (stepped through its rules, so decode is told and writes in
// flight drain as for any failure); a completion whose observer call panicked
// is still stepped. If failing the room panics too, the machine is taken as
// broken and only a Failed internal_error tombstone is kept (retired at once).
// Whatever the message was, its asker is answered: a poll with the room's
// status, a describe with its info. If even that panics, the panic escapes:
// the shard's supervisor stops this actor and the shard, which watches its
// rooms, keeps the Failed tombstone (shard.onTerminated).
func (a *roomActor) fault(ctx actor.Context, r any) {
	id := a.m.Room()
	a.eng.cfg.Logger.Error("room handler panicked; failing the room", "room", id, "panic", fmt.Sprint(r))
	if h := a.eng.cfg.hooks.roomFault; h != nil {
		h(id)
	}
	env, _ := ctx.Message().(*envelope)
	if _, started := ctx.Message().(*actor.Started); started {
		env = a.firstEnv
		a.first, a.firstEnv = room.Effects{}, nil
	}
	if !a.gone {
		if p := recoverFrom(func() {
			a.exec(ctx, nil, a.m.Step(room.Fail{Reason: room.ReasonInternalError}))
			if d := a.pendingDone; d != nil {
				a.pendingDone = nil
				a.stepDirect(ctx, *d)
			}
			if a.m.Retired() && !a.gone {
				a.retire(ctx) // it retired in the step that panicked
			}
		}); p != nil {
			// The machine itself is broken: keep only a Failed tombstone.
			a.eng.cfg.Logger.Error("failing the room panicked; keeping a Failed tombstone", "room", id, "panic", fmt.Sprint(p))
			a.pendingDone = nil
			a.m = room.FromTombstone(&a.eng.cfg.Room, room.Tombstone{Room: id, Status: room.Failed, Reason: room.ReasonInternalError, Opened: true})
			obs := a.eng.cfg.Observer
			recoverFrom(func() { obs.StatusChanged(id, room.Failed, room.ReasonInternalError) })
			recoverFrom(func() { obs.RoomRetired(a.m.Tombstone()) })
			a.retire(ctx)
		}
	}
	st, why := a.m.Status()
	if env != nil && env.answers != nil {
		answer(env, room.Reply{Status: st, Reason: why})
	}
	if d, ok := ctx.Message().(*describe); ok {
		d.reply <- RoomInfo{Room: id, Status: st.String(), Reason: why.String(), Phase: "fault"}
	}
	if !a.gone {
		a.report(ctx)
	}
}

// recoverFrom runs f and returns what it panicked with (nil if it returned).
func recoverFrom(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}

func (a *roomActor) exec(ctx actor.Context, env *envelope, fx room.Effects) {
	obs := a.eng.cfg.Observer
	for i := range fx.Posts {
		t := fx.Posts[i]
		obs.Posted(&t)
		self, root, seq := a.self, a.eng.system.Root, t.Seq
		a.eng.cfg.Transfers.Post(t, func(fail room.Reason, signal [][]byte) {
			root.Send(self, xferDone{seq: seq, fail: fail, signal: signal})
		})
	}
	execStateless(a.eng, env, a.m, fx)
	if fx.Arm.Kind != room.NoDeadline {
		if a.timer != nil {
			a.timer.Stop()
		}
		self, root, gen := a.self, a.eng.system.Root, fx.Arm.Gen
		a.timer = a.eng.cfg.Clock.AfterFunc(fx.Arm.After, func() { root.Send(self, deadline{gen: gen}) })
	}
	if fx.Retire {
		a.retire(ctx)
	}
}

func (a *roomActor) retire(ctx actor.Context) {
	if a.timer != nil {
		a.timer.Stop()
	}
	a.gone = true
	ctx.Send(a.shard, &retired{tomb: a.m.Tombstone(), pid: a.self})
}

// execStateless runs the effects that need neither an actor nor a timer; the
// shard uses it for rooms that are only a tombstone.
func execStateless(e *Engine, env *envelope, m *room.Machine, fx room.Effects) {
	id := m.Room()
	if fx.Published {
		e.cfg.Observer.StatusChanged(id, fx.Status, fx.Reason)
	}
	if fx.Reply != nil && env != nil {
		answer(env, *fx.Reply)
	}
	for _, n := range fx.Notices {
		e.cfg.Notifier.Notify(id, n)
	}
	if fx.Ignored {
		var msg room.Msg
		if env != nil {
			msg = env.msg
		}
		e.cfg.Observer.Ignored(id, msg)
	}
	if fx.Retire {
		e.cfg.Observer.RoomRetired(m.Tombstone())
	}
}

func answer(env *envelope, r room.Reply) {
	if env.answers != nil {
		env.answers <- pollAnswer{index: env.index, reply: r}
	}
}
