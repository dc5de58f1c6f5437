package decode

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/wire"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// rank is one emulated decode rank: its NIXL agent and memory, its PULL socket,
// and its PUSH links to prefill ranks (guarded by Emulator.mu). The emulator
// has a primary rank and, for workload rooms with a dummy transfer info, a
// second rank that only ever sends dummy infos.
type rank struct {
	node *kvmem.Node
	pull *zmqio.Ingest
	// tpRank is the engine_rank in the registration. The dummy rank reuses the
	// primary's (and its TP size): a prefill checks decode TP against its own,
	// and the dummy only exists to send empty transfer infos.
	tpRank int
	links  map[string]*zmqio.PushLink // prefill endpoint -> link; registration sent on creation
	// stg is the staging ring (Config.StagingBytes), stgBase its address.
	stg     []byte
	stgBase uint64
}

func newRank(cfg *Config, role string, tpRank int, onMsg func([][]byte)) (*rank, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("%s-%s-%s", cfg.Name, role, hex.EncodeToString(b[:]))
	var n *kvmem.Node
	var err error
	if cfg.NewAgent != nil {
		var a kvmem.Allocator
		if a, err = cfg.NewAgent(name); err != nil {
			return nil, fmt.Errorf("decode %s: NIXL agent: %w", role, err)
		}
		n, err = kvmem.NewOn(a, cfg.Shape, 0)
	} else {
		n, err = kvmem.New(name, cfg.Shape, 0, loopback.Options{Dir: cfg.LoopbackDir})
	}
	if err != nil {
		return nil, err
	}
	var stg []byte
	var stgBase uint64
	if cfg.StagingBytes > 0 {
		if stg, err = n.NIXL.Alloc(int(cfg.StagingBytes)); err == nil {
			stgBase = uint64(nixl.DescOf(stg, 0).Addr)
			_, err = sglang.RegisterBuffers(n.NIXL, &sglang.Buffers{Ptrs: []uint64{stgBase},
				ItemLens: []uint64{uint64(cfg.StagingBytes)}, NumSlots: 1, Kind: nixl.VRAM, DevID: uint64(cfg.GPU)})
		}
		if err != nil {
			n.Close()
			return nil, fmt.Errorf("decode %s: staging ring: %w", role, err)
		}
	}
	pull, err := zmqio.StartPull(zmqio.IngestConfig{Host: cfg.Host, Logger: cfg.Logger}, onMsg)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("decode %s: PULL socket: %w", role, err)
	}
	return &rank{node: n, pull: pull, tpRank: tpRank, links: map[string]*zmqio.PushLink{}, stg: stg, stgBase: stgBase}, nil
}

// registration is the KV-args frame (spec §4.3a) this rank sends once per
// target prefill rank.
func (r *rank) registration(cfg *Config) (*wire.Registration, error) {
	md, err := r.node.NIXL.LocalMetadata()
	if err != nil {
		return nil, err
	}
	g := r.node.Peer()
	reg := &wire.Registration{
		DecodeIP: cfg.Host, DecodePort: r.pull.Port(), AgentName: r.node.NIXL.Name(), AgentMetadata: md,
		KVDataPtrs: g.KVPtrs, AuxDataPtrs: g.AuxPtrs, StateDataPtrs: g.StatePtrs,
		GPUID: cfg.GPU, DecodeTPSize: max(cfg.TPSize, 1), DecodeTPRank: r.tpRank,
		DstKVItemLen: int(g.DstKVItemLen), DstNumSlots: g.DstNumSlots, HasDstNumSlots: true,
		KVItemLens: g.KVItemLens,
	}
	if r.stg != nil {
		reg.StagingBasePtr, reg.StagingTotalSize = r.stgBase, int64(len(r.stg))
	}
	for _, k := range g.KVKinds {
		if k == nixl.VRAM {
			reg.KVMemKinds = append(reg.KVMemKinds, wire.MemVRAM)
		} else {
			reg.KVMemKinds = append(reg.KVMemKinds, wire.MemDRAM)
		}
	}
	for _, s := range r.node.Geo.State {
		lens := make([]uint32, len(s.ItemLens))
		for i, l := range s.ItemLens {
			lens[i] = uint32(l)
		}
		reg.StateItemLens = append(reg.StateItemLens, lens)
	}
	// Every release sends msg[19..22]; K and V of layer ℓ are buffers ℓ and
	// L+ℓ: both carry layer id ℓ (MLA: one buffer per layer; a PP stage's
	// ids start at its first layer).
	reg.HasLayerInfo, reg.DCPSize = true, 1
	for _, id := range r.node.LayerIDs() {
		reg.KVLayerIDs = append(reg.KVLayerIDs, uint32(id))
	}
	if cfg.Release >= Release0523 {
		// msg[23] state_data_lens: the byte length of every state buffer.
		reg.HasStateDataLens = true
		for _, s := range r.node.Geo.State {
			lens := make([]uint64, len(s.ItemLens))
			for i, l := range s.ItemLens {
				lens[i] = l * uint64(s.NumSlots)
			}
			reg.StateDataLens = append(reg.StateDataLens, lens)
		}
	}
	return reg, nil
}

// closeLinks closes the PUSH links (caller holds Emulator.mu).
func (r *rank) closeLinks() {
	for ep, l := range r.links {
		l.Close()
		delete(r.links, ep)
	}
}

// close stops the PULL socket and frees the memory (links closed first).
func (r *rank) close() {
	r.pull.Stop()
	r.node.Close()
}
