package sglang_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

func d(addr, n uint64) nixl.Desc { return nixl.Desc{Addr: uintptr(addr), Len: n} }

func TestCoalesceTable(t *testing.T) {
	for _, c := range []struct {
		name             string
		src, dst         []nixl.Desc
		sregs, dregs     []nixl.Desc
		wantSrc, wantDst []nixl.Desc
	}{
		{name: "empty"},
		{name: "one", src: []nixl.Desc{d(0, 8)}, dst: []nixl.Desc{d(100, 8)},
			wantSrc: []nixl.Desc{d(0, 8)}, wantDst: []nixl.Desc{d(100, 8)}},
		{name: "run of three", src: []nixl.Desc{d(0, 8), d(8, 8), d(16, 8)}, dst: []nixl.Desc{d(100, 8), d(108, 8), d(116, 8)},
			wantSrc: []nixl.Desc{d(0, 24)}, wantDst: []nixl.Desc{d(100, 24)}},
		{name: "src contiguous, dst not", src: []nixl.Desc{d(0, 8), d(8, 8)}, dst: []nixl.Desc{d(100, 8), d(200, 8)},
			wantSrc: []nixl.Desc{d(0, 8), d(8, 8)}, wantDst: []nixl.Desc{d(100, 8), d(200, 8)}},
		{name: "dst contiguous, src not", src: []nixl.Desc{d(0, 8), d(16, 8)}, dst: []nixl.Desc{d(100, 8), d(108, 8)},
			wantSrc: []nixl.Desc{d(0, 8), d(16, 8)}, wantDst: []nixl.Desc{d(100, 8), d(108, 8)}},
		{name: "reversed order is not merged", src: []nixl.Desc{d(8, 8), d(0, 8)}, dst: []nixl.Desc{d(108, 8), d(100, 8)},
			wantSrc: []nixl.Desc{d(8, 8), d(0, 8)}, wantDst: []nixl.Desc{d(108, 8), d(100, 8)}},
		{name: "two runs", src: []nixl.Desc{d(0, 8), d(8, 8), d(40, 8), d(48, 8)}, dst: []nixl.Desc{d(100, 8), d(108, 8), d(300, 8), d(308, 8)},
			wantSrc: []nixl.Desc{d(0, 16), d(40, 16)}, wantDst: []nixl.Desc{d(100, 16), d(300, 16)}},
		{name: "stride gap on dst (bigger decode item)", src: []nixl.Desc{d(0, 8), d(8, 8)}, dst: []nixl.Desc{d(100, 8), d(116, 8)},
			wantSrc: []nixl.Desc{d(0, 8), d(8, 8)}, wantDst: []nixl.Desc{d(100, 8), d(116, 8)}},
		{name: "layer boundary, one region per buffer", src: []nixl.Desc{d(56, 8), d(64, 8)}, dst: []nixl.Desc{d(156, 8), d(164, 8)},
			sregs: []nixl.Desc{d(0, 64), d(64, 64)}, dregs: []nixl.Desc{d(100, 64), d(164, 64)},
			wantSrc: []nixl.Desc{d(56, 8), d(64, 8)}, wantDst: []nixl.Desc{d(156, 8), d(164, 8)}},
		{name: "layer boundary, one slab region", src: []nixl.Desc{d(56, 8), d(64, 8)}, dst: []nixl.Desc{d(156, 8), d(164, 8)},
			sregs: []nixl.Desc{d(0, 128)}, dregs: []nixl.Desc{d(100, 128)},
			wantSrc: []nixl.Desc{d(56, 16)}, wantDst: []nixl.Desc{d(156, 16)}},
		{name: "slab on src only", src: []nixl.Desc{d(56, 8), d(64, 8)}, dst: []nixl.Desc{d(156, 8), d(164, 8)},
			sregs: []nixl.Desc{d(0, 128)}, dregs: []nixl.Desc{d(100, 64), d(164, 64)},
			wantSrc: []nixl.Desc{d(56, 8), d(64, 8)}, wantDst: []nixl.Desc{d(156, 8), d(164, 8)}},
		{name: "device differs", src: []nixl.Desc{d(0, 8), {Addr: 8, Len: 8, DevID: 1}}, dst: []nixl.Desc{d(100, 8), d(108, 8)},
			wantSrc: []nixl.Desc{d(0, 8), {Addr: 8, Len: 8, DevID: 1}}, wantDst: []nixl.Desc{d(100, 8), d(108, 8)}},
		{name: "unequal pair lengths stay", src: []nixl.Desc{d(0, 8), d(8, 4)}, dst: []nixl.Desc{d(100, 8), d(108, 8)},
			wantSrc: []nixl.Desc{d(0, 8), d(8, 4)}, wantDst: []nixl.Desc{d(100, 8), d(108, 8)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, dd := sglang.Coalesce(slices.Clone(c.src), slices.Clone(c.dst), sglang.SortRegions(c.sregs), sglang.SortRegions(c.dregs))
			if len(s) != len(c.wantSrc) || (len(s) > 0 && (!slices.Equal(s, c.wantSrc) || !slices.Equal(dd, c.wantDst))) {
				t.Fatalf("got %v → %v\nwant %v → %v", s, dd, c.wantSrc, c.wantDst)
			}
		})
	}
}

