package sglang_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// fakeLocal is a geometry over made-up addresses (planning never touches memory).
func fakeLocal(bufs, slots int, item uint64) *sglang.Local {
	l := &sglang.Local{Sender: 5}
	l.KV = sglang.Buffers{NumSlots: slots, Kind: nixl.VRAM, DevID: 1}
	for b := range bufs {
		l.KV.Ptrs = append(l.KV.Ptrs, uint64(1+b)<<32)
		l.KV.ItemLens = append(l.KV.ItemLens, item)
	}
	l.Aux = sglang.Buffers{Ptrs: []uint64{0x100000, 0x200000}, ItemLens: []uint64{64, 64}, NumSlots: 8}
	l.State = []sglang.Buffers{{Ptrs: []uint64{0x300000, 0x400000}, ItemLens: []uint64{32, 16}, NumSlots: 16, Kind: nixl.VRAM, DevID: 1}}
	return l
}

func fakePeer(t *testing.T, l *sglang.Local, bufs, slots int, item uint64) *sglang.Peer {
	t.Helper()
	g := sglang.PeerGeometry{Agent: "dec", DstKVItemLen: item, DstNumSlots: slots, GPU: 3,
		AuxPtrs: []uint64{0x900000, 0xa00000}, StatePtrs: [][]uint64{{0xb00000, 0xc00000}}, StateSlots: []int{20}}
	for b := range bufs {
		g.KVPtrs = append(g.KVPtrs, uint64(0x10+b)<<32)
	}
	p, err := sglang.NewPeer(l, g)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPlanKVIndices(t *testing.T) {
	l := fakeLocal(4, 8, 256)
	p := fakePeer(t, l, 5, 10, 512) // a draft buffer more, bigger stride, more slots
	var plan sglang.Plan
	c := sglang.Chunk{Room: 9, ChunkID: 2, SrcPages: []int32{1, 2, 7}, DstPages: []int32{0, 9, 3}}
	if err := l.Plan(&plan, p, &c); err != nil {
		t.Fatal(err)
	}
	if len(plan.Reqs) != 1 || plan.Reqs[0].Kind != sglang.ReqKV {
		t.Fatalf("plan %+v", plan.Reqs)
	}
	r := plan.Reqs[0]
	var ws, wd []int32
	for b := range int32(4) {
		ws = append(ws, b*8+1, b*8+2, b*8+7)
		wd = append(wd, b*10+0, b*10+9, b*10+3)
	}
	if !slices.Equal(r.SrcIdx, ws) || !slices.Equal(r.DstIdx, wd) {
		t.Fatalf("indices %v %v, want %v %v", r.SrcIdx, r.DstIdx, ws, wd)
	}
	if string(r.Notif) != "9_kv_2_0_5" {
		t.Fatalf("notif %q", r.Notif)
	}
	// The prepared lists those indices point into.
	src, dst := sglang.KVSrcDescs(l), sglang.KVDstDescs(l, p)
	if len(src) != 4*8 || len(dst) != 4*10 {
		t.Fatalf("list sizes %d %d", len(src), len(dst))
	}
	if d := dst[3*10+9]; d.Addr != uintptr(0x13<<32+9*512) || d.Len != 256 || d.DevID != 3 {
		t.Fatalf("dst desc %+v", d)
	}
	if s := src[2*8+7]; s.Addr != uintptr(3<<32+7*256) || s.Len != 256 || s.DevID != 1 {
		t.Fatalf("src desc %+v", s)
	}
}

func TestPlanLastChunk(t *testing.T) {
	l := fakeLocal(2, 8, 256)
	p := fakePeer(t, l, 2, 8, 256)
	var plan sglang.Plan
	c := sglang.Chunk{Room: 4, ChunkID: 1, IsLast: true, SrcPages: []int32{0}, DstPages: []int32{1}, SrcAux: 3, DstAux: 6,
		SrcState: [][]int32{{3, 4, 5, 9}}, DstState: [][]int32{{10, 11, 13, 14}}}
	if err := l.Plan(&plan, p, &c); err != nil {
		t.Fatal(err)
	}
	kinds := []sglang.ReqKind{}
	for _, r := range plan.Reqs {
		kinds = append(kinds, r.Kind)
	}
	if !slices.Equal(kinds, []sglang.ReqKind{sglang.ReqKV, sglang.ReqState, sglang.ReqAux}) {
		t.Fatalf("kinds %v", kinds)
	}
	st := plan.Reqs[1]
	if string(st.Notif) != "4_state_5_0" || st.SrcKind != nixl.VRAM {
		t.Fatalf("state req %+v", st)
	}
	// Runs contiguous on both sides: [3,4]->[10,11], [5]->[13], [9]->[14], per buffer.
	want := []struct{ s, d, n uint64 }{{3, 10, 2}, {5, 13, 1}, {9, 14, 1}}
	if len(st.Src) != 6 {
		t.Fatalf("state descs %v", st.Src)
	}
	for b, item := range []uint64{32, 16} {
		sb, db := []uint64{0x300000, 0x400000}[b], []uint64{0xb00000, 0xc00000}[b]
		for i, w := range want {
			s, d := st.Src[b*3+i], st.Dst[b*3+i]
			if s.Addr != uintptr(sb+w.s*item) || d.Addr != uintptr(db+w.d*item) || s.Len != w.n*item || d.Len != s.Len || d.DevID != 3 || s.DevID != 1 {
				t.Fatalf("state buffer %d run %d: %+v -> %+v", b, i, s, d)
			}
		}
	}
	aux := plan.Reqs[2]
	if string(aux.Notif) != "4_aux" || len(aux.Src) != 2 || aux.Src[1].Addr != 0x200000+3*64 || aux.Dst[0].Addr != 0x900000+6*64 || aux.Dst[1].Len != 64 {
		t.Fatalf("aux req %+v", aux)
	}
}

func TestPlanNoKV(t *testing.T) {
	l := fakeLocal(2, 8, 256)
	p := fakePeer(t, l, 2, 8, 256)
	var plan sglang.Plan
	c := sglang.Chunk{Room: 4, ChunkID: 3, IsLast: true, NoKVChunks: 3}
	if err := l.Plan(&plan, p, &c); err != nil {
		t.Fatal(err)
	}
	if len(plan.Reqs) != 1 || string(plan.Reqs[0].Notif) != "4_aux_nokv_5" {
		t.Fatalf("baseline nokv plan %+v", plan.Reqs)
	}
	l.NoKV = sglang.NoKVWithCount
	if err := l.Plan(&plan, p, &c); err != nil || string(plan.Reqs[0].Notif) != "4_aux_nokv_5_3" {
		t.Fatalf("counted nokv plan %q %v", plan.Reqs[0].Notif, err)
	}
	c.IsLast = false // an empty middle chunk sends nothing
	if err := l.Plan(&plan, p, &c); err != nil || len(plan.Reqs) != 0 {
		t.Fatalf("empty middle chunk %+v %v", plan.Reqs, err)
	}
}

func TestPlanTruncates(t *testing.T) {
	l := fakeLocal(2, 8, 256)
	p := fakePeer(t, l, 2, 8, 256)
	var plan sglang.Plan
	c := sglang.Chunk{Room: 1, SrcPages: []int32{1, 2, 3}, DstPages: []int32{4, 5}}
	if err := l.Plan(&plan, p, &c); err != nil || plan.Truncated != 1 || len(plan.Reqs[0].SrcIdx) != 4 {
		t.Fatalf("truncation: %+v %v", plan, err)
	}
}

// TestPlanBounds: a bad index is an ErrInvalid error and plans nothing.
func TestPlanBounds(t *testing.T) {
	l := fakeLocal(2, 8, 256)
	p := fakePeer(t, l, 2, 10, 256)
	base := func() sglang.Chunk {
		return sglang.Chunk{Room: 1, IsLast: true, SrcPages: []int32{0}, DstPages: []int32{0}, SrcAux: 1, DstAux: 1,
			SrcState: [][]int32{{1}}, DstState: [][]int32{{1}}}
	}
	for _, c := range []struct {
		name string
		mod  func(*sglang.Chunk)
	}{
		{"prefill page past slots", func(c *sglang.Chunk) { c.SrcPages = []int32{8} }},
		{"decode page past dst slots", func(c *sglang.Chunk) { c.DstPages = []int32{10} }},
		{"negative page", func(c *sglang.Chunk) { c.SrcPages = []int32{-1} }},
		{"more decode pages", func(c *sglang.Chunk) { c.DstPages = []int32{0, 1} }},
		{"prefill aux", func(c *sglang.Chunk) { c.SrcAux = 8 }},
		{"decode aux", func(c *sglang.Chunk) { c.DstAux = -1 }},
		{"prefill state", func(c *sglang.Chunk) { c.SrcState = [][]int32{{16}} }},
		{"decode state", func(c *sglang.Chunk) { c.DstState = [][]int32{{20}} }},
		{"state count mismatch", func(c *sglang.Chunk) { c.DstState = [][]int32{{1, 2}} }},
		{"state component unknown", func(c *sglang.Chunk) { c.SrcState = [][]int32{nil, {1}}; c.DstState = [][]int32{nil, {1}} }},
		{"decode expects state, none sent", func(c *sglang.Chunk) { c.SrcState = nil }},
	} {
		ch := base()
		c.mod(&ch)
		plan := sglang.Plan{Reqs: make([]sglang.Req, 0, 4)}
		if err := l.Plan(&plan, p, &ch); !errors.Is(err, nixl.ErrInvalid) || len(plan.Reqs) != 0 {
			t.Errorf("%s: err %v, %d reqs", c.name, err, len(plan.Reqs))
		}
	}
	ok := base()
	if err := l.Plan(&sglang.Plan{}, p, &ok); err != nil {
		t.Fatalf("base chunk: %v", err)
	}
	l.Aux = sglang.Buffers{}
	if err := l.Plan(&sglang.Plan{}, p, &ok); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("last chunk without aux buffers: %v", err)
	}
}

