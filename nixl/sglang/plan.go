package sglang

import (
	"github.com/kvxfer/kvxfer/nixl"
)

// Chunk is one unit of work for one decode peer (SGLang's TransferKVChunk plus
// the decode TransferInfo fields it needs).
type Chunk struct {
	Room    uint64
	ChunkID int
	IsLast  bool
	// SrcPages are prefill page (slot) indices; DstPages the decode ones for the
	// same chunk (info.dst_kv_indices[index_slice]). A shorter DstPages truncates
	// the source, as SGLang does (Plan.Truncated reports it); a longer one is an error.
	SrcPages []int32
	DstPages []int32
	// Aux slot indices, used when IsLast.
	SrcAux, DstAux int
	// State indices per component, used when IsLast. DstState non-nil means
	// decode asked for state (it sent state_indices).
	SrcState, DstState [][]int32
	// NoKVChunks is the number of earlier KV chunks this sender sent for the
	// room; it goes into the NoKVWithCount form of aux_nokv.
	NoKVChunks int
	// Staged, when set, writes the pages into decode's staging ring
	// (staging.go) instead of its pages.
	Staged *StagedRegion
}

// ReqKind says which part of a room a request carries.
type ReqKind uint8

const (
	// ReqKV moves pages through the prepared lists (Make with SrcIdx/DstIdx).
	ReqKV ReqKind = iota + 1
	// ReqState moves one state component with explicit descriptors (Create).
	ReqState
	// ReqAux moves every aux buffer's slot with explicit descriptors (Create).
	ReqAux
	// ReqSlice moves KV head slices with explicit descriptors (Create):
	// heterogeneous TP, MHA.
	ReqSlice
)

func (k ReqKind) String() string {
	switch k {
	case ReqKV:
		return "kv"
	case ReqState:
		return "state"
	case ReqAux:
		return "aux"
	case ReqSlice:
		return "slice"
	}
	return "?"
}

// Req is one NIXL WRITE to make and post, with its notification.
type Req struct {
	Kind      ReqKind
	Component int // ReqState: the state component
	// ReqKV: indices into the local prepared KV list and the peer's prepared
	// list of KV run Seg (List, set when PrepPeerKV prepared the peer); or,
	// planned with Local.MergeKV, the merged descriptors in Src and Dst.
	SrcIdx, DstIdx []int32
	Seg            int
	List           nixl.ListID
	HasList        bool
	// ReqState, ReqAux: explicit descriptors (local side, peer side).
	Src, Dst         []nixl.Desc
	SrcKind, DstKind nixl.MemKind
	Notif            []byte
}

// Plan is a reusable output buffer: Planner.Plan overwrites it, keeping the
// capacity of every slice so steady-state planning does not allocate.
type Plan struct {
	Reqs      []Req
	Truncated int // source pages dropped because DstPages was shorter
}

// next appends an empty request, reusing the slices of a previous plan.
func (p *Plan) next(kind ReqKind) *Req {
	if len(p.Reqs) < cap(p.Reqs) {
		p.Reqs = p.Reqs[:len(p.Reqs)+1]
	} else {
		p.Reqs = append(p.Reqs, Req{})
	}
	r := &p.Reqs[len(p.Reqs)-1]
	*r = Req{Kind: kind, SrcIdx: r.SrcIdx[:0], DstIdx: r.DstIdx[:0], Src: r.Src[:0], Dst: r.Dst[:0], Notif: r.Notif[:0]}
	return r
}

