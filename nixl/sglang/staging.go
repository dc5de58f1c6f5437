package sglang

import (
	"math"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// The staging path of heterogeneous-TP MHA (SGLANG_DISAGG_STAGING_BUFFER=1 on
// both sides; SGLang common/staging_buffer.py, staging_handler.py and
// nixl/conn.py send_kvcache_staged). Instead of one descriptor per token and
// head slice into decode's KV pages, a prefill rank writes a chunk's head
// slices packed into a region of decode's staging ring, which decode scatters
// into its pages on its GPU. The region of a chunk (one staging-grid slot of
// the room's pages) is decode's answer to STAGING_REQ; inside it every
// prefill writer feeding this decode rank owns one block, in writer order,
// and a block is layer-major: every K layer then every V layer, each
// [tokens of the chunk, heads sent, head bytes].
//
// SGLang's prefill gathers the block into its own staging buffer on the GPU
// and writes it in one descriptor; kvxferd writes the same bytes to the same
// decode addresses straight from its KV pages (one descriptor per contiguous
// run), so decode cannot tell the two apart.

// HeadSliceParams is compute_head_slice_params: the first head this prefill
// rank sends (rank-local), how many, and where they start in decode's heads.
func HeadSliceParams(srcTP, dstTP, srcRank, dstRank, totalHeads int) (srcStart, n, dstStart int) {
	srcTP, dstTP = max(srcTP, 1), max(dstTP, 1)
	srcHeads := max(1, totalHeads/srcTP)
	dstHeads := max(1, totalHeads/dstTP)
	if srcTP > dstTP {
		repl := max(1, srcTP/max(totalHeads, 1))
		unique := (srcRank % srcTP) / repl
		return 0, srcHeads, (unique * srcHeads) % dstHeads
	}
	repl := max(1, dstTP/max(totalHeads, 1))
	unique := (dstRank % dstTP) / repl
	return (unique * dstHeads) % srcHeads, dstHeads, 0
}

// StagingLayout is compute_staging_layout: the bytes of each writer's block
// in a decode rank's staging region for a chunk of tokens, and their sum
// (what decode allocates for the chunk). layers counts K (and V) layers.
func StagingLayout(srcTP, dstTP, dstRank, totalHeads, tokens int, headBytes uint64, layers int) (writers []uint64, total uint64) {
	nw := 1
	if srcTP > dstTP {
		nw = srcTP / max(1, dstTP)
	}
	for w := range nw {
		_, nh, _ := HeadSliceParams(srcTP, dstTP, w, dstRank, totalHeads)
		b := uint64(tokens) * uint64(nh) * headBytes * uint64(layers) * 2
		writers = append(writers, b)
		total += b
	}
	return writers, total
}

// StagingGridPages is the staging grid in pages (staging_grid_tokens /
// page_size): chunked_prefill_size (0: SGLang's 8192) rounded down to pages.
// A staged chunk covers at most one grid slot; its chunk_idx is
// page_start / StagingGridPages.
func StagingGridPages(chunkedPrefillSize, pageSize int) int {
	if chunkedPrefillSize <= 0 {
		chunkedPrefillSize = 8192
	}
	return max(1, chunkedPrefillSize/max(pageSize, 1))
}

// Staging reports the decode peer's staging ring and whether staged writes
// can go to it: a head-slice (heterogeneous-TP MHA) peer that registered a
// staging buffer, as SGLang's prefill decides per chunk (use_staging).
func (p *Peer) Staging() (base uint64, size int64, ok bool) {
	return p.stgBase, p.stgSize, p.slice != nil && (p.stgBase != 0 || p.stgSize != 0)
}

// StagedChunk is one staged write: this rank's pages of one grid slot of a
// room and the region decode allocated for the slot (STAGING_RSP).
type StagedChunk struct {
	Room    uint64
	ChunkID int // the room's enqueued-chunk counter, as in "_kv_"
	IsLast  bool
	// SrcPages are this rank's pages of the chunk, in the room's order.
	SrcPages []int32
	// PageStart is the index of the chunk's first page in the room's page
	// list (index_slice.start); ChunkIdx the grid slot (PageStart / grid).
	PageStart, ChunkIdx int
	// Offset is STAGING_RSP's offset of ChunkIdx in decode's ring.
	Offset int64
}

// PlanStaged writes into out the staged write of chunk c to peer p: one
// ReqSlice request with explicit descriptors into decode's staging ring at
// Offset + this writer's block, carrying the "stg" notification, or none for
// a decode that takes no notifications (0.5.23: send wire.ChunkReady once
// the request is Done). It refuses, with SGLang's reason, what SGLang's
// prefill refuses (no staging, an oversized or misplaced region).
func (l *Local) PlanStaged(out *Plan, p *Peer, c *StagedChunk) error {
	out.Reqs, out.Truncated = out.Reqs[:0], 0
	return l.planStagedKV(out, p, c)
}

// StagedRegion makes Plan write a chunk's KV into decode's staging ring (as
// PlanStaged) instead of its pages; aux and state of a last chunk go as
// usual. ChunkIdx is the grid slot, PageStart the chunk's first page in the
// room (index_slice.start), Offset STAGING_RSP's offset of the slot.
type StagedRegion struct {
	ChunkIdx, PageStart int
	Offset              int64
}

// planStagedKV appends the staged write of c to out.
func (l *Local) planStagedKV(out *Plan, p *Peer, c *StagedChunk) error {
	base, size, ok := p.Staging()
	if !ok {
		return nixl.Errorf(nixl.ErrInvalid, "sglang staged room %d: peer %s takes no staged writes (needs heterogeneous-TP MHA and a staging buffer)", c.Room, p.Agent)
	}
	if size < 0 || base > math.MaxUint64-uint64(size) {
		return nixl.Errorf(nixl.ErrInvalid, "sglang staged room %d: peer %s registered a staging ring [%#x, +%d) outside the address space", c.Room, p.Agent, base, size)
	}
	if c.Offset == wire.AllocOversized {
		return nixl.Errorf(nixl.ErrInvalid, "[Staging] Chunk staging allocation permanently failed: chunk exceeds ring buffer total size (room=%d). Increase SGLANG_DISAGG_STAGING_POOL_SIZE_MB.", c.Room)
	}
	if err := checkPages(c.SrcPages, l.KV.NumSlots, "prefill page", &Chunk{Room: c.Room, ChunkID: c.ChunkID}); err != nil {
		return err
	}
	s := p.slice
	ptp, dtp := max(l.TPSize, 1), max(p.tpSize, 1)
	total := l.TotalKVHeads
	if total <= 0 {
		total = l.KVHeadNum * ptp
	}
	layers := len(s.srcPtrs) / 2
	tokens := len(c.SrcPages) * s.page
	writers, need := StagingLayout(ptp, dtp, p.tpRank, total, tokens, s.bph, layers)
	w := 0
	if len(writers) > 1 {
		w = (l.TPRank % ptp) % len(writers)
	}
	var off uint64
	for _, b := range writers[:w] {
		off += b
	}
	if c.Offset < 0 || c.Offset > size || uint64(size-c.Offset) < need {
		return nixl.Errorf(nixl.ErrInvalid, "[Staging] Staged transfer cannot fit chunk (room=%d, chunk_idx=%d, pages=%d): region at %d needs %d bytes, decode staging has %d. Increase SGLANG_DISAGG_STAGING_POOL_SIZE_MB or reduce chunked_prefill_size.",
			c.Room, c.ChunkIdx, len(c.SrcPages), c.Offset, need, size)
	}
	if len(c.SrcPages) == 0 {
		return nil
	}
	r := out.next(ReqSlice)
	r.SrcKind, r.DstKind = l.KV.Kind, nixl.VRAM
	tokBytes := uint64(s.heads) * s.bph
	perLayer := uint64(tokens) * tokBytes
	dst0 := base + uint64(c.Offset) + off
	srcHead := uint64(s.srcStart) * s.bph
	for q, sp := range s.srcPtrs {
		for i, pg := range c.SrcPages {
			for t := range s.page {
				sa := sp + uint64(pg)*s.srcItem + uint64(t)*s.bptSrc + srcHead
				da := dst0 + uint64(q)*perLayer + uint64(i*s.page+t)*tokBytes
				r.Src, r.Dst = appendRun(r.Src, r.Dst, sa, da, tokBytes, l.KV.DevID, p.gpu)
			}
		}
	}
	if !p.NoNotifs {
		r.Notif = wire.AppendStgNotif(r.Notif, &wire.StgNotif{Room: c.Room, ChunkID: c.ChunkID, IsLast: c.IsLast,
			Sender: l.Sender, ChunkIdx: c.ChunkIdx, PageStart: c.PageStart, NumPages: len(c.SrcPages), Agent: p.Agent})
	}
	return nil
}

// appendRun appends (src, dst, n), extending the last pair when both sides
// continue it.
func appendRun(src, dst []nixl.Desc, sa, da, n, sdev, ddev uint64) ([]nixl.Desc, []nixl.Desc) {
	if k := len(src) - 1; k >= 0 && uint64(src[k].Addr)+src[k].Len == sa && uint64(dst[k].Addr)+dst[k].Len == da {
		src[k].Len += n
		dst[k].Len += n
		return src, dst
	}
	return append(src, nixl.Desc{Addr: uintptr(sa), Len: n, DevID: sdev}), append(dst, nixl.Desc{Addr: uintptr(da), Len: n, DevID: ddev})
}
