package sglang

import (
	"math"

	"github.com/kvxfer/kvxfer/nixl"
)

// Buffers is a set of same-shaped buffers of one memory kind: base addresses,
// bytes per slot (item length) and slots per buffer.
type Buffers struct {
	Ptrs     []uint64
	ItemLens []uint64 // one per Ptrs entry
	NumSlots int      // slots in every buffer (data_len / item_len)
	Kind     nixl.MemKind
	DevID    uint64 // GPU index for VRAM, 0 for DRAM
}

// Regions returns one registration descriptor per buffer, NumSlots items long.
func (b *Buffers) Regions() []nixl.Desc {
	out := make([]nixl.Desc, len(b.Ptrs))
	for i, p := range b.Ptrs {
		out[i] = nixl.Desc{Addr: uintptr(p), Len: b.ItemLens[i] * uint64(b.NumSlots), DevID: b.DevID}
	}
	return out
}

func (b *Buffers) validate(what string) error {
	if len(b.ItemLens) != len(b.Ptrs) {
		return nixl.Errorf(nixl.ErrInvalid, "sglang geometry: %s has %d ptrs and %d item lens", what, len(b.Ptrs), len(b.ItemLens))
	}
	if len(b.Ptrs) > 0 && b.NumSlots <= 0 {
		return nixl.Errorf(nixl.ErrInvalid, "sglang geometry: %s has %d slots", what, b.NumSlots)
	}
	if uint64(len(b.Ptrs))*uint64(b.NumSlots) > math.MaxInt32 {
		return nixl.Errorf(nixl.ErrInvalid, "sglang geometry: %s has %d×%d descriptors, more than int32 indices", what, len(b.Ptrs), b.NumSlots)
	}
	for i, l := range b.ItemLens {
		if l == 0 || b.Ptrs[i] == 0 || l*uint64(b.NumSlots)/uint64(b.NumSlots) != l {
			return nixl.Errorf(nixl.ErrInvalid, "sglang geometry: %s buffer %d ptr %#x item len %d", what, i, b.Ptrs[i], l)
		}
	}
	return nil
}

// Local is the prefill rank's geometry (its KVArgs).
type Local struct {
	// KV buffers in SGLang order: K of every layer, then V of every layer (MHA);
	// one buffer per layer for MLA.
	KV Buffers
	// Aux (metadata) buffers in SGLang order; the last one is bootstrap_room.
	// Always DRAM, device 0. NumSlots is the metadata buffer's slot count,
	// which decode shares (identical MetadataBuffers shapes).
	Aux Buffers
	// State components (Mamba, SWA, ...), each a set of buffers indexed by slot.
	State []Buffers
	// Sender is this rank's sender id (SenderID(pp_rank, tp_size, tp_rank)).
	Sender int
	// NoKV selects the aux_nokv notification form.
	NoKV NoKVForm
	// TPSize is the prefill attention TP size and MLA says whether KV is MLA
	// (one buffer per layer, replicated across TP). Page-per-descriptor
	// transfers are only correct for MLA or equal TP; NewPeer rejects other
	// peers (SGLang's send_kvcache_slice head slicing is not implemented).
	TPSize int
	MLA    bool
}

// Validate checks the local geometry once, at startup.
func (l *Local) Validate() error {
	if len(l.KV.Ptrs) == 0 {
		return nixl.Errorf(nixl.ErrInvalid, "sglang geometry: no KV buffers")
	}
	if err := l.KV.validate("local KV"); err != nil {
		return err
	}
	if err := l.Aux.validate("local aux"); err != nil {
		return err
	}
	if l.Aux.Kind != nixl.DRAM || l.Aux.DevID != 0 {
		return nixl.Errorf(nixl.ErrInvalid, "sglang geometry: aux buffers must be DRAM device 0")
	}
	for i := range l.State {
		if err := l.State[i].validate("local state"); err != nil {
			return err
		}
	}
	return nil
}