// Plan writes into out the requests for chunk c to decode peer p, in SGLang's
// order: KV (one request for the whole chunk, all layers), then on the last
// chunk one request per non-empty state component, then aux (or aux_nokv when
// the last chunk has no pages). Every page, aux and state index is checked
// against the registered slot counts first: on error out is empty and nothing
// out of range is ever planned. The slices inside out stay valid until the next
// Plan into the same out, so make every request before planning the next chunk.
func (l *Local) Plan(out *Plan, p *Peer, c *Chunk) error {
	out.Reqs, out.Truncated = out.Reqs[:0], 0
	src, dst := c.SrcPages, c.DstPages
	if len(dst) > len(src) {
		return nixl.Errorf(nixl.ErrInvalid, "sglang plan room %d chunk %d: %d decode pages for %d prefill pages", c.Room, c.ChunkID, len(dst), len(src))
	}
	if len(dst) < len(src) {
		out.Truncated = len(src) - len(dst)
		src = src[:len(dst)]
	}
	if err := checkPages(src, l.KV.NumSlots, "prefill page", c); err != nil {
		return err
	}
	if err := checkPages(dst, p.dstSlots, "decode page", c); err != nil {
		return err
	}
	if c.IsLast {
		if err := l.checkLast(p, c); err != nil {
			return err
		}
	}
	if len(src) > 0 {
		switch {
		case c.Staged != nil:
			if err := l.planStagedKV(out, p, &StagedChunk{Room: c.Room, ChunkID: c.ChunkID, IsLast: c.IsLast, SrcPages: src,
				PageStart: c.Staged.PageStart, ChunkIdx: c.Staged.ChunkIdx, Offset: c.Staged.Offset}); err != nil {
				return err
			}
		case p.slice != nil:
			r := out.next(ReqSlice)
			r.SrcKind, r.DstKind = l.KV.Kind, p.slice.dstKind
			r.Src, r.Dst = p.slice.descs(r.Src, r.Dst, l.KV.DevID, src, dst)
			r.Notif = AppendKVNotif(r.Notif, c.Room, c.ChunkID, c.IsLast, l.Sender)
		default:
			for i := range p.segs {
				sg := &p.segs[i]
				r := out.next(ReqKV)
				r.Seg = i
				if i < len(p.lists) {
					r.List, r.HasList = p.lists[i], true
				}
				if l.MergeKV && mergeable(l, sg, src, dst) {
					r.SrcKind, r.DstKind = l.KV.Kind, sg.dst.Kind
					r.Src, r.Dst = kvRuns(r.Src, r.Dst, l, sg, src, dst)
				} else {
					r.SrcIdx = repeatOverLayersFrom(r.SrcIdx, src, sg.start, sg.end, l.KV.NumSlots)
					r.DstIdx = repeatOverLayersFrom(r.DstIdx, dst, 0, sg.end-sg.start, sg.dst.NumSlots)
				}
				r.Notif = AppendKVNotif(r.Notif, c.Room, c.ChunkID, c.IsLast, l.Sender)
				if p.mixed {
					r.Notif = AppendPartSuffix(r.Notif, i, len(p.segs))
				}
			}
		}
	}
	if !c.IsLast {
		return nil
	}
	if c.DstState != nil {
		for i, s := range c.SrcState {
			if len(s) == 0 {
				continue
			}
			r := out.next(ReqState)
			r.Component = i
			st := &l.State[i]
			r.SrcKind, r.DstKind = st.Kind, st.Kind
			r.Src, r.Dst = stateDescs(r.Src, r.Dst, st, p.state[i], p.gpu, s, c.DstState[i])
			r.Notif = AppendStateNotif(r.Notif, c.Room, l.Sender, i)
		}
	}
	// Decode needs aux (or aux_nokv) from at least one sender; one request
	// carries the slot of every aux buffer.
	r := out.next(ReqAux)
	r.SrcKind, r.DstKind = nixl.DRAM, nixl.DRAM
	for i, base := range l.Aux.Ptrs {
		n := l.Aux.ItemLens[i]
		r.Src = append(r.Src, nixl.Desc{Addr: uintptr(base + n*uint64(c.SrcAux)), Len: n})
		r.Dst = append(r.Dst, nixl.Desc{Addr: uintptr(p.aux[i] + n*uint64(c.DstAux)), Len: n})
	}
	if len(src) == 0 {
		r.Notif = AppendAuxNoKVNotif(r.Notif, c.Room, l.Sender, l.NoKV, c.NoKVChunks)
	} else {
		r.Notif = AppendAuxNotif(r.Notif, c.Room)
	}
	return nil
}

// checkLast validates the aux and state parts of a last chunk.
func (l *Local) checkLast(p *Peer, c *Chunk) error {
	if len(l.Aux.Ptrs) == 0 {
		// Decode completes a room only after an aux (or aux_nokv) notification.
		return nixl.Errorf(nixl.ErrInvalid, "sglang plan room %d: last chunk but no aux buffers registered", c.Room)
	}
	if c.SrcAux < 0 || c.SrcAux >= l.Aux.NumSlots || c.DstAux < 0 || c.DstAux >= l.Aux.NumSlots {
		return nixl.Errorf(nixl.ErrInvalid, "sglang plan room %d: aux index %d→%d outside %d slots", c.Room, c.SrcAux, c.DstAux, l.Aux.NumSlots)
	}
	if c.DstState == nil {
		return nil
	}
	sent := 0
	for i, s := range c.SrcState {
		if len(s) == 0 {
			continue
		}
		switch {
		case i >= len(l.State) || i >= len(p.state) || i >= len(c.DstState):
			return nixl.Errorf(nixl.ErrInvalid, "sglang plan room %d: state component %d not registered on both sides", c.Room, i)
		case len(c.DstState[i]) != len(s):
			return nixl.Errorf(nixl.ErrInvalid, "sglang plan room %d: state component %d has %d prefill and %d decode indices", c.Room, i, len(s), len(c.DstState[i]))
		case len(p.state[i]) < len(l.State[i].Ptrs):
			return nixl.Errorf(nixl.ErrInvalid, "sglang plan room %d: state component %d has %d decode buffers, prefill %d", c.Room, i, len(p.state[i]), len(l.State[i].Ptrs))
		case p.slice != nil:
			// SGLang slices Mamba state per TP rank and refuses the others;
			// kvxferd has no state types, so it refuses all rather than
			// write whole slots into a differently sharded decode.
			return nixl.Errorf(nixl.ErrInvalid, "sglang plan room %d: state component %d: heterogeneous-TP state transfer (prefill tp %d, decode tp %d) is not implemented by kvxferd", c.Room, i, l.TPSize, p.tpSize)
		case l.TPSize > 0 && p.tpSize > 0 && l.TPSize != p.tpSize && !l.stateReplicated(p, i):
			// MLA across TP sizes: a state buffer sharded by TP (Mamba) has
			// another slot size on decode; SGLang slices it, kvxferd does not.
			return nixl.Errorf(nixl.ErrInvalid, "sglang plan room %d: state component %d: slots differ in size across TP sizes (prefill tp %d, decode tp %d: sharded state), which kvxferd does not slice", c.Room, i, l.TPSize, p.tpSize)
		case max(l.PPSize, 1) > 1 && len(p.state[i]) != len(l.State[i].Ptrs):
			// Positional pairing is what SGLang allows only without PP.
			return nixl.Errorf(nixl.ErrInvalid, "sglang plan room %d: state component %d: PP-heterogeneous transfer requires layer ids on both peers; got src=%d dst=%d entries", c.Room, i, len(l.State[i].Ptrs), len(p.state[i]))
		}
		if err := checkPages(s, l.State[i].NumSlots, "prefill state index", c); err != nil {
			return err
		}
		dslots := 0
		if i < len(p.stSlots) {
			dslots = p.stSlots[i]
		}
		if dslots > 0 {
			if err := checkPages(c.DstState[i], dslots, "decode state index", c); err != nil {
				return err
			}
		} else if err := checkPages(c.DstState[i], 1<<31-1, "decode state index", c); err != nil {
			return err
		}
		sent++
	}
	if sent == 0 && len(c.DstState) > 0 {
		return nixl.Errorf(nixl.ErrInvalid, "sglang plan room %d: decode expects state but the chunk carries none", c.Room)
	}
	return nil
}

