package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/peer"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// Bounds on what a decode may send while its registration loads, so that a
// slow NIXL metadata load cannot make kvxferd buffer without bound:
// transfer infos and ABORTs for an agent whose registration is still being
// loaded wait in that agent's queue, at most maxQueuedFrames of them and
// maxQueuedBytes of page lists per agent, and maxQueuedTotal bytes over every
// agent. Past a bound the room fails (transfer_error) at once, counted in
// queued_frames_refused; nothing else is touched.
const (
	maxQueuedFrames = 4096
	maxQueuedBytes  = 64 << 20
	maxQueuedTotal  = 256 << 20
	// maxViews bounds the ingest's views of agents that are gone.
	maxViews = 1 << 14
)

// peers is the ingest Sink and the home of the decode-peer actors.
//
// Each decode agent is one actor (actors.Peers) owning its rules
// (actors/peer.Machine): its registration and every incarnation of it, its
// load, its queue of transfer infos and ABORTs while it loads, its fence and
// its restore. Every event of a peer is a message to that actor: a
// registration or a replayed one (from the ingest), a load's result (from
// the goroutine that ran it), a probe's result, a tick or an outage deadline
// (its own timers), its link's loss (the link monitor), a write to hold or
// confirm (the transfers), a transfer that failed peer_lost (from the pool),
// a drop (rollback), shutdown. The machine watches its decode itself (probes,
// outage, fence, held writes; liveness.go has the parameters and the probe).
// The actor executes the machine's effects in one place (Exec, peerexec.go);
// slow work (the NIXL load, a probe) runs off it and comes back as a message. So one
// peer's state has one owner and its events one order: a restore and a
// registration of the same agent can only follow each other, and a load
// superseded while it ran is released before the next one starts.
//
// The ingest goroutine decides only where a frame goes: it keeps, for each
// agent, a view its actor publishes (state, and how many of the ingest's
// messages it has not stepped yet). A transfer info of an agent whose actor
// is loading, fenced or still has the ingest's messages in its mailbox goes to
// the actor, in order behind them; any other goes straight to its room (the
// engine batch), so the hot path costs no extra hop. The ingest never waits
// on NIXL.
type peers struct {
	d   *Daemon
	max int
	// stg is staging's rule and counters (staging.go); each staging peer's
	// regions and held chunks are its actor's (peerLocal.stg).
	stg *stager

	actors *actors.Peers
	// epoch numbers incarnations daemon-wide: a transfer posted at epoch n
	// that fails peer_lost ends its agent's incarnation only if that one
	// began at n or before.
	epoch  atomic.Uint64
	slots  atomic.Int64 // agents loading or loaded (the link cap)
	queued atomic.Int64 // bytes of infos handed to peer actors and not yet let go
	// gated counts the peers whose writes must go through their actor now
	// (suspect, or confirming): while it is 0 a write is posted straight
	// away. fenced counts fenced peers (a registration at their endpoint
	// ends their fence). writes numbers the writes handed to actors.
	gated, fenced atomic.Int64
	writes        atomic.Uint64

	dupLogs, rejectLogs, addLogs *logLimiter

	// The ingest goroutine's own: the views of the agents' actors, the agent
	// registered last at each endpoint (where an ABORT from there waits),
	// the engine batch, the run's routes and rejection answers per agent.
	views      map[string]*peerView
	at         map[kv.Endpoint]string
	batch      *actors.Batch
	routes     []*peerView
	rejectedOf map[string]bool
}

// peerView is what an agent's actor publishes for the ingest: its state after
// each step, and how many messages the ingest sent it that it has not
// stepped yet (while any is pending, the ingest sends it the agent's frames
// too, so nothing overtakes them).
type peerView struct {
	state   atomic.Uint32 // peer.State
	pending atomic.Int64
	// stages: a staging peer's infos all go through its actor, which asks
	// for their regions (STAGING_REQ) where it keeps them.
	stages atomic.Bool
}

// viaActor says whether the agent's frames must go through its actor now.
func (v *peerView) viaActor() bool {
	if v == nil {
		return false
	}
	return v.pending.Load() > 0 || v.stages.Load() || v.viaActorIn(peer.State(v.state.Load()))
}

// viaActorIn says whether an agent in state st has its frames go through its
// actor.
func (*peerView) viaActorIn(st peer.State) bool {
	return st == peer.Loading || st == peer.Fenced || st == peer.Closed
}