// byteMap is what a descriptor list does: destination byte → source byte.
// It fails on a destination written twice (no list here does that).
func byteMap(t testing.TB, src, dst []nixl.Desc) map[uint64]uint64 {
	t.Helper()
	m := map[uint64]uint64{}
	for i := range src {
		if src[i].Len != dst[i].Len {
			t.Fatalf("pair %d: lengths %d and %d", i, src[i].Len, dst[i].Len)
		}
		for k := range src[i].Len {
			key := dst[i].DevID<<56 | (uint64(dst[i].Addr) + k)
			if _, dup := m[key]; dup {
				t.Fatalf("destination %#x written twice", key)
			}
			m[key] = src[i].DevID<<56 | (uint64(src[i].Addr) + k)
		}
	}
	return m
}

func inRegions(regs []nixl.Desc, x nixl.Desc) bool {
	if regs == nil {
		return true
	}
	for _, r := range regs {
		if r.DevID == x.DevID && r.Addr <= x.Addr && uint64(x.Addr)+x.Len <= uint64(r.Addr)+r.Len {
			return true
		}
	}
	return false
}

// checkCoalesce merges a copy of (src, dst) and checks the merged list moves
// exactly the same bytes, each merged descriptor inside one region, with no
// more descriptors and no mergeable neighbours left within a region.
func checkCoalesce(t testing.TB, src, dst, sregs, dregs []nixl.Desc) (int, int) {
	t.Helper()
	want := byteMap(t, src, dst)
	s, dd := sglang.Coalesce(slices.Clone(src), slices.Clone(dst), sregs, dregs)
	if len(s) != len(dd) || len(s) > len(src) {
		t.Fatalf("merged %d/%d from %d", len(s), len(dd), len(src))
	}
	got := byteMap(t, s, dd)
	if len(got) != len(want) {
		t.Fatalf("merged list moves %d bytes, original %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("destination %#x from %#x, want %#x", k, got[k], v)
		}
	}
	for i := range s {
		// A merged descriptor (longer than the pair it started from) must lie
		// inside one region on each side; unmerged ones are passed through.
		if !slices.Contains(src, s[i]) && (!inRegions(sregs, s[i]) || !inRegions(dregs, dd[i])) {
			t.Fatalf("merged pair %d %v → %v crosses a region", i, s[i], dd[i])
		}
	}
	return len(src), len(s)
}

// TestCoalesceProperty: random lists of pages from several buffers (some
// regions per buffer, some one slab) merge into lists that move the same bytes.
func TestCoalesceProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	before, after := 0, 0
	for range 500 {
		src, dst, sregs, dregs := randomPairs(rng)
		b, a := checkCoalesce(t, src, dst, sregs, dregs)
		before, after = before+b, after+a
	}
	if after >= before { // the generator makes runs; some must merge
		t.Fatalf("%d descriptors merged into %d", before, after)
	}
	t.Logf("%d descriptors merged into %d", before, after)
}

