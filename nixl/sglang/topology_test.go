package sglang_test

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// The topology tests build every prefill rank and every decode rank of a
// deployment as its own loopback agent, run one room through SGLang's rank
// mapping (which prefill ranks each decode rank pulls from, which are dummies,
// how many senders it waits for), and check every byte decode holds afterwards
// against a pattern of the byte's *logical* coordinates: model layer, K or V,
// request page, token, global KV head and byte within the head. Each side
// lays its own heads and layers out as SGLang's pools do; the expected bytes
// never go through the prefill's transfer geometry.

type topo struct {
	name      string
	mla       bool
	heads     int // total KV heads (MHA)
	ptp, dtp  int
	ppp, dpp  int
	layers    int // model layers
	page      int // tokens per page
	bph       int // bytes per head per token (MLA: per token)
	layerIDs  bool
	dram      bool // decode KV is DRAM (else VRAM-labelled host memory)
	mixedDst  bool // decode's V buffers DRAM, K VRAM (HiSparse-like)
	rules     sglang.Rules
	slots     int
	wantParts int
}

// owned is the global KV heads a rank of t ranks holds (SGLang shards heads
// contiguously and replicates them when there are more ranks than heads).
func owned(h, t, r int) []int {
	if t <= h {
		n := h / t
		out := make([]int, n)
		for i := range out {
			out[i] = r*n + i
		}
		return out
	}
	return []int{r / (t / h)}
}

// stage is the model layers of PP stage s of pp.
func stage(layers, pp, s int) (int, int) { n := layers / pp; return s * n, (s + 1) * n }

func logical(room uint64, layer, kv, j, t, g, x int) byte {
	return byte(int(room%97)*7 + layer*31 + kv*17 + j*13 + t*5 + g*29 + x*3 + 1)
}

// rank is one side's rank: its agent, buffers (with their model layer and K/V)
// and heads.
type rank struct {
	ag     *loopback.Agent
	geo    sglang.Local
	kv     [][]byte
	layer  []int
	kvHalf []int
	heads  []int
	item   int
	aux    [][]byte
}

func (tp *topo) newRank(t *testing.T, name string, tpSize, tpRank, pp, ppRank int, decode bool) *rank {
	t.Helper()
	ag, err := loopback.New(fmt.Sprintf("%s-%d", name, nodeSeq.Add(1)), loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ag.Close() })
	r := &rank{ag: ag}
	from, to := stage(tp.layers, pp, ppRank)
	if tp.mla {
		r.heads = []int{0}
	} else {
		r.heads = owned(tp.heads, tpSize, tpRank)
	}
	r.item = tp.page * len(r.heads) * tp.bph
	kind := nixl.VRAM
	if decode && tp.dram {
		kind = nixl.DRAM
	}
	r.geo = sglang.Local{Sender: ppRank*tp.ptp + tpRank, TPSize: tpSize, TPRank: tpRank, MLA: tp.mla, PageSize: tp.page,
		TotalKVHeads: tp.heads, PPSize: pp, StartLayer: from, NoKV: sglang.NoKVWithCount}
	r.geo.KV = sglang.Buffers{NumSlots: tp.slots, Kind: kind}
	halves := 2
	if tp.mla {
		halves = 1
	}
	for kv := range halves {
		for l := from; l < to; l++ {
			b, err := ag.Alloc(tp.slots * r.item)
			if err != nil {
				t.Fatal(err)
			}
			r.kv = append(r.kv, b)
			r.layer = append(r.layer, l)
			r.kvHalf = append(r.kvHalf, kv)
			r.geo.KV.Ptrs = append(r.geo.KV.Ptrs, uint64(nixl.DescOf(b, 0).Addr))
			r.geo.KV.ItemLens = append(r.geo.KV.ItemLens, uint64(r.item))
			if tp.layerIDs {
				r.geo.KVLayerIDs = append(r.geo.KVLayerIDs, l)
			}
		}
	}
	r.geo.Aux = sglang.Buffers{NumSlots: 8, Kind: nixl.DRAM}
	for _, it := range auxItems {
		b, err := ag.Alloc(8 * int(it))
		if err != nil {
			t.Fatal(err)
		}
		r.aux = append(r.aux, b)
		r.geo.Aux.Ptrs = append(r.geo.Aux.Ptrs, uint64(nixl.DescOf(b, 0).Addr))
		r.geo.Aux.ItemLens = append(r.geo.Aux.ItemLens, it)
	}
	sets := []*sglang.Buffers{&r.geo.Aux}
	if decode && tp.mixedDst {
		// K buffers VRAM, V buffers DRAM: registered as two sets.
		n := len(r.geo.KV.Ptrs) / 2
		k := sglang.Buffers{Ptrs: r.geo.KV.Ptrs[:n], ItemLens: r.geo.KV.ItemLens[:n], NumSlots: tp.slots, Kind: nixl.VRAM}
		v := sglang.Buffers{Ptrs: r.geo.KV.Ptrs[n:], ItemLens: r.geo.KV.ItemLens[n:], NumSlots: tp.slots, Kind: nixl.DRAM}
		sets = append(sets, &k, &v)
	} else {
		sets = append(sets, &r.geo.KV)
	}
	if _, err := sglang.RegisterBuffers(ag, sets...); err != nil {
		t.Fatal(err)
	}
	return r
}

