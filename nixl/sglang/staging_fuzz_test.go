package sglang_test

import (
	"testing"

	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// FuzzPlanStaged: whatever decode registers (staging base and size) and
// answers (STAGING_RSP offset), and whatever pages a chunk names, PlanStaged
// never panics, and a plan it accepts writes exactly this writer's block,
// inside decode's ring and inside the region, from this rank's pages only.
func FuzzPlanStaged(f *testing.F) {
	f.Add(uint8(0), uint8(1), uint64(0x7000000), int64(1<<20), int64(4096), uint8(3), uint8(4))
	f.Add(uint8(1), uint8(0), uint64(1<<63), int64(1<<40), int64(-2), uint8(1), uint8(7))
	f.Add(uint8(2), uint8(1), ^uint64(0)-10, int64(100), int64(0), uint8(2), uint8(0))
	f.Fuzz(func(t *testing.T, shape, rank uint8, base uint64, size, offset int64, npages, first uint8) {
		// Shapes: (prefill TP, decode TP, KV heads).
		shapes := [][3]int{{2, 1, 4}, {1, 2, 4}, {4, 2, 8}, {2, 4, 2}}
		sh := shapes[int(shape)%len(shapes)]
		ptp, dtp, heads := sh[0], sh[1], sh[2]
		prank, drank := int(rank)%ptp, int(rank/8)%dtp
		const page, hb, slots = 2, 4, 8
		srcHeads := max(1, heads/ptp)
		dstHeads := max(1, heads/dtp)
		l := fakeLocal(4, slots, uint64(page*srcHeads*hb))
		l.TPSize, l.TPRank, l.TotalKVHeads, l.PageSize = ptp, prank, heads, page
		g := sglang.PeerGeometry{Agent: "dec", DstKVItemLen: uint64(page * dstHeads * hb), TPSize: dtp, TPRank: drank, GPU: 3,
			AuxPtrs: []uint64{0x900000, 0xa00000}, StagingBase: base, StagingSize: size}
		for b := range 4 {
			g.KVPtrs = append(g.KVPtrs, uint64(0x10+b)<<32)
		}
		p, err := sglang.NewPeer(l, g)
		if err != nil {
			return
		}
		var pages []int32
		for i := range int(npages % 12) {
			pages = append(pages, int32(int(first)+i)%int32(slots+2)) // a few out of range
		}
		var plan sglang.Plan
		c := &sglang.StagedChunk{Room: 1, SrcPages: pages, Offset: offset}
		if err := l.PlanStaged(&plan, p, c); err != nil || len(pages) == 0 {
			return
		}
		writers, need := sglang.StagingLayout(ptp, dtp, drank, heads, len(pages)*page, hb, 2)
		w := 0
		if len(writers) > 1 {
			w = prank % len(writers)
		}
		lo := base + uint64(offset)
		hi := lo + need
		if hi > base+uint64(size) {
			t.Fatalf("accepted region [%#x, %#x) beyond the ring end %#x", lo, hi, base+uint64(size))
		}
		var total uint64
		for _, r := range plan.Reqs {
			for i, d := range r.Dst {
				if uint64(d.Addr) < lo || uint64(d.Addr)+d.Len > hi || d.Len == 0 {
					t.Fatalf("dst run [%#x, +%d) outside the region [%#x, %#x)", d.Addr, d.Len, lo, hi)
				}
				s := r.Src[i]
				inside := false
				for b, bp := range l.KV.Ptrs {
					end := bp + uint64(slots)*l.KV.ItemLens[b]
					if uint64(s.Addr) >= bp && uint64(s.Addr)+s.Len <= end {
						inside = true
					}
				}
				if !inside {
					t.Fatalf("src run [%#x, +%d) outside the local KV buffers", s.Addr, s.Len)
				}
				total += d.Len
			}
		}
		if total != writers[w] {
			t.Fatalf("wrote %d bytes, writer %d's block is %d", total, w, writers[w])
		}
	})
}
