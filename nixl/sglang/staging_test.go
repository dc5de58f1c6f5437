package sglang_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// TestStagingLayout: compute_staging_layout by hand for SGLang's shapes.
func TestStagingLayout(t *testing.T) {
	for _, c := range []struct {
		ptp, dtp, drank, heads, tokens int
		hb                             uint64
		layers                         int
		want                           []uint64
	}{
		// fan-in 2→1, 4 heads: two writers of 2 heads each; 8 tokens, 4 B, 2 layers.
		{2, 1, 0, 4, 8, 4, 2, []uint64{8 * 2 * 4 * 2 * 2, 8 * 2 * 4 * 2 * 2}},
		// fan-out 1→2: one writer with decode's 2 heads.
		{1, 2, 1, 4, 8, 4, 2, []uint64{8 * 2 * 4 * 2 * 2}},
		// 4→2 of 8 heads: two writers of 2 heads.
		{4, 2, 1, 8, 3, 8, 3, []uint64{3 * 2 * 8 * 3 * 2, 3 * 2 * 8 * 3 * 2}},
		// GQA replication 2→4 of 2 heads: one writer, one head.
		{2, 4, 2, 2, 4, 2, 1, []uint64{4 * 1 * 2 * 1 * 2}},
	} {
		w, total := sglang.StagingLayout(c.ptp, c.dtp, c.drank, c.heads, c.tokens, c.hb, c.layers)
		var sum uint64
		for _, b := range c.want {
			sum += b
		}
		if len(w) != len(c.want) || total != sum {
			t.Fatalf("%+v: %v %d", c, w, total)
		}
		for i := range w {
			if w[i] != c.want[i] {
				t.Fatalf("%+v: %v", c, w)
			}
		}
	}
	if g := sglang.StagingGridPages(0, 16); g != 512 {
		t.Fatalf("default grid %d", g)
	}
	if g := sglang.StagingGridPages(100, 16); g != 6 {
		t.Fatalf("grid %d", g)
	}
}

// TestPlanStaged: a fan-in writer's block starts after the earlier writers'
// blocks, runs merge (whole tokens of consecutive pages), the notification is
// the stg one (none for a 0.5.23 peer), and SGLang's refusals hold.
func TestPlanStaged(t *testing.T) {
	// Prefill rank 1 of 2, 4 heads total (2 here), 2 layers, page 2, 4 B/head:
	// item len 2 tokens × 2 heads × 4 = 16.
	l := fakeLocal(4, 8, 16)
	l.TPSize, l.TPRank, l.TotalKVHeads, l.PageSize, l.Sender = 2, 1, 4, 2, 1
	g := sglang.PeerGeometry{Agent: "dec", DstKVItemLen: 32, TPSize: 1, TPRank: 0, GPU: 3,
		AuxPtrs: []uint64{0x900000, 0xa00000}, StagingBase: 0x7000000, StagingSize: 1 << 20}
	for b := range 4 {
		g.KVPtrs = append(g.KVPtrs, uint64(0x10+b)<<32)
	}
	p, err := sglang.NewPeer(l, g)
	if err != nil {
		t.Fatal(err)
	}
	var plan sglang.Plan
	c := &sglang.StagedChunk{Room: 9, ChunkID: 2, IsLast: true, SrcPages: []int32{4, 5, 1}, PageStart: 6, ChunkIdx: 3, Offset: 4096}
	if err := l.PlanStaged(&plan, p, c); err != nil {
		t.Fatal(err)
	}
	if len(plan.Reqs) != 1 {
		t.Fatalf("%d requests", len(plan.Reqs))
	}
	r := plan.Reqs[0]
	if string(r.Notif) != "9_stg_2_1_1_3_6_3_dec" {
		t.Fatalf("notif %q", r.Notif)
	}
	// Per layer: 3 pages × 2 tokens × 8 B = 48 B; block = 4 layers-of-K/V × 48
	// = 192 B; writer 1 starts after writer 0's 192 B. Pages 4,5 are adjacent
	// in the source: 2 runs per layer buffer, 8 in all.
	if len(r.Src) != 8 {
		t.Fatalf("%d runs: %+v", len(r.Src), r.Src)
	}
	var total uint64
	for i := range r.Src {
		if r.Src[i].Len != r.Dst[i].Len {
			t.Fatal("run lengths differ")
		}
		total += r.Src[i].Len
	}
	if total != 192 {
		t.Fatalf("%d bytes", total)
	}
	if r.Dst[0].Addr != 0x7000000+4096+192 || r.Dst[0].DevID != 3 || r.DstKind != nixl.VRAM {
		t.Fatalf("first run %+v", r.Dst[0])
	}
	if r.Src[0].Addr != uintptr(l.KV.Ptrs[0]+4*16) || r.Src[0].Len != 32 || r.Src[1].Addr != uintptr(l.KV.Ptrs[0]+1*16) {
		t.Fatalf("source runs %+v", r.Src[:2])
	}
	if r.Dst[2].Addr != 0x7000000+4096+192+48 {
		t.Fatalf("layer 1 starts at %#x", r.Dst[2].Addr)
	}
	// 0.5.23: no notification on the write.
	g.NoNotifs = true
	p23, _ := sglang.NewPeer(l, g)
	if err := l.PlanStaged(&plan, p23, c); err != nil || len(plan.Reqs[0].Notif) != 0 {
		t.Fatalf("%v %q", err, plan.Reqs[0].Notif)
	}
	for _, x := range []struct {
		off  int64
		want string
	}{
		{wire.AllocOversized, "Chunk staging allocation permanently failed"},
		{1<<20 - 383, "Staged transfer cannot fit chunk"},
		{-1, "Staged transfer cannot fit chunk"},
	} {
		c2 := *c
		c2.Offset = x.off
		if err := l.PlanStaged(&plan, p, &c2); err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("offset %d: %v", x.off, err)
		}
	}
	c3 := *c
	c3.SrcPages = []int32{8}
	if err := l.PlanStaged(&plan, p, &c3); err == nil {
		t.Error("a page outside the pool was planned")
	}
	g.StagingBase, g.StagingSize = 0, 0
	noStg, _ := sglang.NewPeer(l, g)
	if err := l.PlanStaged(&plan, noStg, c); err == nil {
		t.Error("staged write to a peer without staging")
	}
}