// fill writes the room's logical pattern into the prefill slots src.
func (r *rank) fill(room uint64, src []int32, page, bph int) {
	for b, buf := range r.kv {
		for j, slot := range src {
			for tok := range page {
				for hh, g := range r.heads {
					for x := range bph {
						buf[int(slot)*r.item+(tok*len(r.heads)+hh)*bph+x] = logical(room, r.layer[b], r.kvHalf[b], j, tok, g, x)
					}
				}
			}
		}
	}
}

// check verifies every byte of the decode pages dst.
func (r *rank) check(t *testing.T, room uint64, dst []int32, page, bph int) {
	t.Helper()
	for b, buf := range r.kv {
		for j, slot := range dst {
			for tok := range page {
				for hh, g := range r.heads {
					for x := range bph {
						got := buf[int(slot)*r.item+(tok*len(r.heads)+hh)*bph+x]
						if want := logical(room, r.layer[b], r.kvHalf[b], j, tok, g, x); got != want {
							t.Fatalf("%s: layer %d %s page %d token %d head %d byte %d = %d, want %d",
								r.ag.Name(), r.layer[b], [2]string{"K", "V"}[r.kvHalf[b]], j, tok, g, x, got, want)
						}
					}
				}
			}
		}
	}
}

func (r *rank) peer(tp *topo, mixed bool) sglang.PeerGeometry {
	g := r.geo.AsPeer(r.ag.Name())
	g.Rules = tp.rules
	if mixed {
		n := len(g.KVKinds) / 2
		for i := n; i < len(g.KVKinds); i++ {
			g.KVKinds[i] = nixl.DRAM
		}
	}
	return g
}

// mapping is SGLang's _resolve_rank_mapping for decode TP rank d and PP rank q.
func (tp *topo) mapping(d, q int) (targets [][2]int, dummy map[[2]int]bool, requiredDst, responses int) {
	dummy = map[[2]int]bool{}
	var tps []int
	requiredDst, responses = 1, 1
	switch {
	case tp.dtp == tp.ptp:
		tps = []int{d}
	case tp.dtp > tp.ptp:
		tps = []int{d / (tp.dtp / tp.ptp)}
		requiredDst = tp.dtp / tp.ptp
	default:
		ratio := tp.ptp / tp.dtp
		for k := range ratio {
			tps = append(tps, d*ratio+k)
		}
		if !tp.mla {
			responses = ratio
		}
	}
	pps := []int{q}
	if tp.dpp != tp.ppp {
		pps = nil
		for s := range tp.ppp {
			pps = append(pps, s)
		}
		responses *= tp.ppp
	}
	for _, s := range pps {
		for i, r := range tps {
			targets = append(targets, [2]int{r, s})
			if tp.mla && tp.dtp < tp.ptp && i > 0 {
				dummy[[2]int{r, s}] = true
			}
		}
	}
	return targets, dummy, requiredDst, responses
}

