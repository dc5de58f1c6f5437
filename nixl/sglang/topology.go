package sglang

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvxfer/kvxfer/nixl"
)

// This file decides, once per decode peer, how this prefill rank's KV buffers
// map onto the peer's: which decode buffer each local buffer writes (PP stages,
// layer ids, draft layers), whether whole pages move (equal TP or MLA), one
// part per run of equal memory kinds (mixed VRAM/DRAM destinations, the
// "_part_i_n" notifications) or per-token head slices (heterogeneous TP, MHA).
// Every rule and every refusal follows SGLang's prefill
// (nixl/conn.py _prepare_payload_xfer, _init_hetero_tp_prep_handle,
// common/conn.py get_mha_kv_ptrs_with_pp, utils.py build_transfer_entry_pairs);
// a refusal carries SGLang's own message, so a decode that SGLang's prefill
// would not serve is refused at registration, never written wrongly.

// Rules selects the SGLang release whose prefill rules apply to a peer. The
// releases differ in one geometry rule: 0.5.23 pairs a plain MLA PP stage with
// a whole-model decode by the stage's layer span when neither side sends layer
// ids; 0.5.18 (and the other 23-frame releases) require layer ids there.
type Rules uint8

const (
	// Rules0518 are the rules of 0.5.18 to 0.5.22.
	Rules0518 Rules = iota
	// Rules0523 are 0.5.23's.
	Rules0523
)

// kvSeg is one run of local KV buffers [start, end) written with whole-page
// descriptors into the decode buffers dst (one per local buffer of the run).
type kvSeg struct {
	start, end int
	dst        Buffers
}

// slicePlan is the heterogeneous-TP MHA head-slice geometry of one peer
// (SGLang's _init_hetero_tp_prep_handle): per layer buffer, page and token,
// one descriptor of bytesSend bytes.
type slicePlan struct {
	srcPtrs, dstPtrs   []uint64 // K of this stage's layers then V, paired
	srcItem, dstItem   uint64
	page               int
	bytesSend          uint64 // num_heads_to_send · bytes_per_head_slice
	bptSrc, bptDst     uint64 // bytes per token on each side
	groupOff           uint64 // head_group_idx · bytesSend (src offset in a token)
	dstOff             uint64 // dst_head_offset
	dstKind            nixl.MemKind
	dstDev             uint64
	numGroups, group   int
	bph                uint64 // bytes_per_head_slice
	heads              int    // heads per token sent
	srcStart, dstStart int    // first head on each side (rank-local)
}

func refuse(agent, format string, args ...any) error {
	return nixl.Errorf(nixl.ErrInvalid, "sglang peer %s: %s", agent, fmt.Sprintf(format, args...))
}

// pyKinds renders sorted unique kinds as Python prints a sorted list of str.
func pyKinds(kinds []nixl.MemKind) string {
	var u []string
	for _, k := range kinds {
		s := kindName(k)
		if !slices.Contains(u, s) {
			u = append(u, s)
		}
	}
	slices.Sort(u)
	return "['" + strings.Join(u, "', '") + "']"
}

func kindName(k nixl.MemKind) string {
	if k == nixl.DRAM {
		return "DRAM"
	}
	return "VRAM"
}