// randomPairs is a KV-like list: bufs buffers of slots items, pages taken in
// runs (contiguous or not on each side), regions per buffer or one slab.
func randomPairs(rng *rand.Rand) (src, dst, sregs, dregs []nixl.Desc) {
	bufs, slots := 1+rng.IntN(4), 1+rng.IntN(12)
	item := uint64(1 + rng.IntN(8))
	ditem := item
	if rng.IntN(4) == 0 {
		ditem += uint64(rng.IntN(3)) // decode stride bigger: never merged on dst
	}
	sbase, dbase := uint64(1000), uint64(50000)
	gap := uint64(rng.IntN(2)) * 7 // buffers back to back or not
	for b := range bufs {
		sregs = append(sregs, d(sbase+uint64(b)*(uint64(slots)*item+gap), uint64(slots)*item))
		dregs = append(dregs, d(dbase+uint64(b)*(uint64(slots)*ditem+gap), uint64(slots)*ditem))
	}
	if rng.IntN(3) == 0 { // one slab registration on a side
		sregs = []nixl.Desc{d(sbase, uint64(bufs)*(uint64(slots)*item+gap))}
	}
	if rng.IntN(3) == 0 {
		dregs = []nixl.Desc{d(dbase, uint64(bufs)*(uint64(slots)*ditem+gap))}
	}
	n := 1 + rng.IntN(slots)
	sp, dp := rng.Perm(slots)[:n], rng.Perm(slots)[:n]
	if rng.IntN(2) == 0 {
		slices.Sort(sp)
	}
	if rng.IntN(2) == 0 {
		slices.Sort(dp)
	}
	for b := range bufs {
		for i := range n {
			src = append(src, d(uint64(sregs0(sbase, b, slots, item, gap))+uint64(sp[i])*item, item))
			dst = append(dst, d(uint64(sregs0(dbase, b, slots, ditem, gap))+uint64(dp[i])*ditem, item))
		}
	}
	return src, dst, sregs, dregs
}

func sregs0(base uint64, b, slots int, item, gap uint64) uint64 {
	return base + uint64(b)*(uint64(slots)*item+gap)
}

// FuzzCoalesce: any list of pairs (addresses and lengths from the input) and
// any regions merge into a list that moves the same bytes.
func FuzzCoalesce(f *testing.F) {
	f.Add([]byte{0, 8, 8, 8, 16, 8}, []byte{100, 8, 108, 8, 116, 8}, uint8(0))
	f.Add([]byte{56, 8, 64, 8}, []byte{156, 8, 164, 8}, uint8(3))
	f.Fuzz(func(t *testing.T, sb, db []byte, regMode uint8) {
		n := min(len(sb), len(db)) / 2
		if n > 64 {
			n = 64
		}
		var src, dst []nixl.Desc
		used := map[uint64]bool{}
		for i := range n {
			l := uint64(sb[2*i+1]%16) + 1
			s := d(uint64(sb[2*i])*4, l)
			x := d(4096+uint64(db[2*i])*4+uint64(i)*0, l)
			overlap := false
			for k := range l {
				if used[uint64(x.Addr)+k] {
					overlap = true
				}
			}
			if overlap {
				continue // a destination byte written twice has no single meaning
			}
			for k := range l {
				used[uint64(x.Addr)+k] = true
			}
			src, dst = append(src, s), append(dst, x)
		}
		var sregs, dregs []nixl.Desc
		switch regMode % 3 {
		case 1: // everything in one region
			sregs, dregs = []nixl.Desc{d(0, 2048)}, []nixl.Desc{d(4096, 2048)}
		case 2: // 256-byte regions
			for a := uint64(0); a < 2048; a += 256 {
				sregs = append(sregs, d(a, 256))
				dregs = append(dregs, d(4096+a, 256))
			}
		}
		checkCoalesce(t, src, dst, sregs, dregs)
	})
}