// TestPlanWithStagedRegion: Plan with Chunk.Staged writes the chunk's KV
// exactly as PlanStaged does (same runs, same stg notification) and, on a
// last chunk, the aux slot after it with SGLang's plain "{room}_aux"
// notification (the chunk had KV, so not aux_nokv), as send_kvcache_staged's
// chunk is followed by send_aux in the transfer worker. A non-last chunk
// plans the staged write alone; refusals are PlanStaged's.
func TestPlanWithStagedRegion(t *testing.T) {
	l := fakeLocal(4, 8, 16)
	l.TPSize, l.TPRank, l.TotalKVHeads, l.PageSize, l.Sender = 2, 1, 4, 2, 1
	g := sglang.PeerGeometry{Agent: "dec", DstKVItemLen: 32, TPSize: 1, TPRank: 0, GPU: 3, DstNumSlots: 16,
		AuxPtrs: []uint64{0x900000, 0xa00000}, StagingBase: 0x7000000, StagingSize: 1 << 20}
	for b := range 4 {
		g.KVPtrs = append(g.KVPtrs, uint64(0x10+b)<<32)
	}
	p, err := sglang.NewPeer(l, g)
	if err != nil {
		t.Fatal(err)
	}
	src := []int32{4, 5, 1}
	var want, got sglang.Plan
	if err := l.PlanStaged(&want, p, &sglang.StagedChunk{Room: 9, ChunkID: 2, IsLast: true, SrcPages: src, PageStart: 6, ChunkIdx: 3, Offset: 4096}); err != nil {
		t.Fatal(err)
	}
	c := &sglang.Chunk{Room: 9, ChunkID: 2, IsLast: true, SrcPages: src, DstPages: []int32{7, 8, 9}, SrcAux: 2, DstAux: 5,
		Staged: &sglang.StagedRegion{ChunkIdx: 3, PageStart: 6, Offset: 4096}}
	if err := l.Plan(&got, p, c); err != nil {
		t.Fatal(err)
	}
	if len(got.Reqs) != 2 || got.Reqs[0].Kind != sglang.ReqSlice || got.Reqs[1].Kind != sglang.ReqAux {
		t.Fatalf("requests %+v", got.Reqs)
	}
	w, r := want.Reqs[0], got.Reqs[0]
	if string(r.Notif) != string(w.Notif) || !slices.Equal(r.Src, w.Src) || !slices.Equal(r.Dst, w.Dst) || r.DstKind != nixl.VRAM {
		t.Fatalf("staged part %q %+v, want %q %+v", r.Notif, r.Dst, w.Notif, w.Dst)
	}
	if string(got.Reqs[1].Notif) != "9_aux" {
		t.Fatalf("aux notif %q", got.Reqs[1].Notif)
	}
	c.IsLast = false
	if err := l.Plan(&got, p, c); err != nil || len(got.Reqs) != 1 || string(got.Reqs[0].Notif) != "9_stg_2_0_1_3_6_3_dec" {
		t.Fatalf("non-last: %v %+v", err, got.Reqs)
	}
	c.Staged.Offset = wire.AllocOversized
	if err := l.Plan(&got, p, c); err == nil || !strings.Contains(err.Error(), "permanently failed") {
		t.Fatalf("oversized region planned: %v", err)
	}
}
