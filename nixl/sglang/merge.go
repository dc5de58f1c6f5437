package sglang

import (
	"slices"

	"github.com/kvxfer/kvxfer/nixl"
)

// Descriptor merging. SGLang's prefill posts one descriptor per (KV buffer,
// page) on its prepared path (make_prepped_xfer with repeat_indices_over_layers
// indices, 0.5.18 and 0.5.23 alike); only its non-prepped fallback groups pages
// that are consecutive on both sides (group_concurrent_contiguous), and never
// across buffers. A large room is thousands of such descriptors. The functions
// here build a room's KV descriptor pairs in explicit form and merge every run
// that is contiguous on both sides into one descriptor: consecutive pages of a
// buffer, and neighbouring buffers (layers, K then V) when one registered region
// holds both on each side, which is what decides whether NIXL can serve the
// merged descriptor.

// KVPairs appends to src and dst the explicit descriptors of KV run seg of
// peer p for one chunk, exactly the entries SGLang's prepared path selects:
// for every local buffer of the run (layer-major), for every page i,
// (base_ℓ + srcPages[i]·item_ℓ, item_ℓ) → (dbase_ℓ + dstPages[i]·ditem_ℓ,
// item_ℓ). The pages must have been checked (Plan does) and dstPages must be
// as long as srcPages.
func KVPairs(src, dst []nixl.Desc, l *Local, p *Peer, seg int, srcPages, dstPages []int32) ([]nixl.Desc, []nixl.Desc) {
	sg := &p.segs[seg]
	for k := 0; k < sg.end-sg.start; k++ {
		b := sg.start + k
		base, item := l.KV.Ptrs[b], l.KV.ItemLens[b]
		dbase, ditem := sg.dst.Ptrs[k], sg.dst.ItemLens[k]
		for i, pg := range srcPages {
			src = append(src, nixl.Desc{Addr: uintptr(base + uint64(pg)*item), Len: item, DevID: l.KV.DevID})
			dst = append(dst, nixl.Desc{Addr: uintptr(dbase + uint64(dstPages[i])*ditem), Len: item, DevID: sg.dst.DevID})
		}
	}
	return src, dst
}

// KVRegions returns the registered regions of the local KV buffers and of the
// decode buffers of peer p's KV run seg, sorted for Coalesce: one region per
// buffer, as RegisterBuffers and SGLang register them.
func KVRegions(l *Local, p *Peer, seg int) (src, dst []nixl.Desc) {
	return SortRegions(l.KV.Regions()), SortRegions(p.segs[seg].dst.Regions())
}

// MergedKV appends KV run seg's descriptors for one chunk with every run that
// is contiguous on both sides merged (KVPairs, then Coalesce within the
// regions srcRegs and dstRegs; KVRegions gives the per-buffer ones).
func MergedKV(src, dst []nixl.Desc, l *Local, p *Peer, seg int, srcPages, dstPages []int32, srcRegs, dstRegs []nixl.Desc) ([]nixl.Desc, []nixl.Desc) {
	n := len(src)
	src, dst = KVPairs(src, dst, l, p, seg, srcPages, dstPages)
	s, d := Coalesce(src[n:], dst[n:], srcRegs, dstRegs)
	return src[:n+len(s)], dst[:n+len(d)]
}

