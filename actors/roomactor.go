package actors

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// roomActor owns one room.Machine and executes its effects: it posts transfers,
// answers polls, sends notices, arms the one deadline and retires. It holds no
// rule of its own. It also owns the room's Observer record (rec) until it
// hands it over (Retired or Abandoned).
//
// An actor serves one room at a time and, once that room retired, may serve
// a later one of its shard (begin): spawning and stopping an actor per room
// cost a sixth of a room's life in protoactor's registry, contexts and
// system messages. What can still arrive for the earlier room is told apart:
// envelopes routed before it retired bounce back to the shard (gone) ahead
// of the next begin; a completion names its room's entry (postDone.lr); a
// stale timer firing is dropped by fired.
//
// It is kept small (a live room's heap is mostly its actor, its machine and
// protoactor's process): what only a posting room needs is in posts.
type roomActor struct {
	eng  *Engine
	m    *room.Machine
	lr   *live // its shard's entry: the actor writes the view, and uses the record (lr.rec), in it
	self *actor.PID

	// The one deadline the room wants (Effects.Arm): Deadline{wantGen} at
	// wantAt. The timer is armed at timerAt <= wantAt and left alone when
	// the room moves its deadline later (it re-arms for the rest when it
	// fires); only an earlier deadline replaces it. ring is the timer's
	// function (made once).
	timer   clock.Timer
	timerAt int64 // UnixNano on the engine's clock
	wantAt  int64
	ring    func()

	posts *posting   // once the room posted a transfer
	slot  statusSlot // the status-table slot it publishes to (statusslot.go)

	// The clock as this step reads it (Now): read once per message. Its
	// record shares it (RoomObserver.BindSteps), bound as the room begins.
	step StepClock

	recv    uint32 // envelopes handled (the shard counts what it routed)
	wantGen uint32
	wanted  bool
	gone    bool // retired, or no room yet: routed messages go back to the shard
}

// Now is the engine's clock, read once per message the actor handles
// (a.step, which Receive begins and ends). Reading the wall clock costs 20–40 ns,
// and a room's step may arm a deadline, and its record time a status
// change, a post and a completion, all at one moment.
func (a *roomActor) Now() time.Time { return a.step.Now() }

// posting is a room actor's part for its transfers. Completions that came
// inside Transfers.Post (an instant transfer layer) wait in syncDone and are
// stepped once the step that posted them is done, without a trip through the
// mailbox; spare is a postDone to reuse.
type posting struct {
	syncDone []xferDone
	next     int // syncDone[:next] were taken (drainSync)
	spare    *postDone
}

// begin hands an actor with no room (new, or its room retired) the room the
// shard created (or revived) and stepped the first message of: its machine,
// its shard entry and that first step's effects, which the actor executes.
type begin struct {
	m   *room.Machine
	lr  *live
	fx  room.Effects
	env *envelope
}

func newRoomActor(e *Engine) *roomActor {
	return &roomActor{eng: e, step: StepClock{clk: e.cfg.Clock}, gone: true}
}

// start makes the actor b's room's: everything of an earlier room is
// dropped (its timer was stopped when it retired), then the first step is
// executed.
func (a *roomActor) start(ctx actor.Context, b *begin) {
	*a = roomActor{eng: a.eng, self: a.self, ring: a.ring, step: a.step, m: b.m, lr: b.lr}
	a.bindSteps()
	a.exec(ctx, b.env, b.fx)
	a.drainSync(ctx)
}

