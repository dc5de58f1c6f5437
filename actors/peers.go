package actors

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sort"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/peer"
	"github.com/kvxfer/kvxfer/internal/clock"
)

// Peers runs one actor per decode peer (agent name), each owning a
// peer.Machine: every input to a peer is a message in its mailbox, processed
// one at a time, and the actor only executes the machine's effects, handing
// each step's effects to one place (PeerExec.Exec). A directory actor routes
// by agent and spawns a peer's actor on its first message; it owns the only
// map, so there is no shared table and no lock here.
//
// Slow work (a NIXL load, a probe, a file write) never runs on a peer's
// actor: Exec starts it elsewhere and hands the result back through the
// report function, as a message like any other. Deadlines are the actor's own
// timers on the injected clock, armed and disarmed by the machine's effects,
// each firing as a message with its generation. A panic while a peer steps
// or executes fails that peer (peer.Drop: its rooms fail, its writes fail,
// it leaves NIXL), not the daemon.
type Peers struct {
	sys  *actor.ActorSystem
	dir  *actor.PID
	stop chan struct{}
	// pids is the directory's own map as it publishes it: an immutable
	// copy, replaced (never changed) when an actor is spawned, so that a
	// write can reach its peer without the directory's hop (SendWrite).
	pids atomic.Pointer[map[string]*actor.PID]
}

// PeerExec executes one peer's effects for the peer actors. Exec runs on the
// peer's actor: it must not block (it starts what is slow and reports its
// result through p.Report, from any goroutine).
type PeerExec interface {
	Exec(p *PeerCtx, fx peer.Effects)
}

// PeerCtx is what Exec knows of the peer whose step it executes.
type PeerCtx struct {
	Agent string
	// Msg is the message stepped; State the machine's state after it.
	Msg   peer.Msg
	State peer.State
	Inc   uint64
	// WritesVia: a write to the peer must go through its actor now (held or
	// confirmed; peer.Machine.WritesVia).
	WritesVia bool
	// Local is the executor's own state for this peer, kept by the actor
	// between steps (only ever touched on the peer's actor).
	Local any
	// Report hands a result back to the peer as a message (any goroutine).
	Report func(peer.Msg)
}

// PeersConfig configures Peers.
type PeersConfig struct {
	Rules peer.Config
	Exec  PeerExec
	Clock clock.Clock // nil: the wall clock
	// OnPanic, when set, hears of a panic on a peer's path (logs, counters).
	OnPanic func(agent string, r any)
	// Epoch, when set, numbers the incarnation a fence hold's restore starts
	// (peer.Deadline.Epoch), from the same counter as registrations.
	Epoch func() uint64
	// Orphan, when set, takes a message for an agent that has no actor (it
	// never registered), on the directory: a write must still end.
	Orphan func(agent string, msg peer.Msg)
}

// NewPeers starts the directory.
func NewPeers(cfg PeersConfig) *Peers {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	p := &Peers{sys: sys, stop: make(chan struct{})}
	p.pids.Store(&map[string]*actor.PID{})
	rules := cfg.Rules
	props := actor.PropsFromProducer(func() actor.Actor {
		return &peerDirectory{cfg: &cfg, rules: &rules, by: map[string]*actor.PID{}, quiet: map[string]bool{}, pub: &p.pids}
	}, actor.WithSupervisor(actor.NewOneForOneStrategy(0, 0, func(any) actor.Directive { return actor.StopDirective })))
	p.dir = sys.Root.Spawn(props)
	return p
}

// Send hands msg to agent's actor. A registration spawns the actor of an
// agent that has none; any other message for such an agent is dropped (it
// names a peer that never registered).
func (p *Peers) Send(agent string, msg peer.Msg) {
	p.sys.Root.Send(p.dir, &toPeer{agent: agent, msg: msg})
}

// SendWrite hands a write to agent's actor straight, without the
// directory's hop, once the agent has an actor (else through the directory,
// as Send). Writes only: another message sent this way could overtake one
// the directory still holds for the agent; writes of one agent may be
// stepped out of the order they were sent in only around its first
// registration, when nothing is held.
func (p *Peers) SendWrite(agent string, w peer.Write) {
	if pid := (*p.pids.Load())[agent]; pid != nil {
		p.sys.Root.Send(pid, &toPeer{agent: agent, msg: w})
		return
	}
	p.Send(agent, w)
}

// SendAt hands msg to every peer whose current incarnation registered from
// at (each actor decides by its own endpoint).
func (p *Peers) SendAt(at peer.Endpoint, msg peer.Msg) {
	p.sys.Root.Send(p.dir, &atPeers{at: at, msg: msg})
}

// Broadcast hands msg to every peer's actor and waits, bounded by ctx, until
// each stepped it and has no load in flight (a load out when msg arrived is
// back and handled).
func (p *Peers) Broadcast(ctx context.Context, msg peer.Msg) error {
	done := make(chan struct{})
	p.sys.Root.Send(p.dir, &peerBroadcast{msg: msg, done: done})
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("actors: peers not settled by the deadline: %w", ctx.Err())
	}
}