func (tp *topo) run(t *testing.T) {
	if tp.slots == 0 {
		tp.slots = 16
	}
	prefill := map[[2]int]*rank{}
	for s := range tp.ppp {
		for r := range tp.ptp {
			prefill[[2]int{r, s}] = tp.newRank(t, "pre", tp.ptp, r, tp.ppp, s, false)
		}
	}
	const room = uint64(0x5eed)
	src := []int32{3, 7, 8, 1, 12}
	dst := []int32{9, 2, 3, 15, 0}
	chunks := []int{3, 2}
	for _, p := range prefill {
		p.fill(room, src, tp.page, tp.bph)
		for i, buf := range p.aux {
			it := int(auxItems[i])
			row := buf[5*it : 6*it]
			for k := range row {
				row[k] = byte(room%251) + byte(i) + byte(k)
			}
		}
		binary.LittleEndian.PutUint64(p.aux[len(p.aux)-1][5*sglang.AuxRoomItemLen:], room)
	}
	for q := range tp.dpp {
		for d := range tp.dtp {
			dec := tp.newRank(t, "dec", tp.dtp, d, tp.dpp, q, true)
			targets, dummy, _, responses := tp.mapping(d, q)
			ck := sglang.NewChecker()
			ck.Expect(room, responses, false)
			for _, key := range targets {
				if dummy[key] {
					continue // an empty transfer info: that prefill rank sends nothing
				}
				pre := prefill[key]
				peer, err := sglang.NewPeer(&pre.geo, dec.peer(tp, tp.mixedDst))
				if err != nil {
					t.Fatalf("prefill tp%d pp%d → decode tp%d pp%d: %v", key[0], key[1], d, q, err)
				}
				if tp.wantParts > 0 && peer.Parts() != tp.wantParts {
					t.Fatalf("%d KV parts, want %d", peer.Parts(), tp.wantParts)
				}
				if _, err := pre.ag.LoadPeer(mustMeta(t, dec.ag)); err != nil {
					t.Fatal(err)
				}
				local, err := sglang.PrepLocalKV(pre.ag, &pre.geo)
				if err != nil {
					t.Fatal(err)
				}
				lists, err := sglang.PrepPeerKV(pre.ag, &pre.geo, peer)
				if err != nil {
					t.Fatal(err)
				}
				pool := &xferPool{t: t, ag: pre.ag, local: local}
				off := 0
				for c, n := range chunks {
					last := c == len(chunks)-1
					var plan sglang.Plan
					ch := sglang.Chunk{Room: room, ChunkID: c, IsLast: last, SrcPages: src[off : off+n], DstPages: dst[off : off+n], SrcAux: 5, DstAux: 6}
					if err := pre.geo.Plan(&plan, peer, &ch); err != nil {
						t.Fatal(err)
					}
					if tp.wantParts > 1 {
						// One KV request per run of memory kinds, each with
						// "_part_i_n" (SGLang's send_kvcache_mixed).
						for i := range tp.wantParts {
							want := fmt.Sprintf("%d_kv_%d_%d_%d_part_%d_%d", room, c, map[bool]int{false: 0, true: 1}[last], pre.geo.Sender, i, tp.wantParts)
							if r := plan.Reqs[i]; r.Kind != sglang.ReqKV || string(r.Notif) != want {
								t.Fatalf("request %d: %v %q, want KV %q", i, r.Kind, r.Notif, want)
							}
						}
					}
					pool.submit(&plan, peer, lists)
					pool.drain()
					off += n
				}
			}
			waitDone(t, dec.ag, ck, []uint64{room})
			dec.check(t, room, dst, tp.page, tp.bph)
			if err := sglang.CheckAuxRoom(dec.aux[len(dec.aux)-1], sglang.AuxRoomItemLen, 6, room); err != nil {
				t.Fatal(err)
			}
			// Pages decode did not hand out stay untouched.
			for b, buf := range dec.kv {
				for _, x := range buf[4*dec.item : 5*dec.item] {
					if x != 0 {
						t.Fatalf("decode buffer %d: page 4 was written", b)
					}
				}
			}
		}
	}
}

func mustMeta(t *testing.T, a nixl.Agent) []byte {
	t.Helper()
	md, err := a.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	return md
}