// EntryPairs is SGLang's build_transfer_entry_pairs: for each local transfer
// entry i the decode entry it writes, by layer id when both sides sent ids
// (ids repeat across K/V: occurrences pair in order), else positionally when
// allowed and the counts permit.
func EntryPairs(src, dst []int, nSrc, nDst int, positional bool) ([]int, error) {
	if nSrc == 0 {
		return nil, nil
	}
	if (len(src) > 0) != (len(dst) > 0) {
		if !positional {
			return nil, fmt.Errorf("Layer metadata must be provided by both PD peers or neither")
		}
		src, dst = nil, nil
	}
	if len(src) > 0 {
		if len(src) != nSrc || len(dst) != nDst {
			return nil, fmt.Errorf("Layer metadata length must match transfer entries: src metadata=%d entries=%d, dst metadata=%d entries=%d",
				len(src), nSrc, len(dst), nDst)
		}
		pos := map[int][]int{}
		for j, id := range dst {
			pos[id] = append(pos[id], j)
		}
		out := make([]int, nSrc)
		for i, id := range src {
			q := pos[id]
			if len(q) == 0 {
				return nil, fmt.Errorf("Decode peer is missing a transfer entry for model layer %d", id)
			}
			out[i], pos[id] = q[0], q[1:]
		}
		return out, nil
	}
	if nDst < nSrc || (nSrc != nDst && !positional) {
		return nil, fmt.Errorf("PP-heterogeneous transfer requires layer ids on both peers; got src=%d dst=%d entries", nSrc, nDst)
	}
	out := make([]int, nSrc)
	for i := range out {
		out[i] = i
	}
	return out, nil
}

// mhaStageDst is get_mha_kv_ptrs_with_pp's destination half: the decode
// buffer indices (K of this stage's layers, then V) for nSrc local buffers
// (K then V) of a stage starting at model layer start, among nDst decode ones.
func mhaStageDst(start, nSrc, nDst int) []int {
	n := nSrc / 2
	total := nDst / 2
	var k, v [2]int // [from, to)
	switch {
	case n == total:
		k, v = [2]int{0, total}, [2]int{total, 2 * total}
	case n < total && total%n != 0:
		// Decode has draft layers after its main K and V (SGLang's reading of
		// the layout, kept as is).
		voff := n * (total / n)
		k, v = [2]int{start, start + n}, [2]int{voff + start, voff + start + n}
	default:
		k, v = [2]int{start, start + n}, [2]int{total + start, total + start + n}
	}
	var out []int
	for _, r := range [][2]int{k, v} {
		for j := r[0]; j < r[1] && j < nDst; j++ { // Python slices stop at the end
			out = append(out, j)
		}
	}
	return out
}

// PeerDescsFactor and PeerDescsFloor cap what one decode registration can make
// kvxferd allocate: a peer's prepared KV list (local KV buffers × dst_num_slots
// descriptors) may hold at most PeerDescsFactor times this rank's own list, and
// never less than PeerDescsFloor descriptors (2^20, 24 MiB).
const (
	PeerDescsFactor = 16
	PeerDescsFloor  = 1 << 20
)

// MaxPeerKVDescs is the most KV descriptors kvxferd prepares for one decode peer.
func (l *Local) MaxPeerKVDescs() uint64 {
	return max(PeerDescsFactor*uint64(len(l.KV.Ptrs))*uint64(max(l.KV.NumSlots, 0)), PeerDescsFloor)
}