// TestMergedKV: a chunk's merged descriptors over SGLang's geometry are the
// page runs contiguous on both sides, per buffer, and move the same bytes as
// KVPairs (SGLang's one descriptor per buffer and page).
func TestMergedKV(t *testing.T) {
	l := fakeLocal(4, 16, 256)
	for _, c := range []struct {
		name     string
		ditem    uint64
		src, dst []int32
		want     int
	}{
		{"one run", 256, []int32{3, 4, 5, 6}, []int32{0, 1, 2, 3}, 4},
		{"two runs", 256, []int32{3, 4, 9, 10}, []int32{0, 1, 2, 3}, 8},
		{"dst breaks", 256, []int32{3, 4, 5, 6}, []int32{0, 1, 5, 6}, 8},
		{"scattered", 256, []int32{1, 3, 5}, []int32{0, 1, 2}, 12},
		{"bigger decode stride", 512, []int32{3, 4, 5}, []int32{0, 1, 2}, 12},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := fakePeer(t, l, 4, 16, c.ditem)
			ps, pd := sglang.KVPairs(nil, nil, l, p, 0, c.src, c.dst)
			if len(ps) != 4*len(c.src) {
				t.Fatalf("%d pairs", len(ps))
			}
			sr, dr := sglang.KVRegions(l, p, 0)
			ms, md := sglang.MergedKV(nil, nil, l, p, 0, c.src, c.dst, sr, dr)
			if len(ms) != c.want {
				t.Fatalf("%d merged descriptors, want %d: %v", len(ms), c.want, ms)
			}
			checkCoalesce(t, ps, pd, sr, dr)
			if got, want := byteMap(t, ms, md), byteMap(t, ps, pd); len(got) != len(want) {
				t.Fatalf("merged moves %d bytes, pairs %d", len(got), len(want))
			}
			// The explicit pairs are exactly the prepared lists' entries at
			// the planned indices.
			var plan sglang.Plan
			if err := l.Plan(&plan, p, &sglang.Chunk{Room: 1, SrcPages: c.src, DstPages: c.dst}); err != nil {
				t.Fatal(err)
			}
			sl, dl := sglang.KVSrcDescs(l), sglang.KVDstDescs(l, p)
			for i, x := range plan.Reqs[0].SrcIdx {
				if sl[x] != ps[i] || dl[plan.Reqs[0].DstIdx[i]] != pd[i] {
					t.Fatalf("pair %d: %v → %v, prepared %v → %v", i, ps[i], pd[i], sl[x], dl[plan.Reqs[0].DstIdx[i]])
				}
			}
		})
	}
}

