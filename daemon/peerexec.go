package daemon

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/peer"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// peerLocal is the daemon's own state of one peer, kept by its actor and
// touched only there (actors.PeerCtx.Local).
type peerLocal struct {
	view *peerView   // what the ingest reads (peers.views)
	cur  *regPayload // the registration of the incarnation loading or loaded
	to   kv.Endpoint
	// dialect is what the incarnation's decode speaks, decided when its
	// registration was accepted (the dialect table publishes it to the
	// other readers).
	dialect  wire.Dialect
	started  time.Time // on the daemon's clock, when its load began
	restored bool
	// link is the incarnation's pinned link to its decode (links.pin),
	// dialled when it is ready and unpinned when it ends; a fenced
	// incarnation keeps it (the rooms its fence fails still tell decode)
	// into its restore. Shutdown leaves it to links.closeAll.
	link    *linkEntry
	holding bool // counted in peers.slots
	gated   bool // counted in peers.gated
	fenced  bool // counted in peers.fenced
	// writes are the writes the machine holds, by ID (it names them in
	// Post and Fail); probed is when the last probe began (its rate bound).
	writes map[uint64]*heldWrite
	probed time.Time
	// stepped counts the writes stepped; a probe reads it as it begins.
	stepped atomic.Uint64
	// stg is the incarnation's staging state (its regions, watermark, ring
	// and held chunks; staging.go), set when it is loaded, gone when it ends.
	stg stagingLocal
}

// Exec implements actors.PeerExec: it is the one place a peer's effects are
// executed, on that peer's actor, in the machine's order (effects.go). Work
// that may block (the NIXL load, a probe) runs on a goroutine of its own and
// comes back as peer.LoadDone or peer.Probed. At shutdown what the daemon
// closes wholesale next (the pool, NIXL, the links, the state file) is not
// released peer by peer.
func (p *peers) Exec(pc *actors.PeerCtx, fx peer.Effects) {
	d := p.d
	l, _ := pc.Local.(*peerLocal)
	if l == nil {
		l = &peerLocal{}
		pc.Local = l
	}
	fromIngest := false
	switch m := pc.Msg.(type) {
	case peer.Register:
		l.view, fromIngest = m.Reg.(*regPayload).view, true
	case peer.Info:
		fromIngest = true
	case peer.Write:
		l.stepped.Add(1)               // as the machine counts them (peer.Probed.Began)
		switch h := m.Payload.(type) { // the machine names it by ID from now on
		case *heldWrite:
			if l.writes == nil {
				l.writes = map[uint64]*heldWrite{}
			}
			l.writes[m.ID] = h
		case *stagedChunk:
			l.stg.hold(m.ID, h)
		}
	}
	_, shutdown := pc.Msg.(peer.Shutdown)
	// The state is published before the effects when it sends the ingest
	// through the actor (loading, fenced, closed: nothing the ingest reads
	// after, or counts after, goes straight to a room), and after them when
	// it lets the ingest go straight to the rooms (ready: what the actor
	// applies now, its queue, comes first).
	direct := !(&peerView{}).viaActorIn(pc.State)
	if !direct && l.view != nil {
		l.view.state.Store(uint32(pc.State))
	}
	defer func() {
		count(&p.slots, &l.holding, pc.State == peer.Loading || pc.State.Live())
		count(&p.gated, &l.gated, pc.WritesVia)
		count(&p.fenced, &l.fenced, pc.State == peer.Fenced)
		if l.view != nil {
			l.view.state.Store(uint32(pc.State))
			if fromIngest {
				l.view.pending.Add(-1)
			}
		}
	}()
	agent := pc.Agent

	_, xferFailed := pc.Msg.(peer.XferFailed)
	for _, n := range fx.Notes {
		switch n {
		case peer.NoteLost:
			if !xferFailed { // a transfer's loss is the pool's to count
				d.counters.peersLost.Add(1)
				if ok, suppressed := d.lostLogs.allow(); ok {
					d.log.Warn("decode lost; its rooms fail peer_lost", "agent", agent, "endpoint", l.to.String(),
						"why", fx.Reason, "fenced", fx.Has(peer.NoteFenced), "suppressed", suppressed)
				}
			}
		case peer.NoteFenced:
			d.counters.peersFenced.Add(1)
		case peer.NoteDuplicate:
			d.counters.duplicateRegistrations.Add(1)
			if ok, suppressed := p.dupLogs.allow(); ok {
				r := pc.Msg.(peer.Register)
				d.log.Info("duplicate registration ignored (first wins)", "agent", agent, "endpoint", kv.Endpoint(r.From).String(),
					"loading", pc.State == peer.Loading, "suppressed", suppressed)
			}
		case peer.NoteReturned:
			d.counters.peersReturned.Add(1)
		case peer.NoteQueueRefused:
			d.counters.queueRefused.Add(1)
		case peer.NoteFencedInfo:
			d.counters.fencedInfos.Add(1)
		}
	}
	if fx.Release != 0 && !shutdown {
		d.releaseAgent(agent, true)
	}
	if fx.FailRooms || shutdown {
		p.stg.ended(&l.stg) // its held chunks are in fx.Fail
		if l.view != nil {
			l.view.stages.Store(false)
		}
	}
	if fx.FailRooms {
		p.forget(agent, l, fx.Reason, fx.Has(peer.NoteLost), pc.State == peer.Fenced)
	}
	for _, id := range fx.Fail { // after the rooms: the decode is dropped first
		if h := l.take(id); h != nil {
			h.fail()
		} else if c := p.stg.take(&l.stg, id); c != nil {
			c.done(kv.ReasonPeerLost, nil)
		}
	}
	for _, id := range fx.Withdrawn {
		if c := p.stg.take(&l.stg, id); c != nil {
			p.stg.withdraw(c)
		}
	}
	if fx.CloseLink && !shutdown {
		p.unlink(l)
	}
	if fx.Forget && !shutdown {
		d.state.remove(agent)
	}
	if ld, ok := pc.Msg.(peer.LoadDone); ok && ld.Err != "" && l.cur != nil {
		p.loadFailed(agent, l, ld.Err, fx)
	}
	if fx.Load != nil {
		p.startLoad(pc, l, fx.Load)
	}
	if fx.Dial {
		p.ready(agent, l)
	}
	for _, i := range fx.Apply {
		p.letGo(i)
		if ip, ok := i.Payload.(*infoPayload); ok {
			if ip.a != nil {
				p.applyAbort(ip.a)
			} else {
				// A staging peer's regions are asked for as its info
				// arrives (SGLang's prefetch_staging_reqs), before the room
				// can post a chunk that waits for one.
				p.stg.info(l.stg.p, ip.t, d.cfg.PageSize)
				p.applyInfo(ip.t)
			}
		}
	}
	for _, i := range fx.FailInfos {
		p.letGo(i)
		// The room fails before it sees the info, so nothing is ever
		// written for it; the info after the failure tells decode (where
		// its release reads KV_STATUS) that the room failed.
		if ip, ok := i.Payload.(*infoPayload); ok && ip.t != nil {
			d.eng.Fail(ip.t.Room, kv.ReasonPeerLost)
			p.applyInfo(ip.t)
		}
	}
	for _, i := range fx.Refuse {
		p.letGo(i)
		if !shutdown { // else the engine's close fails it (shutdown)
			d.eng.Fail(i.Room, kv.ReasonTransferError)
		}
	}
	for _, id := range fx.Post { // in the machine's order: held ones before those confirmed after
		if h := l.take(id); h != nil {
			h.post()
		} else if c := p.stg.take(&l.stg, id); c != nil {
			p.stg.post(&l.stg, c, pc.Report)
		}
	}
	p.stageStep(pc, l, fx)
	if fx.Probe && !shutdown {
		_, back := pc.Msg.(peer.Probed) // the next round of confirmations: rate-bound
		l.probed = d.liveness.probe(l.to, l.probed, back, &l.stepped, pc.Report)
	}
}