// TestTopologyBytes: every byte, per head slice and per layer, for the
// topologies SGLang runs.
func TestTopologyBytes(t *testing.T) {
	for _, tp := range []topo{
		{name: "MHA TP1→TP1", heads: 4, ptp: 1, dtp: 1, ppp: 1, dpp: 1, layers: 2, page: 1, bph: 8},
		{name: "MHA TP1→TP2", heads: 4, ptp: 1, dtp: 2, ppp: 1, dpp: 1, layers: 2, page: 1, bph: 8},
		{name: "MHA TP2→TP1", heads: 4, ptp: 2, dtp: 1, ppp: 1, dpp: 1, layers: 2, page: 1, bph: 8},
		{name: "MHA TP2→TP4 page 4", heads: 8, ptp: 2, dtp: 4, ppp: 1, dpp: 1, layers: 2, page: 4, bph: 4},
		{name: "MHA TP4→TP2 page 2", heads: 8, ptp: 4, dtp: 2, ppp: 1, dpp: 1, layers: 3, page: 2, bph: 4},
		{name: "MHA GQA 2 heads TP1→TP4", heads: 2, ptp: 1, dtp: 4, ppp: 1, dpp: 1, layers: 2, page: 2, bph: 8},
		{name: "MHA GQA 2 heads TP4→TP1", heads: 2, ptp: 4, dtp: 1, ppp: 1, dpp: 1, layers: 2, page: 2, bph: 8},
		{name: "MHA GQA 2 heads TP4→TP2", heads: 2, ptp: 4, dtp: 2, ppp: 1, dpp: 1, layers: 2, page: 1, bph: 8},
		{name: "MLA TP1→TP2", mla: true, ptp: 1, dtp: 2, ppp: 1, dpp: 1, layers: 3, page: 2, bph: 16, dram: true},
		{name: "MLA TP2→TP1 (dummy rank)", mla: true, ptp: 2, dtp: 1, ppp: 1, dpp: 1, layers: 3, page: 2, bph: 16, dram: true},
		{name: "MLA TP4→TP2 (dummy ranks)", mla: true, ptp: 4, dtp: 2, ppp: 1, dpp: 1, layers: 2, page: 1, bph: 16, dram: true},
		{name: "MHA PP2→PP1 layer ids", heads: 2, ptp: 1, dtp: 1, ppp: 2, dpp: 1, layers: 4, page: 1, bph: 8, layerIDs: true},
		{name: "MHA PP2→PP2", heads: 2, ptp: 1, dtp: 1, ppp: 2, dpp: 2, layers: 4, page: 1, bph: 8, dram: true},
		{name: "MLA PP2→PP1 0.5.23 span", mla: true, ptp: 1, dtp: 1, ppp: 2, dpp: 1, layers: 4, page: 1, bph: 16, rules: sglang.Rules0523},
		{name: "MLA TP2 PP2→TP1 PP1 layer ids", mla: true, ptp: 2, dtp: 1, ppp: 2, dpp: 1, layers: 4, page: 1, bph: 16, layerIDs: true},
		{name: "MLA PP2→PP2 DRAM", mla: true, ptp: 1, dtp: 1, ppp: 2, dpp: 2, layers: 4, page: 1, bph: 16, dram: true},
		{name: "MHA TP2 PP2→TP1 PP1 (slices)", heads: 4, ptp: 2, dtp: 1, ppp: 2, dpp: 1, layers: 4, page: 2, bph: 4},
		{name: "MHA TP1→TP1 mixed VRAM/DRAM", heads: 2, ptp: 1, dtp: 1, ppp: 1, dpp: 1, layers: 2, page: 1, bph: 8, mixedDst: true, wantParts: 2},
	} {
		t.Run(tp.name, func(t *testing.T) { tp.run(t) })
	}
}