// NewPeer validates a decode peer against the local geometry and decides how
// this rank writes it, with SGLang's checks (_add_remote_peer /
// _prepare_payload_xfer), so that a registration SGLang's prefill would refuse
// fails here, with SGLang's reason, and not in the middle of a transfer.
func NewPeer(l *Local, g PeerGeometry) (*Peer, error) {
	n := len(l.KV.Ptrs)
	if g.Agent == "" {
		return nil, nixl.Errorf(nixl.ErrInvalid, "sglang peer: empty agent name")
	}
	p := &Peer{Agent: g.Agent, NoNotifs: g.NoNotifs, gpu: g.GPU, tpSize: g.TPSize, tpRank: g.TPRank,
		stgBase: g.StagingBase, stgSize: g.StagingSize}
	items := g.KVItemLens
	if len(items) == 0 {
		items = make([]uint64, len(g.KVPtrs))
		for i := range items {
			items[i] = g.DstKVItemLen
		}
	}
	if len(items) != len(g.KVPtrs) {
		return nil, refuse(g.Agent, "dst_kv_item_lens length mismatch: got %d, expected %d", len(items), len(g.KVPtrs))
	}
	kinds := g.KVKinds
	if len(kinds) == 0 {
		kinds = make([]nixl.MemKind, len(g.KVPtrs))
		for i := range kinds {
			kinds[i] = nixl.VRAM
		}
	}
	if len(kinds) != len(g.KVPtrs) {
		return nil, refuse(g.Agent, "kv_data_mem_kinds length mismatch: got %d, expected %d", len(kinds), len(g.KVPtrs))
	}
	nDst := len(g.KVPtrs)
	if nDst < n {
		return nil, refuse(g.Agent, "NIXL PD transfer: decode registered fewer KV regions (%d) than prefill (%d); unexpected geometry", nDst, n)
	}
	if g.TPSize < 0 || g.TPRank < 0 {
		return nil, refuse(g.Agent, "decode tp size %d, rank %d", g.TPSize, g.TPRank)
	}
	if g.DCPSize > 1 {
		return nil, refuse(g.Agent, "decode context parallelism (dcp_size %d) needs SGLang's DCP relayout, which kvxferd does not implement", g.DCPSize)
	}
	slots := g.DstNumSlots
	if slots == 0 {
		slots = l.KV.NumSlots
	}
	if lim := l.MaxPeerKVDescs(); slots < 0 || uint64(slots) > lim/uint64(n) {
		// The prepared list holds n·slots descriptors (24 bytes each), built
		// before NIXL sees it: a hostile slot count must not size kvxferd's heap.
		return nil, refuse(g.Agent, "dst_num_slots %d × %d KV buffers is more descriptors than kvxferd prepares for one decode peer (cap %d: %d × this rank's %d, at least %d)",
			slots, n, lim, PeerDescsFactor, uint64(n)*uint64(l.KV.NumSlots), PeerDescsFloor)
	}
	p.dstSlots = slots
	specDec := nDst > n
	homog := true
	for _, k := range kinds {
		if k != kinds[0] {
			homog = false
		}
	}
	dev := func(k nixl.MemKind) uint64 {
		if k == nixl.VRAM {
			return g.GPU
		}
		return 0
	}
	tpEqual := l.TPSize <= 0 || g.TPSize <= 0 || l.TPSize == g.TPSize
	switch {
	case l.MLA || tpEqual:
		if !homog {
			if specDec {
				return nil, refuse(g.Agent, "NIXL PD transfer does not support HiSparse combined with decode-only speculative decoding.")
			}
			// _kv_xfer_mem_segments over the positional buffers.
			if nDst != n {
				return nil, refuse(g.Agent, "KV source/destination memory kind length mismatch: src=%d, dst=%d", n, nDst)
			}
			for start := 0; start < n; {
				end := start + 1
				for end < n && kinds[end] == kinds[start] {
					end++
				}
				k := kinds[start]
				p.segs = append(p.segs, kvSeg{start: start, end: end, dst: Buffers{
					Ptrs: g.KVPtrs[start:end], ItemLens: items[start:end], NumSlots: slots, Kind: k, DevID: dev(k)}})
				start = end
			}
			p.mixed = true
			break
		}
		if specDec && kinds[0] != nixl.VRAM {
			return nil, refuse(g.Agent, "NIXL PD transfer does not support HiSparse combined with decode-only speculative decoding.")
		}
		idx, err := l.dstIndices(g, items, n, nDst)
		if err != nil {
			return nil, refuse(g.Agent, "%v", err)
		}
		seg := kvSeg{start: 0, end: n, dst: Buffers{NumSlots: slots, Kind: kinds[0], DevID: dev(kinds[0])}}
		for _, j := range idx {
			seg.dst.Ptrs = append(seg.dst.Ptrs, g.KVPtrs[j])
			seg.dst.ItemLens = append(seg.dst.ItemLens, items[j])
		}
		p.segs = []kvSeg{seg}
	default:
		if !homog {
			return nil, refuse(g.Agent, "NIXL destination mixed KV memory kinds are not implemented safely yet: %s", pyKinds(kinds))
		}
		if kinds[0] != nixl.VRAM {
			return nil, refuse(g.Agent, "NIXL heterogeneous-TP direct-to-host KV transfer is not implemented safely yet")
		}
		s, err := l.headSlice(g, items, kinds[0], dev(kinds[0]))
		if err != nil {
			return nil, refuse(g.Agent, "%v", err)
		}
		p.slice = s
	}
	for i := range p.segs {
		sg := &p.segs[i]
		if err := sg.dst.validate("decode KV"); err != nil {
			return nil, err
		}
		for b := sg.start; b < sg.end; b++ {
			// Transfer length is prefill's item len, stride is decode's.
			if x, it := l.KV.ItemLens[b], sg.dst.ItemLens[b-sg.start]; x > it {
				return nil, refuse(g.Agent, "NIXL prepared dlist transfer length exceeds item stride: xfer_len=%d, item_len=%d, mem_kind=%s", x, it, kindName(sg.dst.Kind))
			}
		}
	}
	if len(l.Aux.Ptrs) > 0 && len(g.AuxPtrs) < len(l.Aux.Ptrs) {
		return nil, refuse(g.Agent, "%d aux buffers, prefill has %d", len(g.AuxPtrs), len(l.Aux.Ptrs))
	}
	p.aux = g.AuxPtrs
	p.state = g.StatePtrs
	p.stSlots = g.StateSlots
	p.stItems = g.StateItemLens
	return p, nil
}