// stageStep is a step's staging part: a staged write the machine holds
// waiting is recorded (and released at once when its region is writable or
// it can never be written), a staging frame is applied to the regions, and
// what that made writable is released (peer.Writable, to this actor).
func (p *peers) stageStep(pc *actors.PeerCtx, l *peerLocal, fx peer.Effects) {
	var release []uint64
	switch m := pc.Msg.(type) {
	case peer.Write:
		if !m.Staged {
			return
		}
		if p.stg.handed(&l.stg, m.ID) {
			release = []uint64{m.ID}
		}
	case peer.Staging:
		var dropped bool
		release, dropped = p.stg.staging(&l.stg, m.Payload)
		if dropped {
			p.d.counters.staging.Add(1)
		}
	}
	if len(release) > 0 {
		pc.Report(peer.Writable{IDs: release})
	}
}

// count keeps one peer's place in a daemon-wide count.
func count(n *atomic.Int64, in *bool, now bool) {
	if now != *in {
		*in = now
		if now {
			n.Add(1)
		} else {
			n.Add(-1)
		}
	}
}

// take hands over the held write the machine names.
func (l *peerLocal) take(id uint64) *heldWrite {
	h := l.writes[id]
	delete(l.writes, id)
	return h
}

func (p *peers) letGo(i peer.Info) {
	if ip, ok := i.Payload.(*infoPayload); ok && ip.size > 0 {
		p.queued.Add(-int64(ip.size))
	}
}

// forget is the bookkeeping of an incarnation that ended: the agent leaves
// the dialect table, its rooms fail peer_lost, and its link goes unless it is
// fenced (the link then tells decode of the rooms the fence fails, until the
// peer goes).
func (p *peers) forget(agent string, l *peerLocal, why string, lost, fenced bool) {
	d := p.d
	to, _ := d.dialects.drop(agent, why, lost)
	d.counters.peersDropped.Add(1)
	d.eng.PeerLost(agent)
	if ok, suppressed := d.dropLogs.allow(); ok {
		d.log.Warn("decode agent dropped; its rooms fail peer_lost", "agent", agent, "endpoint", to.String(), "why", why,
			"suppressed", suppressed)
	}
	if !fenced {
		p.unlink(l)
	}
}