// TestTopologyRefusals: what SGLang's prefill refuses at registration, with
// SGLang's reason.
func TestTopologyRefusals(t *testing.T) {
	for _, c := range []struct {
		tp   topo
		d    int
		want string
	}{
		{topo{heads: 4, ptp: 1, dtp: 2, ppp: 1, dpp: 1, layers: 2, page: 1, bph: 8, dram: true}, 0,
			"NIXL heterogeneous-TP direct-to-host KV transfer is not implemented safely yet"},
		{topo{heads: 4, ptp: 2, dtp: 1, ppp: 1, dpp: 1, layers: 2, page: 1, bph: 8, mixedDst: true}, 0,
			"NIXL destination mixed KV memory kinds are not implemented safely yet: ['DRAM', 'VRAM']"},
		{topo{heads: 2, ptp: 1, dtp: 1, ppp: 2, dpp: 1, layers: 4, page: 1, bph: 8}, 0,
			"PP-heterogeneous transfer requires layer ids on both peers; got src=4 dst=8 entries"},
		{topo{mla: true, ptp: 1, dtp: 1, ppp: 2, dpp: 1, layers: 4, page: 1, bph: 8, rules: sglang.Rules0518}, 0,
			"PP-heterogeneous transfer requires layer ids on both peers; got src=2 dst=4 entries"},
		// A whole-model decode in host memory looks like decode-only speculative
		// decoding (more decode regions than prefill) into DRAM: refused.
		{topo{heads: 2, ptp: 1, dtp: 1, ppp: 2, dpp: 1, layers: 4, page: 1, bph: 8, dram: true, layerIDs: true}, 0,
			"NIXL PD transfer does not support HiSparse combined with decode-only speculative decoding."},
	} {
		tp := c.tp
		tp.slots = 8
		pre := tp.newRank(t, "pre", tp.ptp, 0, tp.ppp, 0, false)
		dec := tp.newRank(t, "dec", tp.dtp, c.d, tp.dpp, 0, true)
		_, err := sglang.NewPeer(&pre.geo, dec.peer(&tp, tp.mixedDst))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ptp %d dtp %d pp %d→%d: %v, want %q", tp.ptp, tp.dtp, tp.ppp, tp.dpp, err, c.want)
		}
	}
	// One side with layer ids under PP: SGLang refuses rather than guess.
	tp := topo{heads: 2, ptp: 1, dtp: 1, ppp: 2, dpp: 1, layers: 4, page: 1, bph: 8, slots: 8, layerIDs: true}
	pre := tp.newRank(t, "pre", 1, 0, 2, 1, false)
	dec := tp.newRank(t, "dec", 1, 0, 1, 0, true)
	g := dec.peer(&tp, false)
	g.KVLayerIDs = nil
	if _, err := sglang.NewPeer(&pre.geo, g); err == nil || !strings.Contains(err.Error(), "Layer metadata must be provided by both PD peers or neither") {
		t.Errorf("one-sided layer ids: %v", err)
	}
	g = dec.peer(&tp, false)
	g.KVLayerIDs = g.KVLayerIDs[:4]
	g.KVLayerIDs = append(g.KVLayerIDs, 0, 1, 9, 9)
	if _, err := sglang.NewPeer(&pre.geo, g); err == nil || !strings.Contains(err.Error(), "Decode peer is missing a transfer entry for model layer 2") {
		t.Errorf("missing layer: %v", err)
	}
}

// TestHeadSliceParams: SGLang's compute_head_slice_params for a few shapes.
func TestHeadSliceParams(t *testing.T) {
	for _, c := range []struct {
		h, ptp, prank, dtp, drank int
		want                      sglang.HeadSlice
	}{
		{8, 2, 1, 4, 3, sglang.HeadSlice{HeadsToSend: 2, SrcHeadStart: 2, BytesPerHead: 4}},
		{8, 4, 3, 2, 1, sglang.HeadSlice{HeadsToSend: 2, DstHeadStart: 2, BytesPerHead: 4}},
		{2, 4, 3, 1, 0, sglang.HeadSlice{HeadsToSend: 1, DstHeadStart: 1, BytesPerHead: 4}},
		{2, 1, 0, 4, 3, sglang.HeadSlice{HeadsToSend: 1, SrcHeadStart: 1, BytesPerHead: 4}},
	} {
		tp := topo{heads: c.h, ptp: c.ptp, dtp: c.dtp, ppp: 1, dpp: 1, layers: 1, page: 1, bph: 4, slots: 4}
		pre := tp.newRank(t, "pre", c.ptp, c.prank, 1, 0, false)
		dec := tp.newRank(t, "dec", c.dtp, c.drank, 1, 0, true)
		p, err := sglang.NewPeer(&pre.geo, dec.peer(&tp, false))
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := p.Slice(); !ok || got != c.want {
			t.Errorf("H=%d prefill %d/%d decode %d/%d: %+v, want %+v", c.h, c.prank, c.ptp, c.drank, c.dtp, got, c.want)
		}
	}
}