func TestNewPeerRejects(t *testing.T) {
	l := fakeLocal(4, 8, 256)
	l.TPSize = 2
	good := sglang.PeerGeometry{Agent: "d", KVPtrs: []uint64{1 << 40, 2 << 40, 3 << 40, 4 << 40}, DstKVItemLen: 256, AuxPtrs: []uint64{1, 2}}
	if _, err := sglang.NewPeer(l, good); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*sglang.PeerGeometry){
		"no name":          func(g *sglang.PeerGeometry) { g.Agent = "" },
		"fewer KV buffers": func(g *sglang.PeerGeometry) { g.KVPtrs = g.KVPtrs[:3] },
		"smaller item":     func(g *sglang.PeerGeometry) { g.DstKVItemLen = 128 },
		"item len count":   func(g *sglang.PeerGeometry) { g.KVItemLens = []uint64{256} },
		"mixed kinds + draft": func(g *sglang.PeerGeometry) {
			g.KVPtrs = append(g.KVPtrs, 5<<40)
			g.KVKinds = []nixl.MemKind{nixl.VRAM, nixl.DRAM, nixl.VRAM, nixl.VRAM, nixl.VRAM}
		},
		"kind count":               func(g *sglang.PeerGeometry) { g.KVKinds = []nixl.MemKind{nixl.VRAM} },
		"fewer aux":                func(g *sglang.PeerGeometry) { g.AuxPtrs = g.AuxPtrs[:1] },
		"zero ptr":                 func(g *sglang.PeerGeometry) { g.KVPtrs = []uint64{0, 1, 2, 3} },
		"hetero TP, no head count": func(g *sglang.PeerGeometry) { g.TPSize = 4 },
	} {
		g := good
		g.KVPtrs = slices.Clone(good.KVPtrs)
		mod(&g)
		if _, err := sglang.NewPeer(l, g); !errors.Is(err, nixl.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	l.MLA = true // MLA replicates KV: any TP pairing is fine
	if _, err := sglang.NewPeer(l, sglang.PeerGeometry{Agent: "d", KVPtrs: good.KVPtrs, DstKVItemLen: 256, AuxPtrs: good.AuxPtrs, TPSize: 8}); err != nil {
		t.Fatalf("MLA with other TP: %v", err)
	}
	bad := fakeLocal(2, 8, 256)
	bad.Aux.Kind = nixl.VRAM
	if err := bad.Validate(); !errors.Is(err, nixl.ErrInvalid) {
		t.Errorf("VRAM aux: %v", err)
	}
}

// TestPlanNoAllocs: planning into a reused Plan does not allocate.
func TestPlanNoAllocs(t *testing.T) {
	l := fakeLocal(8, 64, 256)
	p := fakePeer(t, l, 8, 64, 256)
	c := sglang.Chunk{Room: 1, ChunkID: 3, IsLast: true, SrcPages: []int32{1, 2, 3, 9}, DstPages: []int32{5, 6, 7, 8}, SrcAux: 1, DstAux: 2,
		SrcState: [][]int32{{1, 2}}, DstState: [][]int32{{3, 4}}}
	var plan sglang.Plan
	if err := l.Plan(&plan, p, &c); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { l.Plan(&plan, p, &c) }); n != 0 {
		t.Fatalf("%v allocations per plan", n)
	}
}

// BenchmarkPlanChunk: index lists for one chunk of 2,048 pages × 128 layer buffers.
func BenchmarkPlanChunk(b *testing.B) {
	l := &sglang.Local{KV: sglang.Buffers{NumSlots: 16384, Kind: nixl.VRAM}}
	for i := range 128 {
		l.KV.Ptrs = append(l.KV.Ptrs, uint64(i+1)<<36)
		l.KV.ItemLens = append(l.KV.ItemLens, 4096)
	}
	p, err := sglang.NewPeer(l, sglang.PeerGeometry{Agent: "d", KVPtrs: l.KV.Ptrs, DstKVItemLen: 4096, DstNumSlots: 16384})
	if err != nil {
		b.Fatal(err)
	}
	src, dst := make([]int32, 2048), make([]int32, 2048)
	for i := range src {
		src[i], dst[i] = int32(3*i), int32(16383-i)
	}
	c := sglang.Chunk{Room: 1, SrcPages: src, DstPages: dst}
	var plan sglang.Plan
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Plan(&plan, p, &c); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(plan.Reqs[0].SrcIdx)), "indices/op")
}