// SortRegions sorts regions by address (in place) and returns them.
func SortRegions(regs []nixl.Desc) []nixl.Desc {
	slices.SortFunc(regs, func(a, b nixl.Desc) int {
		switch {
		case a.DevID != b.DevID:
			return cmpU64(a.DevID, b.DevID)
		default:
			return cmpU64(uint64(a.Addr), uint64(b.Addr))
		}
	})
	return regs
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Coalesce merges, in place, every pair i into pair i-1 when both sides
// continue it (src[i] starts where src[i-1] ends, dst[i] where dst[i-1] ends,
// same device, equal lengths within each pair) and the merged descriptor stays
// inside one region of srcRegs and one of dstRegs (sorted by SortRegions,
// non-overlapping; nil means unbounded). It returns the shortened slices. The
// pairs keep their order, so the merged list moves exactly the bytes of the
// original, each from and to the same place. Pairs whose lengths differ are
// left alone.
func Coalesce(src, dst []nixl.Desc, srcRegs, dstRegs []nixl.Desc) ([]nixl.Desc, []nixl.Desc) {
	if len(src) != len(dst) || len(src) < 2 {
		return src, dst
	}
	n := 0
	var sEnd, dEnd uint64 // region ends of the run at n (0: not looked up yet)
	var sLast, dLast int  // the regions found last: runs mostly share them
	for i := 1; i < len(src); i++ {
		s, d := &src[n], &dst[n]
		a, b := src[i], dst[i]
		if s.Len == d.Len && a.Len == b.Len && a.DevID == s.DevID && b.DevID == d.DevID &&
			uint64(s.Addr)+s.Len == uint64(a.Addr) && uint64(d.Addr)+d.Len == uint64(b.Addr) {
			if sEnd == 0 {
				sEnd, sLast = regionEnd(srcRegs, *s, sLast)
				dEnd, dLast = regionEnd(dstRegs, *d, dLast)
			}
			if uint64(a.Addr)+a.Len <= sEnd && uint64(b.Addr)+b.Len <= dEnd {
				s.Len += a.Len
				d.Len += b.Len
				continue
			}
		}
		n++
		src[n], dst[n] = a, b
		sEnd, dEnd = 0, 0
	}
	return src[:n+1], dst[:n+1]
}

// regionEnd is the end address of the region holding x (sorted regs), or
// x's own end when none holds it (a run is never grown past it); unbounded for
// nil regs. It tries region hint first and returns the index it found.
func regionEnd(regs []nixl.Desc, x nixl.Desc, hint int) (uint64, int) {
	if regs == nil {
		return ^uint64(0), 0
	}
	holds := func(r nixl.Desc) bool {
		return r.DevID == x.DevID && uint64(r.Addr) <= uint64(x.Addr) && uint64(x.Addr)+x.Len <= uint64(r.Addr)+r.Len
	}
	if hint < len(regs) && holds(regs[hint]) {
		return uint64(regs[hint].Addr) + regs[hint].Len, hint
	}
	// The last region starting at or before x on x's device.
	i, _ := slices.BinarySearchFunc(regs, x, func(r, x nixl.Desc) int {
		if r.DevID != x.DevID {
			return cmpU64(r.DevID, x.DevID)
		}
		return cmpU64(uint64(r.Addr), uint64(x.Addr)+1)
	})
	if i > 0 && holds(regs[i-1]) {
		return uint64(regs[i-1].Addr) + regs[i-1].Len, i - 1
	}
	return uint64(x.Addr) + x.Len, hint
}

// mergeable says whether kvRuns at least halves a chunk's descriptors on KV
// run sg: decode's slot stride equals the prefill item length on every
// buffer (else consecutive decode pages leave gaps) and the pages form at
// most half as many runs consecutive on both sides as there are pages. Below
// that, Make over the prepared lists costs less than Create.
func mergeable(l *Local, sg *kvSeg, src, dst []int32) bool {
	for k := 0; k < sg.end-sg.start; k++ {
		if sg.dst.ItemLens[k] != l.KV.ItemLens[sg.start+k] {
			return false
		}
	}
	return 2*pageRuns(src, dst) <= len(src)
}

// pageRuns counts the runs of pages consecutive on both sides.
func pageRuns(src, dst []int32) int {
	n := 0
	for i := range src {
		if i == 0 || src[i] != src[i-1]+1 || dst[i] != dst[i-1]+1 {
			n++
		}
	}
	return n
}

// kvRuns appends KV run sg's merged descriptors for a chunk: for every
// buffer (layer-major), one per run of pages consecutive on both sides. With
// decode's stride equal to the item length (mergeable) this is exactly
// MergedKV within per-buffer regions, without a region lookup and without
// allocating beyond src and dst's capacity.
func kvRuns(src, dst []nixl.Desc, l *Local, sg *kvSeg, sp, dp []int32) ([]nixl.Desc, []nixl.Desc) {
	for k := 0; k < sg.end-sg.start; k++ {
		b := sg.start + k
		base, item := l.KV.Ptrs[b], l.KV.ItemLens[b]
		dbase := sg.dst.Ptrs[k]
		for i := 0; i < len(sp); {
			j := i + 1
			for j < len(sp) && sp[j] == sp[j-1]+1 && dp[j] == dp[j-1]+1 {
				j++
			}
			n := uint64(j-i) * item
			src = append(src, nixl.Desc{Addr: uintptr(base + uint64(sp[i])*item), Len: n, DevID: l.KV.DevID})
			dst = append(dst, nixl.Desc{Addr: uintptr(dbase + uint64(dp[i])*item), Len: n, DevID: sg.dst.DevID})
			i = j
		}
	}
	return src, dst
}