// List describes every peer, asking each actor (bounded by ctx).
func (p *Peers) List(ctx context.Context) ([]PeerState, error) {
	reply := make(chan chan describePeer, 1)
	p.sys.Root.Send(p.dir, &listPeers{reply: reply})
	var answers chan describePeer
	select {
	case answers = <-reply:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	n := cap(answers) // one answer per peer; buffered, so no actor waits on a caller gone
	out := make([]PeerState, 0, n)
	for range n {
		select {
		case a := <-answers:
			out = append(out, a.st)
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Agent < out[j].Agent })
	return out, nil
}

// PeerState is one peer as its actor sees it.
type PeerState struct {
	Agent    string
	State    string
	Inc      uint64
	Endpoint peer.Endpoint
	Held     int
	Queued   int
	// The probes: when the endpoint last answered, whether the last probe
	// went unanswered and what it found, whether one is out now.
	LastOK    time.Time
	Failing   bool
	LastProbe string
	Probing   bool
}

// Describe returns agent's state (ok false: no actor), asking its actor.
func (p *Peers) Describe(ctx context.Context, agent string) (PeerState, bool, error) {
	reply := make(chan describePeer, 1)
	p.sys.Root.Send(p.dir, &askPeer{agent: agent, reply: reply})
	select {
	case r := <-reply:
		return r.st, r.ok, nil
	case <-ctx.Done():
		return PeerState{}, false, ctx.Err()
	}
}

// Close shuts every peer down (peer.Shutdown) and waits, bounded by ctx,
// until each is quiet: closed, with every load it started back and released.
func (p *Peers) Close(ctx context.Context) error {
	done := make(chan struct{})
	p.sys.Root.Send(p.dir, &closePeers{done: done})
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("actors: peers not quiet by the deadline: %w", ctx.Err())
	}
	p.sys.Root.Stop(p.dir)
	return nil
}

// Messages of the directory and the peer actors.
type (
	toPeer struct {
		agent string
		msg   peer.Msg
	}
	askPeer struct {
		agent string
		reply chan describePeer
	}
	describePeer struct {
		st PeerState
		ok bool
	}
	closePeers    struct{ done chan struct{} }
	peerQuiet     struct{ agent string }
	peerBroadcast struct {
		msg  peer.Msg
		done chan struct{}
	}
	// settle asks a peer to answer once it has no load in flight.
	settle    struct{ done func() }
	listPeers struct{ reply chan chan describePeer }
	atPeers   struct {
		at  peer.Endpoint
		msg peer.Msg
	}
)

type peerDirectory struct {
	cfg     *PeersConfig
	rules   *peer.Config
	by      map[string]*actor.PID
	quiet   map[string]bool
	closing bool
	waiters []chan struct{} // Close calls waiting for every peer to be quiet
	pub     *atomic.Pointer[map[string]*actor.PID]
}

func (d *peerDirectory) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *toPeer:
		pid, ok := d.by[msg.agent]
		if !ok {
			if _, reg := msg.msg.(peer.Register); !reg {
				if d.cfg.Orphan != nil {
					d.cfg.Orphan(msg.agent, msg.msg)
				}
				return // names a peer that never registered
			}
			pid = d.spawn(ctx, msg.agent)
		}
		ctx.Send(pid, msg)
	case *peerBroadcast:
		left := len(d.by)
		if left == 0 {
			close(msg.done)
			return
		}
		var n atomicCountdown
		n.init(left, func() { close(msg.done) })
		for agent, pid := range d.by {
			ctx.Send(pid, &toPeer{agent: agent, msg: msg.msg})
			ctx.Send(pid, &settle{done: n.done})
		}
	case *atPeers:
		for _, pid := range d.by {
			ctx.Send(pid, msg)
		}
	case *listPeers:
		answers := make(chan describePeer, len(d.by))
		msg.reply <- answers
		for agent, pid := range d.by {
			ctx.Send(pid, &askPeer{agent: agent, reply: answers})
		}
	case *askPeer:
		pid, ok := d.by[msg.agent]
		if !ok {
			msg.reply <- describePeer{}
			return
		}
		ctx.Send(pid, msg)
	case *closePeers:
		if !d.closing {
			d.closing = true
			for agent, pid := range d.by {
				ctx.Send(pid, &toPeer{agent: agent, msg: peer.Shutdown{}})
			}
		}
		d.waiters = append(d.waiters, msg.done)
		d.checkClosed()
	case *peerQuiet:
		d.quiet[msg.agent] = true
		d.checkClosed()
	}
}

func (d *peerDirectory) spawn(ctx actor.Context, agent string) *actor.PID {
	dir := ctx.Self()
	props := actor.PropsFromProducer(func() actor.Actor {
		return &peerActor{agent: agent, m: peer.New(d.rules), cfg: d.cfg, dir: dir, timers: map[peer.DeadlineKind]clock.Timer{}}
	})
	pid := ctx.Spawn(props)
	d.by[agent] = pid
	pub := maps.Clone(d.by) // published whole: readers never see it change
	d.pub.Store(&pub)
	if d.closing { // born after Close: ends at once
		ctx.Send(pid, &toPeer{agent: agent, msg: peer.Shutdown{}})
	}
	return pid
}