// Receive handles one message. A panic anywhere in it (the room's rules, an
// effect, a callback: Observer, Notifier, Transfers) is recovered here and
// fails this room with internal_error (see fault); nothing else is touched.
func (a *roomActor) Receive(ctx actor.Context) {
	a.step.Begin()
	defer a.step.End() // even if fault panics too
	defer func() {
		if r := recover(); r != nil {
			a.fault(ctx, r)
		}
	}()
	if b, ok := ctx.Message().(*begin); ok {
		a.start(ctx, b)
		return
	}
	if h := a.eng.cfg.hooks.roomMsg; h != nil && a.m != nil {
		h(a.m.Room(), ctx.Message())
	}
	switch msg := ctx.Message().(type) {
	case *envelope:
		if a.gone {
			// Retired while this was queued: the shard, which has seen our
			// retirement by now, routes it to the tombstone.
			msg.bounced = true
			ctx.Send(a.eng.shardFor(msg.room), msg)
			return
		}
		a.recv++
		traceOK := a.see(msg)
		a.exec(ctx, msg, a.m.Step(msg.msg))
		if !traceOK {
			a.stepDirect(ctx, room.Fail{Reason: kv.ReasonInternalError})
		}
		a.drainSync(ctx)
	case *postDone:
		done := xferDone{seq: msg.seq, fail: msg.fail, signal: msg.signal}
		msg.signal = nil
		if msg.lr != a.lr {
			// An earlier room's, which retired (at its drain deadline)
			// after its done function looked.
			lateDone(a.eng, msg.lr.id, done.seq, done.fail)
			a.eng.cfg.Observer.Ignored(msg.lr.id, room.XferDone{Seq: done.seq, Fail: done.fail})
			return
		}
		if a.posts.spare == nil {
			a.posts.spare = msg // its done function has returned: reusable
		}
		a.complete(ctx, done)
		a.drainSync(ctx)
	case deadline:
		if !a.fired() {
			return
		}
		a.stepDirect(ctx, room.Deadline{Gen: a.wantGen})
		a.drainSync(ctx)
	case *actor.Started:
		a.self = ctx.Self()
	case *describe:
		st, why := a.m.Status()
		msg.reply <- RoomInfo{Room: a.m.Room(), Status: st.String(), Reason: why.String(), Phase: a.m.Phase(),
			Inflight: a.m.Inflight(), Agents: a.m.Agents(), Age: a.Now().Sub(time.Unix(0, a.lr.born))}
	case *abandonMsg:
		a.abandon()
		msg.reply <- abandoned{}
	case *actor.Stopping:
		a.stopTimer()
		a.abandon()
	}
}

// bindSteps hands the room's record the actor's step clock, once: as the
// room begins, before any callback of its first step. A panic there fails
// the room (Receive recovers it).
func (a *roomActor) bindSteps() {
	if a.lr.flags.Load()&viewHanded == 0 {
		a.lr.rec.BindSteps(&a.step)
	}
}

// see shows the record an Open's traceparent before the room handles the
// Open. A panicking Traceparent fails the room once the Open is handled: see
// reports false.
func (a *roomActor) see(env *envelope) bool {
	if _, open := env.msg.(room.Open); open && env.trace != "" {
		return traced(a.eng, a.lr.rec, env)
	}
	return true
}

// abandon hands the record over while the room is live (the engine or the
// observer is closing); the room goes on unobserved.
func (a *roomActor) abandon() {
	if a.gone || !a.lr.hand() {
		return
	}
	rec := a.lr.rec
	a.lr.rec = nopRoom{} // the shard reads it only if it handed the record first
	rec.Abandoned()
}

// out hands one step's effects to what follows the room from outside, before
// any of them is executed (nothing is posted, told or answered yet): the
// directory view its shard answers polls from and the scheduler's
// status-table slot get the step's poll answer (fx.View), and the room's
// Observer record the whole step (RoomObserver.Step; the record of a
// retiring room is handed over with it). msg is the message stepped, nil
// for a step of the actor's own (a deadline, a completion, a failure). It
// returns what the record panicked with, if it did (exec).
func (a *roomActor) out(msg room.Msg, fx *room.Effects) (recPanic any) {
	a.view(fx.View)
	_, open := msg.(room.Open)
	a.slot.publish(a.eng, a.m.Room(), open, fx.View)
	rec := a.lr.rec
	if fx.Retire && !a.lr.hand() {
		rec = nopRoom{} // abandoned already: no longer the room's
	}
	defer func() { recPanic = recover() }()
	observe(a.eng, rec, a.m.Room(), msg, *fx)
	return nil
}

// view stores what a poll answers now (r), and how many routed messages the
// room handled, for its shard (see view).
func (a *roomActor) view(r kv.Reply) {
	if a.gone {
		return
	}
	if _, old, _ := a.lr.load(); packView(a.recv, r) != a.lr.state.Load() || r.PrefixLen != old.PrefixLen {
		a.lr.store(a.recv, r)
	}
}

func (a *roomActor) stepDirect(ctx actor.Context, msg room.Msg) {
	if a.gone {
		a.eng.cfg.Observer.Ignored(a.m.Room(), msg)
		return
	}
	a.exec(ctx, nil, a.m.Step(msg))
}

// complete observes a transfer's completion and steps it.
func (a *roomActor) complete(ctx actor.Context, d xferDone) {
	done := room.XferDone{Seq: d.seq, Fail: d.fail, Signal: d.signal}
	if a.gone {
		lateDone(a.eng, a.m.Room(), d.seq, d.fail)
		a.eng.cfg.Observer.Ignored(a.m.Room(), done)
		return
	}
	a.exec(ctx, nil, a.m.Step(done))
}

// lateDone tells the Observer of a completion that came after its room
// retired; a panic there is logged (the room's story is over).
func lateDone(e *Engine, id uint64, seq uint32, fail kv.Reason) {
	if p := recoverFrom(func() { e.cfg.Observer.LateTransferDone(id, seq, fail) }); p != nil {
		e.cfg.Logger.Error("observer panicked on a late completion", "room", id, "panic", fmt.Sprint(p))
	}
}