// dstIndices picks the decode buffer each local buffer writes on the equal-TP
// / MLA path: 0.5.23's _build_transfer_dst_indices (the MLA PP span rule) or
// build_transfer_entry_pairs (positional fallback only without PP).
func (l *Local) dstIndices(g PeerGeometry, items []uint64, n, nDst int) ([]int, error) {
	dstIDs := make([]int, len(g.KVLayerIDs))
	for i, id := range g.KVLayerIDs {
		dstIDs[i] = int(id)
	}
	pp := max(l.PPSize, 1)
	if g.Rules == Rules0523 && pp > 1 && n != nDst && len(l.KVLayerIDs) == 0 && len(dstIDs) == 0 && l.MLA {
		start, end := l.StartLayer, l.StartLayer+n
		if end > nDst {
			return EntryPairs(l.KVLayerIDs, dstIDs, n, nDst, false)
		}
		var src, dst []uint64
		out := make([]int, 0, n)
		for j := start; j < end; j++ {
			out = append(out, j)
			dst = append(dst, items[j])
		}
		src = l.KV.ItemLens
		if !slices.Equal(src, dst) {
			return nil, fmt.Errorf("PP-heterogeneous MLA transfer: decode KV cell geometry differs from prefill over layers [%d, %d): prefill item_lens=%s, decode item_lens=%s",
				start, end, pyInts(src), pyInts(dst))
		}
		return out, nil
	}
	return EntryPairs(l.KVLayerIDs, dstIDs, n, nDst, pp == 1)
}