// TestTopologyRefusesWhatKvxferdLacks: decode context parallelism is refused
// at registration; state into a decode of another TP size, or into another PP
// layout, fails the room's last chunk instead of writing whole slots.
func TestTopologyRefusesWhatKvxferdLacks(t *testing.T) {
	tp := topo{heads: 4, ptp: 1, dtp: 1, ppp: 1, dpp: 1, layers: 1, page: 1, bph: 8, slots: 8}
	pre := tp.newRank(t, "pre", 1, 0, 1, 0, false)
	dec := tp.newRank(t, "dec", 1, 0, 1, 0, true)
	g := dec.peer(&tp, false)
	g.DCPSize = 2
	if _, err := sglang.NewPeer(&pre.geo, g); err == nil || !strings.Contains(err.Error(), "dcp_size 2") {
		t.Errorf("dcp: %v", err)
	}

	stateItem := uint64(64)
	state := func(l *sglang.Local, bufs int) {
		l.State = []sglang.Buffers{{NumSlots: 4, Kind: nixl.VRAM}}
		for i := range bufs {
			l.State[0].Ptrs = append(l.State[0].Ptrs, uint64(0x7000000+i*0x1000))
			l.State[0].ItemLens = append(l.State[0].ItemLens, stateItem)
		}
	}
	last := sglang.Chunk{Room: 9, IsLast: true, SrcPages: []int32{1}, DstPages: []int32{2}, SrcAux: 1, DstAux: 1,
		SrcState: [][]int32{{0}}, DstState: [][]int32{{1}}}
	for _, c := range []struct {
		name            string
		tp              topo
		preBufs, dstBuf int
		dstItem         uint64 // decode's state slot size (0: the prefill's)
		want            string // "": planned, state included
	}{
		{"MLA across TP sizes, replicated state", topo{mla: true, ptp: 2, dtp: 1, ppp: 1, dpp: 1, layers: 1, page: 1, bph: 8, slots: 8}, 2, 2, 0, ""},
		{"MLA across TP sizes, sharded state", topo{mla: true, ptp: 2, dtp: 1, ppp: 1, dpp: 1, layers: 1, page: 1, bph: 8, slots: 8}, 2, 2, 128,
			"slots differ in size across TP sizes"},
		{"hetero TP", topo{heads: 4, ptp: 1, dtp: 2, ppp: 1, dpp: 1, layers: 1, page: 1, bph: 8, slots: 8}, 2, 2, 0, "heterogeneous-TP state transfer"},
		{"PP stage into a whole-model decode", topo{heads: 2, ptp: 1, dtp: 1, ppp: 2, dpp: 1, layers: 2, page: 1, bph: 8, slots: 8, layerIDs: true}, 1, 2, 0,
			"PP-heterogeneous transfer requires layer ids on both peers; got src=1 dst=2 entries"},
	} {
		pre := c.tp.newRank(t, "pre", c.tp.ptp, 0, c.tp.ppp, 0, false)
		dec := c.tp.newRank(t, "dec", c.tp.dtp, 0, c.tp.dpp, 0, true)
		stateItem = 64
		state(&pre.geo, c.preBufs)
		if c.dstItem != 0 {
			stateItem = c.dstItem
		}
		state(&dec.geo, c.dstBuf)
		g := dec.peer(&c.tp, false)
		p, err := sglang.NewPeer(&pre.geo, g)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var plan sglang.Plan
		err = pre.geo.Plan(&plan, p, &last)
		if c.want == "" {
			if err != nil || len(plan.Reqs) != 3 || plan.Reqs[1].Kind != sglang.ReqState {
				t.Errorf("%s: %v, %d requests; want KV, state and aux", c.name, err, len(plan.Reqs))
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || len(plan.Reqs) != 0 {
			t.Errorf("%s: %v (%d requests), want %q and nothing planned", c.name, err, len(plan.Reqs), c.want)
		}
	}
}

// BenchmarkPlanHeadSlices: planning one chunk of 64 pages × 16 tokens over 64
// layer buffers (32 layers, K and V) for a decode of twice the TP size: one
// descriptor per layer buffer, page and token (65,536 per chunk), reusing the
// plan's slices.
func BenchmarkPlanHeadSlices(b *testing.B) {
	l := &sglang.Local{TPSize: 2, TPRank: 1, TotalKVHeads: 8, PageSize: 16, KV: sglang.Buffers{NumSlots: 4096, Kind: nixl.VRAM}}
	for i := range 64 {
		l.KV.Ptrs = append(l.KV.Ptrs, uint64(i+1)<<36)
		l.KV.ItemLens = append(l.KV.ItemLens, 16*4*128) // 4 heads × 128 B per token
	}
	g := sglang.PeerGeometry{Agent: "d", TPSize: 4, TPRank: 3, DstKVItemLen: 16 * 2 * 128, DstNumSlots: 4096}
	for i := range 64 {
		g.KVPtrs = append(g.KVPtrs, uint64(i+100)<<36)
	}
	p, err := sglang.NewPeer(l, g)
	if err != nil {
		b.Fatal(err)
	}
	src, dst := make([]int32, 64), make([]int32, 64)
	for i := range src {
		src[i], dst[i] = int32(7*i), int32(4095-i)
	}
	c := sglang.Chunk{Room: 1, SrcPages: src, DstPages: dst}
	var plan sglang.Plan
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Plan(&plan, p, &c); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(plan.Reqs[0].Src)), "descs/op")
}
