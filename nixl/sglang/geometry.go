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
	// TPSize is the prefill attention TP size, TPRank this rank's engine_rank,
	// and MLA says whether KV is MLA (one buffer per layer, replicated across
	// TP). MHA peers of another TP size get per-token head slices
	// (send_kvcache_slice); that needs the KV head counts and the page size.
	TPSize, TPRank int
	MLA            bool
	// KVHeadNum is this rank's KV heads (MHA), TotalKVHeads the model's
	// (0: KVHeadNum·TPSize). PageSize is tokens per page (0: 1).
	KVHeadNum, TotalKVHeads int
	PageSize                int
	// PPSize is the prefill pipeline size and StartLayer this stage's first
	// model layer (prefill_start_layer): a PP stage writes its layers into the
	// matching decode buffers. KVLayerIDs are the model layer of every local
	// KV buffer (SGLang's kv_layer_ids; empty for plain pools): with the
	// decode's ids from its registration they pair buffers by layer.
	PPSize, StartLayer int
	KVLayerIDs         []int
	// MergeKV makes Plan send a whole-page KV request as explicit
	// descriptors, one per buffer and run of pages consecutive on both sides
	// (merge.go), instead of SGLang's one prepared index per buffer and page,
	// whenever that at least halves the descriptors. Off: SGLang's indices.
	MergeKV bool
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
	// KVKinds ([17]); empty means all VRAM. Mixed kinds (HiSparse) move in one
	// part per run of equal kinds ("_part_i_n"), on the equal-TP/MLA path only.
	KVKinds []nixl.MemKind
	GPU     uint64 // [8]; device id of VRAM destinations
	// AuxPtrs ([6]), DRAM device 0, same shapes as the local aux buffers.
	AuxPtrs []uint64
	// StatePtrs ([7]), one list per state component.
	StatePtrs [][]uint64
	// TPSize is decode's attn_tp_size ([9]) and TPRank its engine_rank
	// ([10]); TPSize 0 means "same as prefill".
	TPSize, TPRank int
	// KVLayerIDs ([20]) are the model layer of each decode KV buffer (empty
	// for plain pools); DCPSize ([21]) is decode's context-parallel size.
	KVLayerIDs []uint32
	DCPSize    int
	// Rules is the SGLang release whose prefill geometry rules apply.
	Rules Rules
	// StateSlots optionally bounds destination state indices per component
	// (0 or absent: only the agent's region check applies).
	StateSlots []int
	// StateItemLens ([12]) are decode's state item lengths per component and
	// buffer (empty: unknown). Across TP sizes a state buffer is copied whole
	// only when both sides hold slots of one size (replicated, not sharded).
	StateItemLens [][]uint32
	// NoNotifs: the decode neither posts nor reads NIXL notifications (SGLang
	// 0.5.23 completes on KV_STATUS); notifications sent to it would pile up
	// in its agent, so none are attached to its writes.
	NoNotifs bool
	// StagingBase ([14]) and StagingSize ([15]) are decode's staging ring
	// (VRAM on GPU); both zero: no staging (staging.go).
	StagingBase uint64
	StagingSize int64
}

// Peer is a validated decode peer, ready for planning.
type Peer struct {
	Agent    string
	NoNotifs bool // see PeerGeometry.NoNotifs
	// segs: whole-page KV runs (one, or one per memory-kind run when mixed);
	// slice: head slices instead (heterogeneous TP, MHA).
	segs     []kvSeg
	mixed    bool
	slice    *slicePlan
	dstSlots int
	lists    []nixl.ListID // PrepPeerKV's, one per KV run
	aux      []uint64
	state    [][]uint64
	stSlots  []int
	stItems  [][]uint32
	gpu      uint64
	tpSize   int
	tpRank   int
	stgBase  uint64 // decode's staging ring (staging.go); 0, 0: none
	stgSize  int64
}

// KVSrcDescs is the local prepared list: every slot of every KV buffer,
// (base_ℓ + s·item_ℓ, item_ℓ), index ℓ·NumSlots + s.
func KVSrcDescs(l *Local) []nixl.Desc {
	return slotDescs(l.KV.Ptrs, l.KV.ItemLens, l.KV.ItemLens, l.KV.NumSlots, l.KV.DevID)
}

// KVDstDescs is a decode peer's prepared list for its first KV run (see
// KVDstSegDescs); nil for a head-slice peer.
func KVDstDescs(l *Local, p *Peer) []nixl.Desc {
	if len(p.segs) == 0 {
		return nil
	}
	return KVDstSegDescs(l, p, 0)
}

// KVDstSegDescs is the prepared list of a peer's KV run i: for the decode
// buffers paired with local buffers [start, end), every one of decode's slots,
// stride = decode item len, length = prefill item len, index k·dst_num_slots + s.
func KVDstSegDescs(l *Local, p *Peer, i int) []nixl.Desc {
	sg := &p.segs[i]
	return slotDescs(sg.dst.Ptrs, sg.dst.ItemLens, l.KV.ItemLens[sg.start:sg.end], sg.dst.NumSlots, sg.dst.DevID)
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

// PrepPeerKV prepares a decode peer's KV lists once, after LoadPeer: one per
// KV run (none for a head-slice peer, whose requests carry descriptors). The
// peer keeps them (its plans name the list of each run); the first is
// returned for callers that make requests with MakeReq's peerKV argument.
// Call it once per peer, before the peer is shared.
func PrepPeerKV(a nixl.Agent, l *Local, p *Peer) (nixl.ListID, error) {
	out := make([]nixl.ListID, 0, len(p.segs))
	for i := range p.segs {
		id, err := a.Prep(p.Agent, p.segs[i].dst.Kind, KVDstSegDescs(l, p, i))
		if err != nil {
			for _, x := range out {
				_ = a.ReleaseList(x)
			}
			return 0, err
		}
		out = append(out, id)
	}
	p.lists = out
	if len(out) == 0 {
		return 0, nil
	}
	return out[0], nil
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
		GPU: l.KV.DevID, AuxPtrs: l.Aux.Ptrs, TPSize: l.TPSize, TPRank: l.TPRank,
	}
	for _, id := range l.KVLayerIDs {
		g.KVLayerIDs = append(g.KVLayerIDs, uint32(id))
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
		items := make([]uint32, len(s.ItemLens))
		for i, it := range s.ItemLens {
			items[i] = uint32(it)
		}
		g.StateItemLens = append(g.StateItemLens, items)
	}
	return g
}
