package daemon

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// Bounds on what a decode may send while its registration loads (issue 15):
// transfer infos and ABORTs for an agent whose registration is still being
// loaded wait in that agent's queue, at most maxQueuedFrames of them and
// maxQueuedBytes of page lists per agent, and maxQueuedTotal bytes over every
// agent. Past a bound the room fails (transfer_error) at once, counted in
// queued_frames_refused; nothing else is touched.
const (
	maxQueuedFrames = 4096
	maxQueuedBytes  = 64 << 20
	maxQueuedTotal  = 256 << 20
	// maxFenced bounds the agents remembered as lost to an outage (oldest
	// forgotten first).
	maxFenced = 1024
)

// peers is the decode-agent table and the ingest Sink.
//
// The ingest goroutine only decides (duplicate, cap, dialect, which agent a
// frame belongs to) and hands the slow part of a registration — NIXL metadata
// load, descriptor preparation, the link dial, the state file — to a
// goroutine of its own (load). The agent is "loading" until that goroutine
// is done; the transfer infos and ABORTs that reach the ingest meanwhile are
// queued on the agent (bounded) and applied, in order, by load once the
// registration is in the pool. So the ingest never waits on NIXL, and a
// decode's transfer infos still never reach a room before the pool knows
// its agent (decode sends the registration first on the same socket).
//
// byAgent holds the accepted agents, loading or ready, at most max (the link
// cap: each has a pinned link). mu guards the table and the queues; nothing
// under it calls NIXL or the network (engine calls are mailbox sends).
type peers struct {
	d   *Daemon
	max int
	// stg is the staging state of decodes with a staging ring (staging.go),
	// made on first use.
	stg     *stagingTable
	stgOnce sync.Once

	mu      sync.Mutex
	byAgent map[string]*peerEntry
	loading int // entries still loading (Abort scans for them only then)
	queued  int // bytes queued over every agent
	// fenced: agents dropped because their decode was unreachable longer
	// than its heartbeat budget (liveness.go). Their transfer infos fail
	// the room before it sees them, until the agent registers again.
	fenced     map[string]fenceEntry
	fenceOrder []string
	wg         sync.WaitGroup // load goroutines
	// inflight is each agent's latest load still running (startLoadLocked).
	inflight map[string]*peerEntry
	// epoch numbers the entries: a transfer posted at epoch n that fails
	// peer_lost drops its agent only if the entry is from n or before (not
	// the same agent loaded again since: dropAgentSince).
	epoch atomic.Uint64

	dupLogs, rejectLogs, addLogs *logLimiter

	// The ingest goroutine's own (TransferInfos): the engine batch, the
	// run's routes and the run's rejection answers per agent.
	batch      *actors.Batch
	routes     []infoRoute
	rejectedOf map[string]bool
}

type peerEntry struct {
	epoch   uint64
	reg     *wire.Registration
	to      room.Endpoint
	ready   bool
	queue   []queuedFrame
	qBytes  int
	started time.Time
	// done is closed when the entry's load ended; after, when set, is the
	// done of the agent's previous load, which this one waits for.
	done, after chan struct{}
}

// fenceEntry is a fenced agent: since when, where, and its last accepted
// registration (loaded again if its decode turns out to have kept its rooms).
type fenceEntry struct {
	at  time.Time
	to  room.Endpoint
	reg *wire.Registration
}

type queuedFrame struct {
	info  *wire.TransferInfo
	abort *wire.Abort
	size  int
}