func checkPages(pages []int32, slots int, what string, c *Chunk) error {
	for i, pg := range pages {
		if pg < 0 || int(pg) >= slots {
			return nixl.Errorf(nixl.ErrInvalid, "sglang plan room %d chunk %d: %s %d at position %d outside %d slots", c.Room, c.ChunkID, what, pg, i, slots)
		}
	}
	return nil
}

// repeatOverLayersFrom appends layer·slots + page for every layer in
// [from, to), then every page (SGLang's repeat_indices_over_layers):
// layer-major, so consecutive pages of one layer are consecutive indices that
// the agent can merge.
func repeatOverLayersFrom(dst, pages []int32, from, to, slots int) []int32 {
	for layer := from; layer < to; layer++ {
		off := int32(layer * slots)
		for _, pg := range pages {
			dst = append(dst, off+pg)
		}
	}
	return dst
}

// stateDescs builds the non-prepped descriptors of one state component: for
// every buffer, one descriptor per run of indices that is contiguous on both
// sides (group_concurrent_contiguous), length = prefill item len on both sides.
func stateDescs(src, dst []nixl.Desc, st *Buffers, dstPtrs []uint64, dstDev uint64, si, di []int32) ([]nixl.Desc, []nixl.Desc) {
	dev := st.DevID
	if st.Kind == nixl.DRAM {
		dev, dstDev = 0, 0
	}
	for b, base := range st.Ptrs {
		n := st.ItemLens[b]
		for start := 0; start < len(si); {
			end := start + 1
			for end < len(si) && si[end] == si[end-1]+1 && di[end] == di[end-1]+1 {
				end++
			}
			run := uint64(end - start)
			src = append(src, nixl.Desc{Addr: uintptr(base + uint64(si[start])*n), Len: run * n, DevID: dev})
			dst = append(dst, nixl.Desc{Addr: uintptr(dstPtrs[b] + uint64(di[start])*n), Len: run * n, DevID: dstDev})
			start = end
		}
	}
	return src, dst
}

// MakeReq makes (does not post) the NIXL request for r: Make over the local
// prepared KV list and the peer's list of r's KV run (r.List, or peerKV for a
// single-run peer planned before PrepPeerKV) for ReqKV by indices, Create with
// explicit descriptors otherwise (a merged ReqKV included).
func MakeReq(a nixl.Requests, localKV, peerKV nixl.ListID, peer string, r *Req) (nixl.XferID, error) {
	if r.Kind == ReqKV && len(r.Src) == 0 {
		dst := peerKV
		if r.HasList {
			dst = r.List
		} else if r.Seg != 0 {
			return 0, nixl.Errorf(nixl.ErrInvalid, "sglang: KV run %d of peer %s was not prepared", r.Seg, peer)
		}
		return a.Make(nixl.Write, localKV, r.SrcIdx, dst, r.DstIdx, r.Notif)
	}
	return a.Create(nixl.Write, r.SrcKind, r.Src, peer, r.DstKind, r.Dst, r.Notif)
}

// stateReplicated says every buffer of state component i has the same slot
// size on both sides (as decode's registration [12] says; unknown counts as
// not), so a whole-slot copy moves exactly what decode holds.
func (l *Local) stateReplicated(p *Peer, i int) bool {
	if i >= len(p.stItems) || len(p.stItems[i]) < len(l.State[i].ItemLens) {
		return false
	}
	for b, it := range l.State[i].ItemLens {
		if uint64(p.stItems[i][b]) != it {
			return false
		}
	}
	return true
}