// regPayload is a registration as the peer machine carries it.
type regPayload struct {
	r        *wire.Registration
	frames   [][]byte
	view     *peerView
	rejected bool // refused before its load (already recorded in dialects)
}

// infoPayload is a transfer info or ABORT handed to a peer actor.
type infoPayload struct {
	t    *wire.TransferInfo
	a    *wire.Abort
	size int // counted in peers.queued
}

func newPeers(d *Daemon, maxPeers int, live *liveness) *peers {
	s := &d.counters.logsSuppressed
	p := &peers{d: d, max: maxPeers, views: map[string]*peerView{}, at: map[kv.Endpoint]string{},
		rejectedOf: map[string]bool{},
		dupLogs:    newLogLimiter(time.Second, s), rejectLogs: newLogLimiter(time.Second, s),
		// Honest registrations come in bursts at start-up: 20 lines a second.
		addLogs: newLogLimiter(50*time.Millisecond, s)}
	// Each machine watches its decode (probes, outage, fence, held and
	// confirmed writes) on the liveness clock: its ticks are the actor's
	// timers, its probes run off the actor (liveness.probe).
	p.actors = actors.NewPeers(actors.PeersConfig{
		Rules: live.rules(peer.Config{MaxQueued: maxQueuedFrames, MaxQueuedBytes: maxQueuedBytes}),
		Exec:  p, Clock: live.clk,
		OnPanic: func(agent string, r any) {
			d.log.Error("panic on a decode peer's path; the peer is dropped", "agent", agent, "panic", fmt.Sprint(r))
		},
		Epoch: func() uint64 { return p.epoch.Add(1) },
		// A write for an agent that never registered is posted as it would
		// have been without the gate (the pool fails it); a staging frame
		// for one is dropped (nobody asked for it).
		Orphan: func(_ string, msg peer.Msg) {
			switch m := msg.(type) {
			case peer.Write:
				switch h := m.Payload.(type) {
				case *heldWrite:
					h.post()
				case *stagedChunk:
					h.post(h.t, h.done)
				}
			case peer.Staging:
				if _, ok := m.Payload.(wire.Inbound); ok {
					p.stg.dropped.Add(1)
					d.counters.staging.Add(1)
				}
			}
		},
	})
	p.stg = newStager(d.cfg.Staging, d.cfg.Rank.TPSize, d.cfg.MLA, func(to kv.Endpoint, f [][]byte) error {
		return d.links.send(to, f)
	})
	p.stg.pageSize, p.stg.rank = d.cfg.PageSize, d.cfg.Rank.Unique()
	d.dialects.staging = p.stg.stages
	return p
}

// Registration: the first registration of an agent wins (as upstream), with
// one exception: the same agent registering again from the same endpoint is
// that decode coming back. SGLang sends a registration once per connection
// pool entry and sends it again only after its heartbeat to this prefill
// failed and it cleared the pool, failing every room it tracked here; so the
// agent's rooms fail peer_lost (as decode concluded) and the registration is
// loaded afresh. Its frame count says which SGLang release the decode runs;
// one that no supported release sends is rejected, and the agent's rooms fail
// with peer_rejected. A new agent at the endpoint of an accepted one means
// that decode restarted: the old agent is dropped first. Past the peer cap,
// registrations are rejected (peer_rejected, with the reason).
func (p *peers) Registration(r *wire.Registration) { p.register(r, nil, false) }

// RegistrationFrames is Registration with the frames as received: an accepted
// registration is kept in the state file (-state-dir) for the next kvxferd.
func (p *peers) RegistrationFrames(r *wire.Registration, frames [][]byte) {
	p.register(r, frames, false)
}

// replay registers what the state file kept, on the ingest goroutine before
// the socket is read. A registration that no longer loads (the decode is
// gone) is dropped quietly and forgotten.
func (p *peers) replay(msgs [][][]byte) {
	n := 0
	for _, frames := range msgs {
		m, err := wire.DecodeInbound(frames)
		r, ok := m.(*wire.Registration)
		if err != nil || !ok {
			continue // load() decoded it already
		}
		if p.register(r, frames, true) {
			n++
		}
	}
	p.d.log.Info("decode registrations replayed from the state file", "replayed", n, "kept", len(msgs))
}