func newPeers(d *Daemon, maxPeers int) *peers {
	s := &d.counters.logsSuppressed
	return &peers{d: d, max: maxPeers, byAgent: map[string]*peerEntry{}, fenced: map[string]fenceEntry{},
		inflight:   map[string]*peerEntry{},
		rejectedOf: map[string]bool{},
		dupLogs:    newLogLimiter(time.Second, s), rejectLogs: newLogLimiter(time.Second, s),
		// Honest registrations come in bursts at start-up: 20 lines a second.
		addLogs: newLogLimiter(50*time.Millisecond, s)}
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

// register runs on the ingest goroutine; it reports whether r was taken to
// be loaded. It does no NIXL, network or file work: that is load's.
func (p *peers) register(r *wire.Registration, frames [][]byte, replay bool) bool {
	d := p.d
	to := room.Endpoint{IP: r.DecodeIP, Port: r.DecodePort}
	var before []func() // releases of agents this registration replaces, run by load first
	p.mu.Lock()
	e, exists := p.byAgent[r.AgentName]
	comeback := exists && e.ready && e.to == to && !replay
	if (!exists || comeback) && p.fenceOfLocked(r) {
		// Registering again: whatever follows is after decode's reset. The
		// fence goes in the same critical section as the look-up, so a
		// restore (liveness goroutine) cannot load the agent in between.
		p.unfenceLocked(r.AgentName)
	}
	p.mu.Unlock()
	if afterRegisterCheck != nil {
		afterRegisterCheck(r.AgentName)
	}
	if exists && !comeback {
		d.counters.duplicateRegistrations.Add(1)
		if ok, suppressed := p.dupLogs.allow(); ok {
			d.log.Info("duplicate registration ignored (first wins)", "agent", r.AgentName, "endpoint", to.String(),
				"loading", !e.ready, "suppressed", suppressed)
		}
		return false
	}
	if comeback {
		d.counters.peersReturned.Add(1)
		if rel, ok := d.forgetAgent(r.AgentName, "registered again from its endpoint: decode cleared its connection to this prefill and failed the rooms it tracked", true, false); ok {
			before = append(before, rel)
		}
	}
	if old := d.dialects.acceptedAt(to); old != "" && old != r.AgentName {
		if rel, ok := d.forgetAgent(old, "re-registered: a new agent registered from its endpoint", false, false); ok {
			before = append(before, rel)
		}
	}
	p.mu.Lock()
	full := len(p.byAgent) >= p.max
	p.mu.Unlock()
	var (
		dialect wire.Dialect
		err     error
	)
	if full {
		err = fmt.Errorf("peer table full: %d decode agents registered (the link cap)", p.max)
		d.dialects.reject(r, err)
	} else {
		dialect, err = d.dialects.register(r)
	}
	if err != nil {
		d.counters.badRegistrations.Add(1)
		if ok, suppressed := p.rejectLogs.allow(); ok {
			d.log.Warn("decode registration rejected; its rooms fail with peer_rejected", "agent", r.AgentName,
				"endpoint", to.String(), "err", err, "suppressed", suppressed)
		}
		if len(before) > 0 {
			go runAll(before)
		}
		return false
	}
	e = &peerEntry{reg: r, to: to, started: d.now(), epoch: p.epoch.Add(1)}
	p.mu.Lock()
	p.byAgent[r.AgentName] = e
	p.startLoadLocked(e)
	p.mu.Unlock()
	go p.load(e, dialect, frames, replay, before)
	return true
}

// afterRegisterCheck, when set, runs in register right after the agent's
// entry was looked up (tests: an event of another goroutine lands there).
var afterRegisterCheck func(agent string)

func runAll(fs []func()) {
	for _, f := range fs {
		f()
	}
}

// load does a registration's slow work off the ingest goroutine, then applies
// what was queued for the agent meanwhile, in arrival order.
func (p *peers) load(e *peerEntry, dialect wire.Dialect, frames [][]byte, replay bool, before []func()) {
	defer p.wg.Done()
	d := p.d
	r := e.reg
	if e.after != nil {
		<-e.after // the agent's previous load ends (and releases what it loaded) first
	}
	runAll(before) // the agents this one replaces leave NIXL and the pool first
	err := p.add(r, dialect)
	p.mu.Lock()
	current := p.byAgent[r.AgentName] == e
	p.mu.Unlock()
	switch {
	case err == nil && !current:
		// Dropped while loading (its decode was lost, or kvxferd is closing):
		// take it back out of NIXL and the pool.
		d.releaseAgent(r.AgentName, true)
	case err == nil:
		d.counters.registrations.Add(1)
		p.staging().add(r, !dialect.Notifs())
		if frames != nil {
			d.state.put(r, frames)
		}
		// Dial now (pinned), so the link watches the decode from its first room on.
		if _, lerr := d.links.get(e.to, true); lerr != nil {
			if ok, suppressed := p.rejectLogs.allow(); ok {
				d.log.Warn("link to decode; its loss will not be detected", "agent", r.AgentName, "err", lerr, "suppressed", suppressed)
			}
		}
		d.liveness.watch(e.to)
		if ok, suppressed := p.addLogs.allow(); ok {
			d.log.Info("decode registered", "agent", r.AgentName, "endpoint", e.to.String(),
				"kv_buffers", len(r.KVDataPtrs), "tp", r.DecodeTPSize, "sglang", dialect.String(), "frames", r.Frames,
				"load", d.now().Sub(e.started).String(), "suppressed", suppressed)
		}
	case replay:
		// The decode is gone (or changed): forget it, quietly.
		d.dialects.drop(r.AgentName, "replayed registration no longer loads", false)
		d.state.remove(r.AgentName)
		d.log.Info("replayed decode registration dropped: it no longer loads", "agent", r.AgentName,
			"endpoint", e.to.String(), "err", err)
	default:
		// Refused by SGLang's geometry rules (or NIXL): its rooms fail
		// peer_rejected, and decode is told SGLang's reason.
		d.dialects.reject(r, err)
		d.counters.badRegistrations.Add(1)
		if ok, suppressed := p.rejectLogs.allow(); ok {
			d.log.Warn("decode registration rejected; its transfer infos will fail their rooms", "agent", r.AgentName,
				"err", err, "suppressed", suppressed)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.loading--
	if p.byAgent[r.AgentName] == e {
		if err != nil {
			delete(p.byAgent, r.AgentName)
		} else {
			e.ready = true
		}
	}
	// Applied under mu, so that a frame the ingest reads after this cannot
	// overtake them (it finds the entry ready, or gone, only after).
	for _, q := range e.queue {
		if q.info != nil {
			p.applyInfo(q.info)
		} else {
			p.applyAbort(q.abort)
		}
	}
	p.queued -= e.qBytes
	e.queue, e.qBytes = nil, 0
	p.endLoadLocked(e)
}

// startLoadLocked counts a load about to start and chains it behind the
// agent's load still in flight, if any: loads of one agent name run one
// after the other, so a superseded load that releases the agent by name
// (load, !current) is done before the newer one adds it.
func (p *peers) startLoadLocked(e *peerEntry) {
	p.loading++
	p.wg.Add(1)
	e.done = make(chan struct{})
	if prev := p.inflight[e.reg.AgentName]; prev != nil {
		e.after = prev.done
	}
	p.inflight[e.reg.AgentName] = e
}

func (p *peers) endLoadLocked(e *peerEntry) {
	close(e.done)
	if p.inflight[e.reg.AgentName] == e {
		delete(p.inflight, e.reg.AgentName)
	}
}

// fenceOfLocked says whether r ends a fence of its agent: fenced, and (when
// the fence knows it) from the same endpoint.
func (p *peers) fenceOfLocked(r *wire.Registration) bool {
	f, ok := p.fenced[r.AgentName]
	return ok && (f.reg == nil || f.reg.DecodeIP == r.DecodeIP && f.reg.DecodePort == r.DecodePort)
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
	p.staging().geometry(&g, r)
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

// forgetAgent does the bookkeeping of dropping an accepted decode agent: it
// leaves the peer table and the dialect table, its rooms fail peer_lost, and
// its state-file record goes. It returns what is left to do off the caller's
// goroutine (the pool, NIXL, the link; releaseAgent) and whether the agent
// was known. lost says its connection was lost; keepState keeps its state-file
// record (a rolled-back activation replays it next time).
func (d *Daemon) forgetAgent(agent, why string, lost, keepState bool) (release func(), known bool) {
	p := d.peers
	p.mu.Lock()
	e, ok := p.byAgent[agent]
	if ok {
		delete(p.byAgent, agent)
	}
	p.mu.Unlock()
	p.staging().drop(agent)
	to, inDialects := d.dialects.drop(agent, why, lost)
	if !ok && !inDialects {
		return nil, false
	}
	d.counters.peersDropped.Add(1)
	d.eng.PeerLost(agent)
	if ok, suppressed := d.dropLogs.allow(); ok {
		d.log.Warn("decode agent dropped; its rooms fail peer_lost", "agent", agent, "endpoint", to.String(), "why", why,
			"suppressed", suppressed)
	}
	loaded := ok && e.ready
	return func() {
		if !keepState {
			d.state.remove(agent)
		}
		if loaded {
			d.releaseAgent(agent, true)
		}
		if inDialects {
			d.links.retire(to)
			d.liveness.unwatch(to)
		}
	}, true
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

// dropAgent forgets an accepted decode agent (forgetAgent) and releases it.
// Idempotent; safe from any goroutine but the ingest's and a link's monitor
// (it may wait on the NIXL agent).
func (d *Daemon) dropAgent(agent, why string, lost bool) {
	if rel, ok := d.forgetAgent(agent, why, lost, false); ok {
		rel()
	}
}

// dropAgentSince drops an agent for a transfer posted at epoch that failed
// peer_lost, unless the agent was loaded again after it (a decode that came
// back: the failure is its old incarnation's, our own DropPeer among them).
func (d *Daemon) dropAgentSince(agent string, epoch uint64, why string) {
	p := d.peers
	p.mu.Lock()
	e, ok := p.byAgent[agent]
	newer := ok && e.epoch > epoch
	p.mu.Unlock()
	if newer {
		return
	}
	d.dropAgent(agent, why, true)
}

// fence marks an agent lost to an outage: its transfer infos fail their rooms
// before the rooms see them, until it registers again or is restored (see
// liveness.go). Call it before the agent is dropped.
func (p *peers) fence(agent string, to room.Endpoint, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, ok := p.fenced[agent]
	if !ok {
		p.fenceOrder = append(p.fenceOrder, agent)
	}
	f.at = at
	if e := p.byAgent[agent]; e != nil && e.ready {
		f.reg = e.reg
	}
	f.to = to
	p.fenced[agent] = f
	for len(p.fenceOrder) > maxFenced {
		delete(p.fenced, p.fenceOrder[0])
		p.fenceOrder = p.fenceOrder[1:]
	}
}

func (p *peers) unfenceLocked(agent string) {
	if _, ok := p.fenced[agent]; !ok {
		return
	}
	delete(p.fenced, agent)
	for i, a := range p.fenceOrder {
		if a == agent {
			p.fenceOrder = append(p.fenceOrder[:i], p.fenceOrder[i+1:]...)
			break
		}
	}
}

// fencedAt lists the agents fenced at an endpoint, by name.
func (p *peers) fencedAt(at room.Endpoint) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for a, f := range p.fenced {
		if f.to == at {
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out
}

// unfence forgets an agent's fence.
func (p *peers) unfence(agent string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unfenceLocked(agent)
}

// restore lifts an agent's fence once its endpoint has answered every probe
// for FenceHold without the agent registering again: its decode kept its
// rooms (the heartbeat recovered), so the agent is the same peer coming back
// and is loaded again from its last registration, as if it had sent it now.
// Its transfer infos wait for that load like any registration's.
func (p *peers) restore(agent string) {
	d := p.d
	p.mu.Lock()
	f, ok := p.fenced[agent]
	if !ok || f.reg == nil || p.byAgent[agent] != nil {
		p.unfenceLocked(agent)
		p.mu.Unlock()
		return
	}
	r := f.reg
	to := room.Endpoint{IP: r.DecodeIP, Port: r.DecodePort}
	if len(p.byAgent) >= p.max || d.dialects.acceptedAt(to) != "" {
		// Another agent took the endpoint, or no room: it stays forgotten.
		p.unfenceLocked(agent)
		p.mu.Unlock()
		return
	}
	e := &peerEntry{reg: r, to: to, started: d.now(), epoch: p.epoch.Add(1)}
	p.byAgent[agent] = e
	p.startLoadLocked(e)
	p.unfenceLocked(agent)
	p.mu.Unlock()
	dialect, err := d.dialects.register(r)
	if err != nil { // it was accepted before; a rule changed under it
		p.mu.Lock()
		p.loading--
		delete(p.byAgent, agent)
		p.endLoadLocked(e)
		p.mu.Unlock()
		p.wg.Done()
		return
	}
	d.counters.peersReturned.Add(1)
	go p.load(e, dialect, nil, false, nil)
}

// infoRoute is what the ingest does with one transfer info (classify).
type infoRoute uint8

const (
	infoApply   infoRoute = iota // to its room (applyInfo)
	infoFenced                   // its agent is fenced: fail the room, then the info
	infoQueued                   // its agent is loading: queued, load applies it
	infoRefused                  // the loading queue is full: fail the room
)

// classifyLocked decides an info's route and queues it when its agent is
// loading. Called with p.mu held; it calls nothing outside the table.
func (p *peers) classifyLocked(t *wire.TransferInfo) infoRoute {
	if _, ok := p.fenced[t.AgentName]; ok {
		return infoFenced
	}
	if e, ok := p.byAgent[t.AgentName]; ok && !e.ready {
		size := 4*len(t.DstKVIndices) + 4*len(t.DstStateIndices) + 256
		if len(e.queue) < maxQueuedFrames && e.qBytes+size <= maxQueuedBytes && p.queued+size <= maxQueuedTotal {
			e.queue = append(e.queue, queuedFrame{info: t, size: size})
			e.qBytes += size
			p.queued += size
			return infoQueued
		}
		return infoRefused
	}
	return infoApply
}

// infoSink is where an info's room messages go: the engine itself
// (*actors.Engine) or a batch of the ingest's (*actors.Batch).
type infoSink interface {
	TransferInfo(roomID uint64, ti room.TransferInfo)
	Fail(roomID uint64, why room.Reason)
}

// routeInfo does what classify decided, on to.
func (p *peers) routeInfo(t *wire.TransferInfo, how infoRoute, to infoSink, rejected func(agent string) bool) {
	switch how {
	case infoFenced:
		// The room fails before it sees the info, so nothing is ever
		// written for it; the info after the failure tells decode (where
		// its release reads KV_STATUS) that the room failed.
		p.d.counters.fencedInfos.Add(1)
		to.Fail(t.Room, room.ReasonPeerLost)
		p.applyInfoTo(t, to, rejected)
	case infoRefused:
		p.d.counters.queueRefused.Add(1)
		to.Fail(t.Room, room.ReasonTransferError)
	case infoApply:
		p.applyInfoTo(t, to, rejected)
	}
}

func (p *peers) TransferInfo(t *wire.TransferInfo) {
	p.mu.Lock()
	how := p.classifyLocked(t)
	p.mu.Unlock()
	p.routeInfo(t, how, p.d.eng, p.rejected)
}

// TransferInfos is the ingest's batched hand-off (zmqio.BatchSink): a run of
// transfer infos, classified under one lock and handed to the engine as one
// message per directory shard (actors.Batch) instead of one per info. Each
// info is treated exactly as TransferInfo treats it, in the same order; the
// infos of an agent still loading are queued as before, and the run is
// flushed before the ingest hands over anything else, so a registration or
// an ABORT that follows on the socket still comes after it.
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
	p.mu.Lock()
	for _, t := range ts {
		p.routes = append(p.routes, p.classifyLocked(t))
	}
	p.mu.Unlock()
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
	if !isRejected {
		// A staging peer's regions are asked for as its info arrives
		// (SGLang's prefetch_staging_reqs; staging.go), before the room can
		// post a chunk that waits for one. Nothing without -staging.
		p.staging().info(t, p.d.cfg.PageSize)
	}
	info := room.TransferInfo{
		Agent: t.AgentName, From: room.Endpoint{IP: t.DecodeIP, Port: t.DecodePort},
		DstPages: t.DstKVIndices, DstAux: t.DstAuxIndex, Required: t.RequiredDstInfoNum,
		DstState: t.DstStateIndices, PrefixLen: t.DecodePrefixLen, Dummy: t.IsDummy(),
	}
	if isRejected {
		// The room fails with the info in one step (it learns where to send
		// the failure, and posts nothing for it); the Fail after it covers a
		// room past collecting, which absorbs a second agent's info.
		info.Refused = room.ReasonPeerRejected
	}
	to.TransferInfo(t.Room, info)
	if isRejected {
		to.Fail(t.Room, room.ReasonPeerRejected)
	}
}

// Abort: the return address is taken only when it is a registered decode's
// endpoint; any other ABORT still fails its room, but no ABORT_ACK is sent and
// no link is dialled for it (counted: abort_endpoints_refused). An ABORT from
// the endpoint of an agent still loading waits behind that agent's queued
// transfer infos, so it cannot overtake them.
func (p *peers) Abort(a *wire.Abort) {
	if a.HasEndpoint {
		from := room.Endpoint{IP: a.DecodeIP, Port: a.DecodePort}
		p.mu.Lock()
		if p.loading > 0 {
			for _, e := range p.byAgent {
				if !e.ready && e.to == from {
					if len(e.queue) < maxQueuedFrames {
						e.queue = append(e.queue, queuedFrame{abort: a})
						p.mu.Unlock()
						return
					}
					p.d.counters.queueRefused.Add(1)
					break // applied at once: it may overtake, but the room still fails
				}
			}
		}
		p.mu.Unlock()
	}
	p.applyAbort(a)
}

func (p *peers) applyAbort(a *wire.Abort) {
	var from room.Endpoint
	if a.HasEndpoint {
		from = room.Endpoint{IP: a.DecodeIP, Port: a.DecodePort}
		if !p.d.dialects.known(from) {
			p.d.counters.abortsRefused.Add(1)
			from = room.Endpoint{}
		}
	}
	if a.HasGen {
		p.d.dialects.sawGeneration(from)
		p.d.eng.DecodeAbortGen(a.Room, from, a.Generation)
		return
	}
	p.d.eng.DecodeAbort(a.Room, from)
}

// Staging routes STAGING_RSP and WATERMARK to their staging peer (staging.go);
// with -staging off, or when nobody asked for it, the frame is dropped and
// counted (staging_frames_dropped).
func (p *peers) Staging(m wire.Inbound) {
	if !p.staging().frame(m) {
		p.d.counters.staging.Add(1)
	}
}

// BadFrame: the ingest already counted and logged it; when the frame named its
// room, that room fails (invalid_request) instead of waiting for a deadline,
// and no other room is touched.
func (p *peers) BadFrame(err error) {
	p.d.counters.badFrames.Add(1)
	var fe *wire.FrameError
	if errors.As(err, &fe) && fe.HasRoom {
		p.d.eng.Fail(fe.Room, room.ReasonInvalidRequest)
	}
}

// endpointOf is where an accepted agent registered from.
func (p *peers) endpointOf(agent string) (room.Endpoint, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.byAgent[agent]; ok {
		return e.to, true
	}
	return room.Endpoint{}, false
}

// agents lists the accepted agents, loading or ready.
func (p *peers) agents() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.byAgent))
	for a := range p.byAgent {
		out = append(out, a)
	}
	return out
}

// clearFences lifts every fence (a rolled-back activation).
func (p *peers) clearFences() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.fenced)
	p.fenceOrder = nil
}

// wait waits for the registration loads in flight (shutdown, rollback).
func (p *peers) wait() {
	if p != nil {
		p.wg.Wait()
	}
}
