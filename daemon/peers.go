package daemon

import (
	"errors"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport"
)

// peers is the decode-agent table and the ingest Sink. It is owned by the
// ingest goroutine: a decode sends its registration and then its transfer
// infos on one PUSH socket, so handling the registration (metadata load,
// descriptor preparation, handing the peer to the pool) before the next frame
// is read guarantees that no transfer for that agent is planned before the
// pool knows it. A per-agent actor would give that ordering up.
type peers struct {
	d       *Daemon
	byAgent map[string]*transport.Registration
	logs    transport.LogLimiter
}

func newPeers(d *Daemon) *peers {
	return &peers{d: d, byAgent: map[string]*transport.Registration{}, logs: transport.NewLogLimiter(time.Second, nil)}
}

// Registration: the first registration of an agent wins (as upstream). Its
// frame count says which SGLang release the decode runs; one that no supported
// release sends is rejected, and the agent's rooms fail with peer_rejected.
func (p *peers) Registration(r *transport.Registration) {
	d := p.d
	if _, ok := p.byAgent[r.AgentName]; ok {
		d.counters.duplicateRegistrations.Add(1)
		d.log.Info("duplicate registration ignored (first wins)", "agent", r.AgentName)
		return
	}
	dialect, err := d.dialects.register(r)
	if err != nil {
		d.counters.badRegistrations.Add(1)
		if ok, suppressed := p.logs.Allow(); ok {
			d.log.Warn("decode registration rejected; its rooms fail with peer_rejected", "agent", r.AgentName,
				"endpoint", transport.TCPEndpoint(r.DecodeIP, r.DecodePort), "err", err, "suppressed", suppressed)
		}
		return
	}
	if err := p.add(r, dialect); err != nil {
		d.counters.badRegistrations.Add(1)
		d.log.Warn("decode registration rejected; its transfer infos will fail their rooms", "agent", r.AgentName, "err", err)
		return
	}
	d.counters.registrations.Add(1)
	p.byAgent[r.AgentName] = r
	// Dial now, so the link watches the decode from its first room on.
	if _, err := d.links.get(room.Endpoint{IP: r.DecodeIP, Port: r.DecodePort}); err != nil {
		d.log.Warn("link to decode; its loss will not be detected", "agent", r.AgentName, "err", err)
	}
	d.log.Info("decode registered", "agent", r.AgentName, "endpoint", transport.TCPEndpoint(r.DecodeIP, r.DecodePort),
		"kv_buffers", len(r.KVDataPtrs), "tp", r.DecodeTPSize, "sglang", dialect.String(), "frames", r.Frames)
}

func (p *peers) add(r *transport.Registration, dialect transport.Dialect) error {
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
	if r.HasDstNumSlots {
		g.DstNumSlots = r.DstNumSlots
	}
	for _, k := range r.KVMemKinds {
		kind := nixl.VRAM
		if k == transport.MemDRAM {
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

func (p *peers) TransferInfo(t *transport.TransferInfo) {
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

func (p *peers) Abort(a *transport.Abort) {
	var from room.Endpoint
	if a.HasEndpoint {
		from = room.Endpoint{IP: a.DecodeIP, Port: a.DecodePort}
	}
	if a.HasGen {
		p.d.dialects.sawGeneration(from)
		p.d.eng.DecodeAbortGen(a.Room, from, a.Generation)
		return
	}
	p.d.eng.DecodeAbort(a.Room, from)
}

func (p *peers) Staging(transport.Inbound) { p.d.counters.staging.Add(1) }

// BadFrame: the ingest already counted and logged it; when the frame named its
// room, that room fails (invalid_request) instead of waiting for a deadline,
// and no other room is touched.
func (p *peers) BadFrame(err error) {
	p.d.counters.badFrames.Add(1)
	var fe *transport.FrameError
	if errors.As(err, &fe) && fe.HasRoom {
		p.d.eng.Fail(fe.Room, room.ReasonInvalidRequest)
	}
}