// TestMergedKVWritesSameBytes: over the loopback fabric, a chunk written
// with the merged list (planned with Local.MergeKV, made by MakeReq) leaves
// decode memory byte for byte as the same chunk written with SGLang's
// prepared per-page request does.
func TestMergedKVWritesSameBytes(t *testing.T) {
	pre := newNode(t, "prefill", small, 0)
	fillKV(pre, small.Item)
	decA, decB := newNode(t, "decodeA", small, 0), newNode(t, "decodeB", small, 0)
	local, err := sglang.PrepLocalKV(pre.ag, &pre.geo)
	if err != nil {
		t.Fatal(err)
	}
	var peers []*sglang.Peer
	var lists []nixl.ListID
	var names []string
	for _, dn := range []*node{decA, decB} {
		md, _ := dn.ag.LocalMetadata()
		name, err := pre.ag.LoadPeer(md)
		if err != nil {
			t.Fatal(err)
		}
		p, err := sglang.NewPeer(&pre.geo, dn.geo.AsPeer(name))
		if err != nil {
			t.Fatal(err)
		}
		list, err := sglang.PrepPeerKV(pre.ag, &pre.geo, p)
		if err != nil {
			t.Fatal(err)
		}
		peers, lists, names = append(peers, p), append(lists, list), append(names, name)
	}
	// Pages with runs on both sides, runs broken on one side, and singles.
	src := []int32{5, 6, 7, 8, 20, 30, 31, 40, 41, 42, 50, 51}
	dst := []int32{10, 11, 12, 13, 14, 2, 3, 52, 53, 54, 60, 61}
	// A: SGLang's prepared request.
	var plan sglang.Plan
	if err := pre.geo.Plan(&plan, peers[0], &sglang.Chunk{Room: 1, SrcPages: src, DstPages: dst}); err != nil {
		t.Fatal(err)
	}
	xa, err := sglang.MakeReq(pre.ag, local, lists[0], names[0], &plan.Reqs[0])
	if err != nil {
		t.Fatal(err)
	}
	// B: the merged explicit list.
	sr, dr := sglang.KVRegions(&pre.geo, peers[1], 0)
	ms, md := sglang.MergedKV(nil, nil, &pre.geo, peers[1], 0, src, dst, sr, dr)
	if want := 2 * small.Layers * 5; len(ms) != want { // 5 runs per buffer
		t.Fatalf("%d merged descriptors, want %d", len(ms), want)
	}
	// Planned with MergeKV, the request carries exactly that list.
	merging := pre.geo
	merging.MergeKV = true
	var mplan sglang.Plan
	if err := merging.Plan(&mplan, peers[1], &sglang.Chunk{Room: 1, SrcPages: src, DstPages: dst}); err != nil {
		t.Fatal(err)
	}
	if r := mplan.Reqs[0]; r.Kind != sglang.ReqKV || len(r.SrcIdx) != 0 || !slices.Equal(r.Src, ms) || !slices.Equal(r.Dst, md) {
		t.Fatalf("MergeKV plan: %+v", r)
	}
	xb, err := sglang.MakeReq(pre.ag, local, lists[1], names[1], &mplan.Reqs[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []nixl.XferID{xa, xb} {
		if _, err := pre.ag.Post(x); err != nil {
			t.Fatal(err)
		}
	}
	pool := &xferPool{t: t, ag: pre.ag, local: local, ids: []nixl.XferID{xa, xb}}
	pool.drain()
	for b := range decA.kv {
		if !slices.Equal(decA.kv[b], decB.kv[b]) {
			t.Fatalf("buffer %d differs between the prepared and the merged write", b)
		}
	}
	for i := range src {
		checkKVPage(t, decB, int(dst[i]), int(src[i]), small.Item)
	}
	// Pages not written stay zero on both.
	if decB.kv[0][small.Item*1] != 0 {
		t.Fatal("page 1 of decode written")
	}
}

// TestPlanMergeKV: with Local.MergeKV, Plan sends the merged list when it at
// least halves the descriptors, and SGLang's indices otherwise.
func TestPlanMergeKV(t *testing.T) {
	l := fakeLocal(4, 16, 256)
	l.MergeKV = true
	for _, c := range []struct {
		name     string
		ditem    uint64
		src, dst []int32
		merged   bool
	}{
		{"one run", 256, []int32{3, 4, 5, 6}, []int32{0, 1, 2, 3}, true},
		{"half", 256, []int32{3, 4, 9, 10}, []int32{0, 1, 2, 3}, true},
		{"scattered", 256, []int32{1, 3, 5}, []int32{0, 1, 2}, false},
		{"three runs of four pages", 256, []int32{3, 4, 9, 10}, []int32{0, 1, 5, 6}, true},
		{"single page", 256, []int32{3}, []int32{0}, false},
		{"decode stride larger", 512, []int32{3, 4, 5, 6}, []int32{0, 1, 2, 3}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := fakePeer(t, l, 4, 16, c.ditem)
			var plan sglang.Plan
			if err := l.Plan(&plan, p, &sglang.Chunk{Room: 3, SrcPages: c.src, DstPages: c.dst}); err != nil {
				t.Fatal(err)
			}
			r := plan.Reqs[0]
			if got := len(r.Src) > 0; got != c.merged {
				t.Fatalf("merged %v, want %v: %+v", got, c.merged, r)
			}
			if !c.merged {
				if len(r.SrcIdx) != 4*len(c.src) {
					t.Fatalf("%d indices", len(r.SrcIdx))
				}
				return
			}
			sr, dr := sglang.KVRegions(l, p, 0)
			ms, md := sglang.MergedKV(nil, nil, l, p, 0, c.src, c.dst, sr, dr)
			if len(r.SrcIdx) != 0 || !slices.Equal(r.Src, ms) || !slices.Equal(r.Dst, md) {
				t.Fatalf("plan %v → %v, MergedKV %v → %v", r.Src, r.Dst, ms, md)
			}
			if r.SrcKind != nixl.VRAM || r.DstKind != nixl.VRAM || string(r.Notif) != "3_kv_0_0_5" {
				t.Fatalf("kinds %v/%v notif %q", r.SrcKind, r.DstKind, r.Notif)
			}
		})
	}
}

// TestPlanMergeKVProperty: over random chunks, the MergeKV plan (when it
// merges) is MergedKV's list and moves the bytes of SGLang's indices.
func TestPlanMergeKVProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	l := fakeLocal(3, 32, 64)
	l.MergeKV = true
	p := fakePeer(t, l, 3, 32, 64)
	sl, dl := sglang.KVSrcDescs(l), sglang.KVDstDescs(l, p)
	sr, dr := sglang.KVRegions(l, p, 0)
	merged := 0
	for range 300 {
		n := 1 + rng.IntN(12)
		src, dst := make([]int32, n), make([]int32, n)
		s0, d0 := int32(rng.IntN(32-n+1)), int32(rng.IntN(32-n+1))
		for i := range src {
			src[i], dst[i] = s0+int32(i), d0+int32(i)
			if rng.IntN(4) == 0 { // break a run now and then
				src[i] = int32(rng.IntN(32))
			}
		}
		if len(uniq(src)) != n || len(uniq(dst)) != n {
			continue
		}
		var plan, ref sglang.Plan
		plain := *l
		plain.MergeKV = false
		if err := l.Plan(&plan, p, &sglang.Chunk{Room: 1, SrcPages: src, DstPages: dst}); err != nil {
			t.Fatal(err)
		}
		if err := plain.Plan(&ref, p, &sglang.Chunk{Room: 1, SrcPages: src, DstPages: dst}); err != nil {
			t.Fatal(err)
		}
		r := plan.Reqs[0]
		if len(r.Src) == 0 {
			continue
		}
		merged++
		ms, md := sglang.MergedKV(nil, nil, l, p, 0, src, dst, sr, dr)
		if !slices.Equal(r.Src, ms) || !slices.Equal(r.Dst, md) {
			t.Fatalf("pages %v → %v: plan %v, MergedKV %v", src, dst, r.Src, ms)
		}
		var ps, pd []nixl.Desc
		for i, x := range ref.Reqs[0].SrcIdx {
			ps, pd = append(ps, sl[x]), append(pd, dl[ref.Reqs[0].DstIdx[i]])
		}
		want, got := byteMap(t, ps, pd), byteMap(t, r.Src, r.Dst)
		if len(got) != len(want) {
			t.Fatalf("merged plan moves %d bytes, indices %d", len(got), len(want))
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("destination %#x from %#x, want %#x", k, got[k], v)
			}
		}
	}
	if merged == 0 {
		t.Fatal("no chunk was merged")
	}
}