func pyInts(xs []uint64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// headSlice is _init_hetero_tp_prep_handle (with compute_head_slice_params).
func (l *Local) headSlice(g PeerGeometry, items []uint64, kind nixl.MemKind, dev uint64) (*slicePlan, error) {
	ptp, dtp := max(l.TPSize, 1), max(g.TPSize, 1)
	page := max(l.PageSize, 1)
	total := l.TotalKVHeads
	if total <= 0 {
		total = l.KVHeadNum * ptp
	}
	if total <= 0 {
		return nil, fmt.Errorf("heterogeneous TP (prefill %d, decode %d) slices KV heads, but this rank's KV head count is not configured (kvxferd -kv-head-num / -total-kv-heads)", ptp, dtp)
	}
	dstHeads := max(1, total/dtp)
	srcHeads := max(1, total/ptp)
	dstItem := g.DstKVItemLen
	bph := dstItem / uint64(page) / uint64(dstHeads)
	s := &slicePlan{page: page, dstKind: kind, dstDev: dev, numGroups: 1, bph: bph}
	var numHeads int
	if ptp > dtp {
		repl := max(1, ptp/total)
		unique := (l.TPRank % ptp) / repl
		dstStart := (unique * srcHeads) % dstHeads
		numHeads = srcHeads
		s.dstOff = uint64(dstStart) * bph
		s.dstStart = dstStart
	} else {
		repl := max(1, dtp/total)
		unique := (g.TPRank % dtp) / repl
		srcStart := (unique * dstHeads) % srcHeads
		numHeads = dstHeads
		s.numGroups = dtp / ptp / repl
		s.group = srcStart / dstHeads
		s.srcStart = srcStart
	}
	s.heads = numHeads
	s.srcItem = l.KV.ItemLens[0]
	s.dstItem = dstItem
	s.bytesSend = uint64(numHeads) * bph
	s.bptSrc = s.srcItem / uint64(page)
	s.bptDst = dstItem / uint64(page)
	s.groupOff = uint64(s.group) * s.bytesSend
	// 0.5.23 asserts both: otherwise the per-token runs would address the
	// wrong bytes (0.5.18 writes them).
	if uint64(page)*uint64(s.numGroups)*s.bytesSend != s.srcItem {
		return nil, fmt.Errorf("head slicing does not tile a prefill page: page_size %d × groups %d × %d bytes != item len %d", page, s.numGroups, s.bytesSend, s.srcItem)
	}
	if uint64(page)*s.bptDst != dstItem {
		return nil, fmt.Errorf("decode item len %d is not page_size %d × bytes per token", dstItem, page)
	}
	for _, it := range l.KV.ItemLens {
		if it != s.srcItem {
			return nil, fmt.Errorf("head slicing needs one item len for every prefill KV buffer, got %v", l.KV.ItemLens)
		}
	}
	n := len(l.KV.Ptrs)
	idx := mhaStageDst(l.StartLayer, n, len(g.KVPtrs))
	if len(idx) != n {
		return nil, fmt.Errorf("decode has %d KV buffers; prefill stage from layer %d needs %d of them", len(g.KVPtrs), l.StartLayer, n)
	}
	s.srcPtrs = l.KV.Ptrs
	for _, j := range idx {
		if items[j] != dstItem {
			return nil, fmt.Errorf("head slicing needs decode item len %d on every KV buffer, buffer %d has %d", dstItem, j, items[j])
		}
		s.dstPtrs = append(s.dstPtrs, g.KVPtrs[j])
	}
	if s.groupOff > s.bptSrc || s.bytesSend > s.bptSrc-s.groupOff || s.dstOff > s.bptDst || s.bytesSend > s.bptDst-s.dstOff {
		return nil, fmt.Errorf("head slice [%d+%d) / [%d+%d) is outside a token (%d / %d bytes)", s.groupOff, s.bytesSend, s.dstOff, s.bytesSend, s.bptSrc, s.bptDst)
	}
	return s, nil
}

// descs appends the head-slice descriptors of one chunk: for every layer
// buffer (K then V), page pair and token, in SGLang's order
// (expand_page_indices_for_slice: pair-major, then page, then token).
func (s *slicePlan) descs(src, dst []nixl.Desc, srcDev uint64, sp, dp []int32) ([]nixl.Desc, []nixl.Desc) {
	for q := range s.srcPtrs {
		for i := range sp {
			sb := s.srcPtrs[q] + uint64(sp[i])*s.srcItem + s.groupOff
			db := s.dstPtrs[q] + uint64(dp[i])*s.dstItem + s.dstOff
			for t := range s.page {
				src = append(src, nixl.Desc{Addr: uintptr(sb + uint64(t)*s.bptSrc), Len: s.bytesSend, DevID: srcDev})
				dst = append(dst, nixl.Desc{Addr: uintptr(db + uint64(t)*s.bptDst), Len: s.bytesSend, DevID: s.dstDev})
			}
		}
	}
	return src, dst
}