// afterRegisterCheck, when set, runs in register right after the agent's
// view was looked up (tests: an event of another goroutine lands there).
var afterRegisterCheck func(agent string)

// register runs on the ingest goroutine: it checks the peer cap and hands
// the registration to the agent's actor (which decides the rest: duplicate,
// comeback, dialect, load). It reports whether it handed it over.
func (p *peers) register(r *wire.Registration, frames [][]byte, replay bool) bool {
	d := p.d
	to := kv.Endpoint{IP: r.DecodeIP, Port: r.DecodePort}
	v := p.views[r.AgentName]
	if v == nil {
		v = &peerView{}
		p.views[r.AgentName] = v
		p.forgetViews()
	}
	if afterRegisterCheck != nil {
		afterRegisterCheck(r.AgentName)
	}
	st := peer.State(v.state.Load())
	holding := v.pending.Load() > 0 || st == peer.Loading || st.Live()
	if !holding && p.slots.Load() >= int64(p.max) {
		err := fmt.Errorf("peer table full: %d decode agents registered (the link cap)", p.max)
		d.dialects.reject(r, err)
		d.counters.badRegistrations.Add(1)
		if ok, suppressed := p.rejectLogs.allow(); ok {
			d.log.Warn("decode registration rejected; its rooms fail with peer_rejected", "agent", r.AgentName,
				"endpoint", to.String(), "err", err, "suppressed", suppressed)
		}
		return false
	}
	v.pending.Add(1)
	p.at[to] = r.AgentName
	p.actors.Send(r.AgentName, peer.Register{From: peer.Endpoint(to), Replay: replay, Epoch: p.epoch.Add(1),
		Confirm: d.liveness.confirms(to), Reg: &regPayload{r: r, frames: frames, view: v}})
	return true
}

// forgetViews bounds the views: past maxViews, those of agents gone with
// nothing pending go (a later registration makes a new one).
func (p *peers) forgetViews() {
	if len(p.views) <= maxViews {
		return
	}
	for a, v := range p.views {
		st := peer.State(v.state.Load())
		if v.pending.Load() == 0 && (st == peer.Gone || st == peer.Absent) {
			delete(p.views, a)
		}
	}
	for ep, a := range p.at {
		if _, ok := p.views[a]; !ok {
			delete(p.at, ep)
		}
	}
}

// infoSink is where an info's room messages go: the engine itself
// (*actors.Engine) or a batch of the ingest's (*actors.Batch).
type infoSink interface {
	TransferInfo(roomID uint64, ti room.TransferInfo)
	Fail(roomID uint64, why kv.Reason)
}

// toActor hands a transfer info to its agent's actor; false when the bound
// over every agent's queue refuses it.
func (p *peers) toActor(t *wire.TransferInfo, v *peerView) bool {
	size := 4*len(t.DstKVIndices) + 4*len(t.DstStateIndices) + 256
	if p.queued.Add(int64(size)) > maxQueuedTotal {
		p.queued.Add(-int64(size))
		return false
	}
	v.pending.Add(1)
	p.actors.Send(t.AgentName, peer.Info{Room: t.Room, Size: size, Payload: &infoPayload{t: t, size: size}})
	return true
}

// routeInfo sends an info to its room through to, or to its agent's actor
// (v set).
func (p *peers) routeInfo(t *wire.TransferInfo, v *peerView, to infoSink, rejected func(agent string) bool) {
	if v != nil {
		if !p.toActor(t, v) {
			p.d.counters.queueRefused.Add(1)
			to.Fail(t.Room, kv.ReasonTransferError)
		}
		return
	}
	p.applyInfoTo(t, to, rejected)
}

// route is the actor view an info must go through (nil: straight to its room).
func (p *peers) route(t *wire.TransferInfo) *peerView {
	if v := p.views[t.AgentName]; v.viaActor() {
		return v
	}
	return nil
}

func (p *peers) TransferInfo(t *wire.TransferInfo) {
	p.routeInfo(t, p.route(t), p.d.eng, p.rejected)
}