// drainSync steps the completions that came inside Post, in order (stepping
// one may post, and complete, more).
func (a *roomActor) drainSync(ctx actor.Context) {
	p := a.posts
	if p == nil {
		return
	}
	// next counts the completions taken, so that a drain that resumes after
	// a panic (fault drains too) takes each completion once.
	for p.next < len(p.syncDone) {
		d := p.syncDone[p.next]
		p.syncDone[p.next] = xferDone{}
		p.next++
		a.complete(ctx, d)
	}
	p.syncDone, p.next = p.syncDone[:0], 0
}

// fault handles a panic recovered from Receive: the room fails with
// internal_error (stepped through its rules, so decode is told and writes in
// flight drain as for any failure; a step at which the room's record
// panicked was executed first, see exec). If failing the room panics too, the machine is taken as
// broken and only a Failed internal_error tombstone is kept (retired at once).
// Whatever the message was, its asker is answered: a poll with the room's
// status, a describe with its info. If even that panics, the panic escapes:
// the shard's supervisor stops this actor and the shard, which watches its
// rooms, keeps the Failed tombstone (shard.onTerminated).
func (a *roomActor) fault(ctx actor.Context, r any) {
	if a.self == nil { // it panicked before Started set it
		a.self = ctx.Self()
	}
	if a.m == nil { // no room yet: nothing to fail
		a.eng.cfg.Logger.Error("room actor panicked before its first room", "panic", fmt.Sprint(r))
		return
	}
	id := a.m.Room()
	a.eng.cfg.Logger.Error("room handler panicked; failing the room", "room", id, "panic", fmt.Sprint(r))
	if h := a.eng.cfg.hooks.roomFault; h != nil {
		h(id)
	}
	env, _ := ctx.Message().(*envelope)
	if b, ok := ctx.Message().(*begin); ok {
		env = b.env
	}
	if !a.gone {
		if p := recoverFrom(func() {
			a.exec(ctx, nil, a.m.Step(room.Fail{Reason: kv.ReasonInternalError}))
			a.drainSync(ctx)
			if a.m.Retired() && !a.gone {
				a.retire(ctx) // it retired in the step that panicked
			}
		}); p != nil {
			// The machine itself is broken: keep only a Failed tombstone.
			a.eng.cfg.Logger.Error("failing the room panicked; keeping a Failed tombstone", "room", id, "panic", fmt.Sprint(p))
			if p := a.posts; p != nil {
				clear(p.syncDone)
				p.syncDone, p.next = p.syncDone[:0], 0
			}
			a.m = room.FromTombstone(&a.eng.cfg.Room, room.Tombstone{Room: id, Status: kv.StatusFailed, Reason: kv.ReasonInternalError, Opened: true})
			t := a.m.Tombstone()
			a.view(tombReply(t))
			a.slot.publish(a.eng, id, false, tombReply(t))
			if a.lr.hand() {
				failedStory(a.lr.rec, t)
			}
			a.retire(ctx)
		}
	}
	st, why := a.m.Status()
	if env != nil && env.answers != nil {
		answer(env, kv.Reply{Status: st, Reason: why})
	}
	if d, ok := ctx.Message().(*describe); ok {
		d.reply <- RoomInfo{Room: id, Status: st.String(), Reason: why.String(), Phase: "fault"}
	}
	if d, ok := ctx.Message().(*abandonMsg); ok {
		d.reply <- abandoned{}
	}
}

// recoverFrom runs f and returns what it panicked with (nil if it returned).
func recoverFrom(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}

// Withdrawer is optionally implemented by Transfers: Withdraw drops the
// transfers of a failed room it has not started yet (room.Effects.Withdraw),
// still reporting each one's completion; agents are the room's decode
// agents, so only what holds their transfers is asked.
type Withdrawer interface {
	Withdraw(roomID uint64, agents []string)
}

// exec hands a step's effects to out, then executes them (run). If the
// room's record panicked at the step, the effects still run (what the step
// posted is in flight; a room it concluded stays concluded, decode and the
// scheduler both told), all but the poll's answer, and then the panic goes
// on to fault, which fails the room and answers the poll.
func (a *roomActor) exec(ctx actor.Context, env *envelope, fx room.Effects) {
	var msg room.Msg
	if env != nil {
		msg = env.msg
	}
	if p := a.out(msg, &fx); p != nil {
		a.run(ctx, nil, &fx)
		panic(p)
	}
	a.run(ctx, env, &fx)
}