func (d *peerDirectory) checkClosed() {
	if !d.closing {
		return
	}
	for agent := range d.by {
		if !d.quiet[agent] {
			return
		}
	}
	for _, w := range d.waiters {
		close(w)
	}
	d.waiters = nil
}

// peerActor owns one peer's machine.
type peerActor struct {
	agent   string
	m       *peer.Machine
	cfg     *PeersConfig
	dir     *actor.PID
	self    *actor.PID
	root    *actor.RootContext
	timers  map[peer.DeadlineKind]clock.Timer
	told    bool // the directory heard it is quiet
	failed  bool // a panic dropped it
	local   any  // the executor's state for this peer (PeerCtx.Local)
	settles []func()
}

// peerDeadline is a timer of the actor firing.
type peerDeadline struct{ d peer.Deadline }

func (a *peerActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.self, a.root = ctx.Self(), ctx.ActorSystem().Root
	case *toPeer:
		a.step(msg.msg)
	case *peerDeadline:
		d := msg.d
		if d.Kind == peer.FenceHoldUp && a.cfg.Epoch != nil {
			d.Epoch = a.cfg.Epoch() // the restore it may start is numbered now
		}
		a.step(d)
	case *atPeers:
		if a.m.Endpoint() == msg.at {
			a.step(msg.msg)
		}
	case *settle:
		a.settles = append(a.settles, msg.done)
		a.settled()
	case *askPeer:
		msg.reply <- describePeer{ok: true, st: a.describe()}
	case *actor.Stopping:
		for _, t := range a.timers {
			t.Stop()
		}
	}
}

// step steps the machine once and executes its effects. A panic on the way
// fails the peer: it is dropped (its rooms and writes fail, it leaves NIXL)
// and stays what the machine makes of that; the daemon goes on.
func (a *peerActor) step(msg peer.Msg) {
	defer func() {
		if r := recover(); r != nil {
			if a.cfg.OnPanic != nil {
				a.cfg.OnPanic(a.agent, r)
			}
			if a.failed {
				return // the drop itself panicked: nothing more to try
			}
			a.failed = true
			a.step(peer.Drop{Why: fmt.Sprintf("internal error: %v", r)})
			a.failed = false
		}
	}()
	fx := a.m.Step(msg)
	a.exec(msg, fx)
	a.settled()
	if a.m.Quiet() && !a.told {
		a.told = true
		a.root.Send(a.dir, &peerQuiet{agent: a.agent})
	}
}

// exec is the one place a step's effects are executed: the daemon's part,
// then the timers.
func (a *peerActor) exec(msg peer.Msg, fx peer.Effects) {
	pc := PeerCtx{Agent: a.agent, Msg: msg, State: a.m.State(), Inc: a.m.Inc(), WritesVia: a.m.WritesVia(),
		Local: a.local, Report: a.report}
	a.cfg.Exec.Exec(&pc, fx)
	a.local = pc.Local
	for _, arm := range fx.Arms {
		if t, ok := a.timers[arm.Kind]; ok {
			t.Stop()
			delete(a.timers, arm.Kind)
		}
		if arm.After <= 0 {
			continue
		}
		d := peer.Deadline{Kind: arm.Kind, Gen: arm.Gen}
		a.timers[arm.Kind] = a.cfg.Clock.AfterFunc(arm.After, func() { a.root.Send(a.self, &peerDeadline{d: d}) })
	}
}

func (a *peerActor) describe() PeerState {
	return PeerState{Agent: a.agent, State: a.m.State().String(), Inc: a.m.Inc(), Endpoint: a.m.Endpoint(),
		Held: a.m.Held(), Queued: a.m.Queued(), LastOK: a.m.LastOK(), Failing: a.m.Failing(),
		LastProbe: a.m.LastProbe().String(), Probing: a.m.Probing()}
}

// settled answers the settle requests once no load is in flight.
func (a *peerActor) settled() {
	if len(a.settles) == 0 || a.m.LoadOut() {
		return
	}
	for _, f := range a.settles {
		f()
	}
	a.settles = nil
}

// report hands the result of slow work back to the actor (any goroutine).
func (a *peerActor) report(msg peer.Msg) {
	a.root.Send(a.self, &toPeer{agent: a.agent, msg: msg})
}

// atomicCountdown runs fn once n calls of done were made (from any actor).
type atomicCountdown struct {
	left *atomic.Int64
	fn   func()
}

func (c *atomicCountdown) init(n int, fn func()) {
	c.left, c.fn = new(atomic.Int64), fn
	c.left.Store(int64(n))
}

func (c *atomicCountdown) done() {
	if c.left.Add(-1) == 0 {
		c.fn()
	}
}