// unlink retires the incarnation's pinned link (in the background): a
// decode that registers at the endpoint again, under any name, dials its own.
func (p *peers) unlink(l *peerLocal) {
	if l.link != nil {
		p.d.links.unpin(l.link)
		l.link = nil
	}
}

// startLoad begins an incarnation's load: a restore only while its endpoint
// is free and the cap allows; a new agent at the endpoint of another drops
// that one (its decode restarted); the dialect is recorded (or the
// registration refused); the NIXL load runs off the actor.
func (p *peers) startLoad(pc *actors.PeerCtx, l *peerLocal, ld *peer.Load) {
	d := p.d
	rp := ld.Reg.(*regPayload)
	r := rp.r
	to := kv.Endpoint{IP: r.DecodeIP, Port: r.DecodePort}
	l.cur, l.to, l.started, l.restored = rp, to, d.now(), ld.Restored
	inc, report := ld.Inc, pc.Report
	if ld.Restored {
		other := d.dialects.acceptedAt(to)
		if other != "" && other != pc.Agent || !l.holding && p.slots.Load() >= int64(p.max) {
			// Another agent took the endpoint, or no room: it stays forgotten.
			report(peer.LoadDone{Inc: inc, Err: "restore refused"})
			return
		}
	}
	if old := d.dialects.acceptedAt(to); old != "" && old != pc.Agent {
		p.actors.Send(old, peer.Drop{Why: "re-registered: a new agent registered from its endpoint"})
	}
	if !ld.Restored && p.fenced.Load() > 0 {
		// A registration from a fenced peer's endpoint: whatever the
		// fenced agents there had is past (only a fenced one acts on it).
		p.actors.SendAt(peer.Endpoint(to), peer.Back{})
	}
	dialect, err := d.dialects.register(r)
	if err != nil {
		rp.rejected = true
		report(peer.LoadDone{Inc: inc, Err: err.Error()})
		return
	}
	l.dialect = dialect
	go func() { // NIXL may take its time: never on the actor
		e := ""
		if err := p.add(r, dialect); err != nil {
			e = err.Error()
			if e == "" {
				e = "load failed"
			}
		}
		report(peer.LoadDone{Inc: inc, Err: e, At: p.d.liveness.clk.Now()})
	}()
}

// loadFailed records a registration that did not load: a replay quietly
// forgotten, a restore quietly ended, any other rejected (its rooms fail
// peer_rejected, and decode is told SGLang's reason).
func (p *peers) loadFailed(agent string, l *peerLocal, why string, fx peer.Effects) {
	d := p.d
	r := l.cur.r
	switch {
	case fx.Has(peer.NoteReplayFailed):
		d.dialects.drop(agent, "replayed registration no longer loads", false)
		d.log.Info("replayed decode registration dropped: it no longer loads", "agent", agent,
			"endpoint", l.to.String(), "err", why)
	case fx.Has(peer.NoteRejected):
		if !l.cur.rejected {
			d.dialects.reject(r, errors.New(why))
		}
		d.counters.badRegistrations.Add(1)
		if ok, suppressed := p.rejectLogs.allow(); ok {
			d.log.Warn("decode registration rejected; its transfer infos will fail their rooms", "agent", agent,
				"endpoint", l.to.String(), "err", why, "suppressed", suppressed)
		}
	}
}

// ready is an incarnation loaded: staging, the state file, the pinned link
// (so it watches the decode from its first room on) and the probes.
func (p *peers) ready(agent string, l *peerLocal) {
	d := p.d
	r := l.cur.r
	dialect := l.dialect
	p.stg.began(&l.stg, r, !dialect.Notifs())
	if l.stg.p != nil && l.view != nil {
		l.view.stages.Store(true) // from now on its infos come through here
	}
	if l.cur.frames != nil && !l.restored {
		d.state.put(r, l.cur.frames)
	}
	d.counters.registrations.Add(1) // once it is kept: a shutdown that follows the count keeps it
	// A restore keeps the link it was fenced with; any other incarnation
	// dials its own.
	if !l.link.current() || l.link.to != l.to {
		p.unlink(l)
		var err error
		if l.link, err = d.links.pin(l.to); err != nil {
			if ok, suppressed := p.rejectLogs.allow(); ok {
				d.log.Warn("link to decode; its loss will not be detected", "agent", agent, "err", err, "suppressed", suppressed)
			}
		}
	}
	if ok, suppressed := p.addLogs.allow(); ok {
		d.log.Info("decode registered", "agent", agent, "endpoint", l.to.String(),
			"kv_buffers", len(r.KVDataPtrs), "tp", r.DecodeTPSize, "sglang", dialect.String(), "frames", r.Frames,
			"load", d.now().Sub(l.started).String(), "suppressed", suppressed)
	}
}