// TransferInfos is the ingest's batched hand-off (zmqio.BatchSink): a run of
// transfer infos handed to the engine as one message per directory shard
// (actors.Batch) instead of one per info. Each info is treated exactly as
// TransferInfo treats it, in the same order; the infos of an agent whose
// actor must see them (loading, fenced, or still stepping what the ingest
// sent it) go to that actor as before, and the run is flushed before the
// ingest hands over anything else, so a registration or an ABORT that follows
// on the socket still comes after it.
func (p *peers) TransferInfos(ts []*wire.TransferInfo) {
	if perFrameIngest {
		for _, t := range ts {
			p.TransferInfo(t)
		}
		return
	}
	if p.batch == nil {
		p.batch = p.d.eng.NewBatch()
	}
	// Deferred: even a panic mid-run (recovered by the ingest) sends what
	// was added, before anything the ingest hands over next.
	defer p.batch.Flush()
	p.routes = p.routes[:0]
	for _, t := range ts {
		p.routes = append(p.routes, p.route(t))
	}
	// A run comes from few agents: ask the dialect table once per agent.
	clear(p.rejectedOf)
	rejected := func(agent string) bool {
		r, ok := p.rejectedOf[agent]
		if !ok {
			r = p.rejected(agent)
			p.rejectedOf[agent] = r
		}
		return r
	}
	for i, t := range ts {
		p.routeInfo(t, p.routes[i], p.batch, rejected)
	}
}

// perFrameIngest makes TransferInfos hand each info over on its own, as the
// ingest did before it batched (BenchmarkDaemonIngest's baseline; tests only).
var perFrameIngest = false

func (p *peers) rejected(agent string) bool { return p.d.dialects.rejection(agent) != "" }

func (p *peers) applyInfo(t *wire.TransferInfo) { p.applyInfoTo(t, p.d.eng, p.rejected) }

func (p *peers) applyInfoTo(t *wire.TransferInfo, to infoSink, rejected func(string) bool) {
	isRejected := rejected(t.AgentName)
	info := room.TransferInfo{
		Agent: t.AgentName, From: kv.Endpoint{IP: t.DecodeIP, Port: t.DecodePort},
		DstPages: t.DstKVIndices, DstAux: t.DstAuxIndex, Required: t.RequiredDstInfoNum,
		DstState: t.DstStateIndices, PrefixLen: t.DecodePrefixLen, Dummy: t.IsDummy(),
	}
	if isRejected {
		// The room fails with the info in one step (it learns where to send
		// the failure, and posts nothing for it); the Fail after it covers a
		// room past collecting, which absorbs a second agent's info.
		info.Refused = kv.ReasonPeerRejected
	}
	to.TransferInfo(t.Room, info)
	if isRejected {
		to.Fail(t.Room, kv.ReasonPeerRejected)
	}
}

// Abort: the return address is taken only when it is a registered decode's
// endpoint; any other ABORT still fails its room, but no ABORT_ACK is sent and
// no link is dialled for it (counted: abort_endpoints_refused). An ABORT from
// the endpoint of an agent still loading waits behind that agent's queued
// transfer infos (in its actor), so it cannot overtake them.
func (p *peers) Abort(a *wire.Abort) {
	if a.HasEndpoint {
		from := kv.Endpoint{IP: a.DecodeIP, Port: a.DecodePort}
		if agent, ok := p.at[from]; ok {
			v := p.views[agent]
			if v != nil && (v.pending.Load() > 0 || peer.State(v.state.Load()) == peer.Loading) {
				v.pending.Add(1)
				p.actors.Send(agent, peer.Info{Room: a.Room, Abort: true, Payload: &infoPayload{a: a}})
				return
			}
		}
	}
	p.applyAbort(a)
}

func (p *peers) applyAbort(a *wire.Abort) {
	var from kv.Endpoint
	if a.HasEndpoint {
		from = kv.Endpoint{IP: a.DecodeIP, Port: a.DecodePort}
		if !p.d.dialects.known(from) {
			p.d.counters.abortsRefused.Add(1)
			from = kv.Endpoint{}
		}
	}
	if a.HasGen {
		p.d.dialects.sawGeneration(from)
		p.d.eng.DecodeAbortGen(a.Room, from, a.Generation)
		return
	}
	p.d.eng.DecodeAbort(a.Room, from)
}