// PeerGeometry is what a decode rank's registration frame (spec §4.3a) says.
type PeerGeometry struct {
	Agent string // NIXL agent name ([3]); must be loaded into the agent
	// KVPtrs ([5]) in decode's order. Decode may have more buffers than prefill
	// (draft layers); the first len(Local.KV.Ptrs) are used. For PP>1 the caller
	// passes the buffers of this prefill stage's layers.
	KVPtrs []uint64
	// KVItemLens ([18]); empty means DstKVItemLen ([11]) for every buffer.
	KVItemLens   []uint64
	DstKVItemLen uint64
	// DstNumSlots ([16]); 0 means "use prefill's slot count".
	DstNumSlots int
	// KVKinds ([17]); empty means all VRAM. Mixed kinds are not supported here.
	KVKinds []nixl.MemKind
	GPU     uint64 // [8]; device id of VRAM destinations
	// AuxPtrs ([6]), DRAM device 0, same shapes as the local aux buffers.
	AuxPtrs []uint64
	// StatePtrs ([7]), one list per state component.
	StatePtrs [][]uint64
	// TPSize is decode's attn_tp_size ([9]); 0 skips the equal-TP check.
	TPSize int
	// StateSlots optionally bounds destination state indices per component
	// (0 or absent: only the agent's region check applies).
	StateSlots []int
	// NoNotifs: the decode neither posts nor reads NIXL notifications (SGLang
	// 0.5.23 completes on KV_STATUS); notifications sent to it would pile up
	// in its agent, so none are attached to its writes.
	NoNotifs bool
}

// Peer is a validated decode peer, ready for planning.
type Peer struct {
	Agent    string
	NoNotifs bool    // see PeerGeometry.NoNotifs
	kv       Buffers // decode KV: first n buffers, decode item lens, dst slots
	aux      []uint64
	state    [][]uint64
	stSlots  []int
	nbuf     int
	kvKind   nixl.MemKind
	kvDevice uint64
	gpu      uint64
}

// NewPeer validates a decode peer against the local geometry, the checks
// SGLang does in _add_remote_peer / _prepare_payload_xfer, so that a bad
// registration fails here and not in the middle of a transfer.
func NewPeer(l *Local, g PeerGeometry) (*Peer, error) {
	n := len(l.KV.Ptrs)
	if g.Agent == "" {
		return nil, nixl.Errorf(nixl.ErrInvalid, "sglang peer: empty agent name")
	}
	if len(g.KVPtrs) < n {
		return nil, nixl.Errorf(nixl.ErrInvalid, "sglang peer %s: %d KV buffers, prefill has %d", g.Agent, len(g.KVPtrs), n)
	}
	if !l.MLA && l.TPSize > 0 && g.TPSize > 0 && l.TPSize != g.TPSize {
		return nil, nixl.Errorf(nixl.ErrInvalid, "sglang peer %s: heterogeneous TP (prefill %d, decode %d) needs head slicing, which is not supported", g.Agent, l.TPSize, g.TPSize)
	}
	p := &Peer{Agent: g.Agent, NoNotifs: g.NoNotifs, nbuf: n, kvKind: nixl.VRAM, gpu: g.GPU}
	if len(g.KVKinds) > 0 {
		if len(g.KVKinds) != len(g.KVPtrs) {
			return nil, nixl.Errorf(nixl.ErrInvalid, "sglang peer %s: %d mem kinds for %d KV buffers", g.Agent, len(g.KVKinds), len(g.KVPtrs))
		}
		p.kvKind = g.KVKinds[0]
		for _, k := range g.KVKinds[:n] {
			if k != p.kvKind {
				return nil, nixl.Errorf(nixl.ErrInvalid, "sglang peer %s: mixed VRAM/DRAM KV destinations are not supported", g.Agent)
			}
		}
	}
	if p.kvKind == nixl.VRAM {
		p.kvDevice = g.GPU
	}
	items := g.KVItemLens
	if len(items) == 0 {
		items = make([]uint64, len(g.KVPtrs))
		for i := range items {
			items[i] = g.DstKVItemLen
		}
	}
	if len(items) != len(g.KVPtrs) {
		return nil, nixl.Errorf(nixl.ErrInvalid, "sglang peer %s: %d KV item lens for %d buffers", g.Agent, len(items), len(g.KVPtrs))
	}
	slots := g.DstNumSlots
	if slots == 0 {
		slots = l.KV.NumSlots
	}
	p.kv = Buffers{Ptrs: g.KVPtrs[:n], ItemLens: items[:n], NumSlots: slots, Kind: p.kvKind, DevID: p.kvDevice}
	if err := p.kv.validate("decode KV"); err != nil {
		return nil, err
	}
	for i := range n {
		// Transfer length is prefill's item len, stride is decode's: a longer
		// source page would spill into the next decode slot.
		if l.KV.ItemLens[i] > p.kv.ItemLens[i] {
			return nil, nixl.Errorf(nixl.ErrInvalid, "sglang peer %s: KV buffer %d prefill item len %d > decode %d", g.Agent, i, l.KV.ItemLens[i], p.kv.ItemLens[i])
		}
	}
	if len(l.Aux.Ptrs) > 0 && len(g.AuxPtrs) < len(l.Aux.Ptrs) {
		return nil, nixl.Errorf(nixl.ErrInvalid, "sglang peer %s: %d aux buffers, prefill has %d", g.Agent, len(g.AuxPtrs), len(l.Aux.Ptrs))
	}
	p.aux = g.AuxPtrs
	p.state = g.StatePtrs
	p.stSlots = g.StateSlots
	return p, nil
}