func uniq(v []int32) map[int32]bool {
	m := map[int32]bool{}
	for _, x := range v {
		m[x] = true
	}
	return m
}

// BenchmarkPlanLargeRoom: planning one 51-page chunk over 160 buffers (an
// 80-layer model, pages in runs of 4), as SGLang's indices, as Plan with
// MergeKV, and as MergedKV with region lookups.
//
//	go test -run '^$' -bench PlanLargeRoom ./nixl/sglang/
func BenchmarkPlanLargeRoom(b *testing.B) {
	l := fakeLocal(160, 1024, 8192)
	g := sglang.PeerGeometry{Agent: "dec", DstKVItemLen: 8192, DstNumSlots: 1024, AuxPtrs: []uint64{0x900000, 0xa00000}}
	for k := range 160 {
		g.KVPtrs = append(g.KVPtrs, uint64(0x1000+k)<<32)
	}
	p, err := sglang.NewPeer(l, g)
	if err != nil {
		b.Fatal(err)
	}
	src, dst := make([]int32, 51), make([]int32, 51)
	for i := range src {
		src[i], dst[i] = int32(100+(i/4)*9+i%4), int32(500+(i/4)*7+i%4)
	}
	c := &sglang.Chunk{Room: 1, SrcPages: src, DstPages: dst}
	for _, m := range []bool{false, true} {
		name := "sglang-indices"
		if m {
			name = "merge-kv"
		}
		b.Run(name, func(b *testing.B) {
			ll := *l
			ll.MergeKV = m
			var plan sglang.Plan
			b.ReportAllocs()
			for b.Loop() {
				if err := ll.Plan(&plan, p, c); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(max(len(plan.Reqs[0].SrcIdx), len(plan.Reqs[0].Src))), "descs")
		})
	}
	b.Run("mergedkv-regions", func(b *testing.B) {
		sr, dr := sglang.KVRegions(l, p, 0)
		var s, d []nixl.Desc
		b.ReportAllocs()
		for b.Loop() {
			s, d = sglang.MergedKV(s[:0], d[:0], l, p, 0, src, dst, sr, dr)
		}
		b.ReportMetric(float64(len(s)), "descs")
	})
}
