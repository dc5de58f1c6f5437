package daemon

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// peers is the decode-agent table and the ingest Sink. It is owned by the
// ingest goroutine: a decode sends its registration and then its transfer
// infos on one PUSH socket, so handling the registration (metadata load,
// descriptor preparation, handing the peer to the pool) before the next frame
// is read guarantees that no transfer for that agent is planned before the
// pool knows it. A per-agent actor would give that ordering up.
//
// byAgent holds the accepted agents, at most max (the link cap: each has a
// pinned link). Registrations write it on the ingest goroutine; drops (a lost
// connection, a lost NIXL peer) delete from it on others, hence mu.
type peers struct {
	d   *Daemon
	max int

	mu      sync.Mutex
	byAgent map[string]*wire.Registration

	dupLogs, rejectLogs, addLogs *logLimiter
}

func newPeers(d *Daemon, maxPeers int) *peers {
	s := &d.counters.logsSuppressed
	return &peers{d: d, max: maxPeers, byAgent: map[string]*wire.Registration{},
		dupLogs: newLogLimiter(time.Second, s), rejectLogs: newLogLimiter(time.Second, s),
		// Honest registrations come in bursts at start-up: 20 lines a second.
		addLogs: newLogLimiter(50*time.Millisecond, s)}
}

// Registration: the first registration of an agent wins (as upstream). Its
// frame count says which SGLang release the decode runs; one that no supported
// release sends is rejected, and the agent's rooms fail with peer_rejected.
// A new agent at the endpoint of an accepted one means that decode restarted:
// the old agent is dropped first. Past the peer cap, registrations are
// rejected (peer_rejected, with the reason).
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

// register reports whether r was accepted.
func (p *peers) register(r *wire.Registration, frames [][]byte, replay bool) bool {
	d := p.d
	to := room.Endpoint{IP: r.DecodeIP, Port: r.DecodePort}
	p.mu.Lock()
	_, dup := p.byAgent[r.AgentName]
	p.mu.Unlock()
	if dup {
		d.counters.duplicateRegistrations.Add(1)
		if ok, suppressed := p.dupLogs.allow(); ok {
			d.log.Info("duplicate registration ignored (first wins)", "agent", r.AgentName, "suppressed", suppressed)
		}
		return false
	}
	if old := d.dialects.acceptedAt(to); old != "" && old != r.AgentName {
		d.dropAgent(old, "re-registered: a new agent registered from its endpoint", false)
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
		return false
	}
	if err := p.add(r, dialect); err != nil {
		if replay {
			// The decode is gone (or changed): forget it, quietly.
			d.dialects.drop(r.AgentName, "replayed registration no longer loads", false)
			d.state.remove(r.AgentName)
			d.log.Info("replayed decode registration dropped: it no longer loads", "agent", r.AgentName,
				"endpoint", to.String(), "err", err)
			return false
		}
		// Refused by SGLang's geometry rules (or NIXL): its rooms fail
		// peer_rejected, and decode is told SGLang's reason.
		d.dialects.reject(r, err)
		d.counters.badRegistrations.Add(1)
		if ok, suppressed := p.rejectLogs.allow(); ok {
			d.log.Warn("decode registration rejected; its transfer infos will fail their rooms", "agent", r.AgentName,
				"err", err, "suppressed", suppressed)
		}
		return false
	}
	d.counters.registrations.Add(1)
	p.mu.Lock()
	p.byAgent[r.AgentName] = r
	p.mu.Unlock()
	if frames != nil {
		d.state.put(r, frames)
	}
	// Dial now (pinned), so the link watches the decode from its first room on.
	if _, err := d.links.get(to, true); err != nil {
		if ok, suppressed := p.rejectLogs.allow(); ok {
			d.log.Warn("link to decode; its loss will not be detected", "agent", r.AgentName, "err", err, "suppressed", suppressed)
		}
	}
	if ok, suppressed := p.addLogs.allow(); ok {
		d.log.Info("decode registered", "agent", r.AgentName, "endpoint", to.String(),
			"kv_buffers", len(r.KVDataPtrs), "tp", r.DecodeTPSize, "sglang", dialect.String(), "frames", r.Frames,
			"suppressed", suppressed)
	}
	return true
}

// dropAgent forgets an accepted decode agent: its rooms fail peer_lost, the
// pool and the NIXL agent drop it (its memory is unmapped), its entry is
// marked dropped and its link is closed. lost says its connection was lost.
// Idempotent; safe from any goroutine but a link's monitor (it may wait on
// the NIXL agent).
func (d *Daemon) dropAgent(agent, why string, lost bool) {
	p := d.peers
	p.mu.Lock()
	_, ok := p.byAgent[agent]
	delete(p.byAgent, agent)
	p.mu.Unlock()
	to, known := d.dialects.drop(agent, why, lost)
	d.state.remove(agent)
	if !ok && !known {
		return
	}
	d.counters.peersDropped.Add(1)
	d.eng.PeerLost(agent)
	d.mu.Lock()
	nx, pool := d.agent, d.pool
	d.mu.Unlock()
	if pool != nil {
		pool.RemovePeer(agent)
	}
	if nx != nil && ok {
		_ = nx.DropPeer(agent)
	}
	if known {
		d.links.retire(to)
	}
	if ok, suppressed := d.dropLogs.allow(); ok {
		d.log.Warn("decode agent dropped; its rooms fail peer_lost", "agent", agent, "endpoint", to.String(), "why", why,
			"suppressed", suppressed)
	}
}

func (p *peers) add(r *wire.Registration, dialect wire.Dialect) error {
	d := p.d
	d.mu.Lock()
	agent, pool := d.agent, d.pool
	d.mu.Unlock()
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

func (p *peers) TransferInfo(t *wire.TransferInfo) {
	defer func() {
		if p.d.dialects.rejection(t.AgentName) != "" {
			// After the info, so the room knows where to send the failure.
			p.d.eng.Fail(t.Room, room.ReasonPeerRejected)
		}
	}()
	p.d.eng.TransferInfo(t.Room, room.TransferInfo{
		Agent: t.AgentName, From: room.Endpoint{IP: t.DecodeIP, Port: t.DecodePort},
		DstPages: t.DstKVIndices, DstAux: t.DstAuxIndex, Required: t.RequiredDstInfoNum,
		DstState: t.DstStateIndices, PrefixLen: t.DecodePrefixLen, Dummy: t.IsDummy(),
	})
}

// Abort: the return address is taken only when it is a registered decode's
// endpoint; any other ABORT still fails its room, but no ABORT_ACK is sent and
// no link is dialled for it (counted: abort_endpoints_refused).
func (p *peers) Abort(a *wire.Abort) {
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

func (p *peers) Staging(wire.Inbound) { p.d.counters.staging.Add(1) }

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