// KVSrcDescs is the local prepared list: every slot of every KV buffer,
// (base_ℓ + s·item_ℓ, item_ℓ), index ℓ·NumSlots + s.
func KVSrcDescs(l *Local) []nixl.Desc {
	return slotDescs(l.KV.Ptrs, l.KV.ItemLens, l.KV.ItemLens, l.KV.NumSlots, l.KV.DevID)
}

// KVDstDescs is a decode peer's prepared list: for the first len(local) decode
// buffers, every one of decode's slots, stride = decode item len, length =
// prefill item len, index ℓ·dst_num_slots + s.
func KVDstDescs(l *Local, p *Peer) []nixl.Desc {
	return slotDescs(p.kv.Ptrs, p.kv.ItemLens, l.KV.ItemLens, p.kv.NumSlots, p.kvDevice)
}

func slotDescs(ptrs, strides, lens []uint64, slots int, dev uint64) []nixl.Desc {
	out := make([]nixl.Desc, 0, len(ptrs)*slots)
	for b, base := range ptrs {
		for s := range slots {
			out = append(out, nixl.Desc{Addr: uintptr(base + uint64(s)*strides[b]), Len: lens[b], DevID: dev})
		}
	}
	return out
}

// PrepLocalKV prepares the local KV list once (shared by every peer).
func PrepLocalKV(a nixl.Agent, l *Local) (nixl.ListID, error) {
	return a.Prep("", l.KV.Kind, KVSrcDescs(l))
}

// PrepPeerKV prepares a decode peer's KV list once, after LoadPeer.
func PrepPeerKV(a nixl.Agent, l *Local, p *Peer) (nixl.ListID, error) {
	return a.Prep(p.Agent, p.kvKind, KVDstDescs(l, p))
}

// RegisterBuffers registers each buffer set (KV, aux, state) as one region per
// buffer, the way SGLang's register_buffer_to_engine does.
func RegisterBuffers(a nixl.Agent, sets ...*Buffers) ([]nixl.RegID, error) {
	var ids []nixl.RegID
	for _, b := range sets {
		if len(b.Ptrs) == 0 {
			continue
		}
		id, err := a.Register(b.Kind, b.Regions())
		if err != nil {
			return ids, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// AsPeer describes this geometry the way its registration frame would, for a
// decode rank (fake decode peers and tests register a Local and announce it).
func (l *Local) AsPeer(agent string) PeerGeometry {
	g := PeerGeometry{
		Agent: agent, KVPtrs: l.KV.Ptrs, KVItemLens: l.KV.ItemLens, DstNumSlots: l.KV.NumSlots,
		GPU: l.KV.DevID, AuxPtrs: l.Aux.Ptrs, TPSize: l.TPSize,
	}
	if len(l.KV.ItemLens) > 0 {
		g.DstKVItemLen = l.KV.ItemLens[0]
	}
	for range l.KV.Ptrs {
		g.KVKinds = append(g.KVKinds, l.KV.Kind)
	}
	for _, s := range l.State {
		g.StatePtrs = append(g.StatePtrs, s.Ptrs)
		g.StateSlots = append(g.StateSlots, s.NumSlots)
	}
	return g
}