// run executes a step's effects: it posts the transfers, arms the deadline,
// retires, sends the notices and answers the poll (env: the message stepped,
// nil for a step of the actor's own).
func (a *roomActor) run(ctx actor.Context, env *envelope, fx *room.Effects) {
	for i := range fx.Posts {
		a.post(&fx.Posts[i])
	}
	if fx.Withdraw {
		if w, ok := a.eng.cfg.Transfers.(Withdrawer); ok {
			w.Withdraw(a.m.Room(), a.m.Agents())
		}
	}
	if fx.Arm.Kind != room.NoDeadline {
		a.arm(fx.Arm)
	}
	if fx.Retire {
		a.retire(ctx) // the shard hears it before anyone hears the poll answer
	}
	execStateless(a.eng, env, a.m.Room(), *fx)
}

// post hands one transfer to the transfer layer. A completion inside Post is
// queued for drainSync; a later one arrives as the postDone message.
func (a *roomActor) post(t *kv.Transfer) {
	if a.posts == nil {
		a.posts = &posting{}
	}
	p := a.posts
	pd := p.spare
	if pd == nil {
		pd = &postDone{lr: a.lr}
		e, self, root := a.eng, a.self, a.eng.system.Root
		pd.fn = func(fail kv.Reason, signal [][]byte) {
			pd.fail, pd.signal = fail, signal
			if pd.state.CompareAndSwap(postInCall, postSync) {
				return
			}
			if pd.lr.flags.Load()&viewRetired != 0 {
				// The room retired (at its drain deadline): its actor may be
				// gone, or serve another room, so the completion is counted
				// here.
				lateDone(e, pd.lr.id, pd.seq, fail)
				return
			}
			root.Send(self, pd)
		}
	}
	p.spare = nil
	pd.seq = t.Seq
	pd.state.Store(postInCall)
	a.eng.cfg.Transfers.Post(*t, pd.fn)
	if pd.state.CompareAndSwap(postInCall, postReturned) {
		return // done comes later, as a message
	}
	p.syncDone = append(p.syncDone, xferDone{seq: pd.seq, fail: pd.fail, signal: pd.signal})
	pd.signal = nil
	p.spare = pd
}

// arm makes the room's deadline Deadline{arm.Gen} after arm.After, replacing
// the one it had. The timer is replaced only if the new deadline is earlier.
func (a *roomActor) arm(arm room.Arm) {
	a.wantAt, a.wantGen, a.wanted = a.Now().Add(arm.After).UnixNano(), arm.Gen, true
	if a.timer != nil && a.wantAt >= a.timerAt {
		return
	}
	a.startTimer(arm.After)
}

func (a *roomActor) startTimer(after time.Duration) {
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.ring == nil {
		// Captures only a (the smallest closure); eng and self never change
		// once the actor started.
		a.ring = func() { a.eng.system.Root.Send(a.self, deadline{}) }
	}
	a.timerAt = a.Now().Add(after).UnixNano()
	a.timer = a.eng.cfg.Clock.AfterFunc(after, a.ring)
}

// fired handles a timer firing: it reports whether the wanted deadline has
// come (the room steps it). A deadline moved later re-arms the timer for the
// rest. A firing before the current timer's time is a replaced timer's (it
// could not be stopped in time) and is dropped; one at or after it is taken
// as the current timer's (it is due either way).
func (a *roomActor) fired() bool {
	now := a.Now().UnixNano()
	if a.timer == nil || now < a.timerAt {
		return false
	}
	a.timer.Stop()
	a.timer = nil
	if !a.wanted {
		return false
	}
	if rest := time.Duration(a.wantAt - now); rest > 0 {
		a.startTimer(rest)
		return false
	}
	a.wanted = false
	return true
}

func (a *roomActor) stopTimer() {
	if a.timer != nil {
		a.timer.Stop()
		a.timer = nil
	}
	a.wanted = false
}

func (a *roomActor) retire(ctx actor.Context) {
	a.stopTimer()
	a.gone = true
	a.lr.flags.Or(viewRetired)
	ctx.Send(a.eng.shardFor(a.m.Room()), &retired{tomb: a.m.Tombstone(), pid: a.self, at: a.Now()})
}

// execStateless runs the effects that need neither an actor nor a timer
// (the notices and the poll's answer) for room id; the shard uses it for
// rooms that are only a tombstone.
func execStateless(e *Engine, env *envelope, id uint64, fx room.Effects) {
	for _, n := range fx.Notices {
		e.cfg.Notifier.Notify(id, n)
	}
	if fx.Reply != nil && env != nil {
		answer(env, *fx.Reply)
	}
}

func answer(env *envelope, r kv.Reply) {
	if env.answers != nil {
		env.answers <- pollAnswer{index: env.index, reply: r}
	}
}