// Staging routes STAGING_RSP and WATERMARK to the actor of the agent they
// name (staging.go), which applies them to its regions; with -staging off, a
// malformed frame, or when nobody asked for it, the frame is dropped and
// counted (staging_frames_dropped).
func (p *peers) Staging(m wire.Inbound) {
	agent := ""
	switch m := m.(type) {
	case *wire.StagingRsp:
		if m.Err == nil {
			agent = m.SessionID
		}
	case *wire.Watermark:
		if m.Err == nil {
			agent = m.SessionID
		}
	}
	if !p.d.cfg.Staging.Enabled || agent == "" {
		p.stg.dropped.Add(1)
		p.d.counters.staging.Add(1)
		return
	}
	p.actors.Send(agent, peer.Staging{Payload: m})
}

// stage hands a chunk to a staging peer's actor (a staged peer.Write: it
// waits there for its region); false when the agent is not a staging peer
// or the chunk is not staged. post is the transfers' path to the pool.
func (p *peers) stage(t kv.Transfer, done kv.DoneFunc, post func(kv.Transfer, kv.DoneFunc)) bool {
	if !p.d.dialects.stages(t.Agent) {
		return false
	}
	c := p.stg.chunk(t, done, post)
	if c == nil {
		return false
	}
	p.actors.SendWrite(t.Agent, peer.Write{ID: p.writes.Add(1), Inc: p.epoch.Load(), Staged: true, Room: t.Room, Payload: c})
	return true
}

// withdraw ends, at each staging agent's actor, the staged chunks of a room
// that failed (after the writes handed to it: they go the same way or ahead).
func (p *peers) withdraw(roomID uint64, agents []string) {
	for _, a := range agents {
		if p.d.dialects.stages(a) {
			p.actors.Send(a, peer.Withdraw{Room: roomID})
		}
	}
}

// BadFrame: the ingest already counted and logged it; when the frame named its
// room, that room fails (invalid_request) instead of waiting for a deadline,
// and no other room is touched.
func (p *peers) BadFrame(err error) {
	p.d.counters.badFrames.Add(1)
	var fe *wire.FrameError
	if errors.As(err, &fe) && fe.HasRoom {
		p.d.eng.Fail(fe.Room, kv.ReasonInvalidRequest)
	}
}

// add loads the peer's NIXL metadata and hands its geometry to the pool; on
// failure nothing of it stays in NIXL. Called without locks.
func (p *peers) add(r *wire.Registration, dialect wire.Dialect) error {
	d := p.d
	agent, pool := d.backend()
	if agent == nil || pool == nil {
		return errors.New("no memory registered yet")
	}
	name, err := agent.LoadPeer(r.AgentMetadata)
	if err != nil {
		return err
	}
	if name != r.AgentName {
		_ = agent.DropPeer(name)
		return errors.New("agent metadata names " + name + ", the frame says " + r.AgentName)
	}
	g := sglang.PeerGeometry{
		Agent: name, KVPtrs: r.KVDataPtrs, KVItemLens: r.KVItemLens, DstKVItemLen: uint64(r.DstKVItemLen),
		GPU: uint64(r.GPUID), AuxPtrs: r.AuxDataPtrs, StatePtrs: r.StateDataPtrs, TPSize: r.DecodeTPSize,
		NoNotifs: !dialect.Notifs(),
	}
	peerTopology(&g, r, dialect)
	p.stg.geometry(&g, r)
	if r.HasDstNumSlots {
		g.DstNumSlots = r.DstNumSlots
	}
	for _, k := range r.KVMemKinds {
		kind := nixl.VRAM
		if k == wire.MemDRAM {
			kind = nixl.DRAM
		}
		g.KVKinds = append(g.KVKinds, kind)
	}
	if err := pool.AddPeer(g); err != nil {
		_ = agent.DropPeer(name)
		return err
	}
	return nil
}

// releaseAgent takes an agent out of the pool and, when nx, out of NIXL.
func (d *Daemon) releaseAgent(agent string, nx bool) {
	a, pool := d.backend()
	if pool != nil {
		pool.RemovePeer(agent)
	}
	if nx && a != nil {
		_ = a.DropPeer(agent)
	}
}

// close shuts every peer actor down and waits for the loads still out
// (shutdown), bounded by ctx.
func (p *peers) close(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.actors.Close(ctx)
}

// dropAll drops every peer (a rolled-back activation: their records stay in
// the state file) and waits for the loads still out, bounded by ctx.
func (p *peers) dropAll(ctx context.Context) error {
	return p.actors.Broadcast(ctx, peer.Drop{Why: "activation failed", KeepState: true})
}
