package daemon

import (
	"errors"

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
}

func newPeers(d *Daemon) *peers { return &peers{d: d, byAgent: map[string]*transport.Registration{}} }

// Registration: the first registration of an agent wins (as upstream).
func (p *peers) Registration(r *transport.Registration) {
	d := p.d
	if _, ok := p.byAgent[r.AgentName]; ok {
		d.counters.duplicateRegistrations.Add(1)
		d.log.Info("duplicate registration ignored (first wins)", "agent", r.AgentName)
		return
	}
	if err := p.add(r); err != nil {
		d.counters.badRegistrations.Add(1)
		d.log.Warn("decode registration rejected; its transfer infos will fail their rooms", "agent", r.AgentName, "err", err)
		return
	}
	d.counters.registrations.Add(1)
	p.byAgent[r.AgentName] = r
	d.log.Info("decode registered", "agent", r.AgentName, "endpoint", transport.TCPEndpoint(r.DecodeIP, r.DecodePort),
		"kv_buffers", len(r.KVDataPtrs), "tp", r.DecodeTPSize)
}

func (p *peers) add(r *transport.Registration) error {
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
