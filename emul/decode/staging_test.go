package decode

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// The staging path end to end, decode rank by decode rank: prefill ranks
// (kvmem pools holding their own heads, planned by nixl/sglang's PlanStaged)
// write staged chunks over loopback NIXL into the emulator decode's staging
// ring; every message crosses the wire codecs (STAGING_REQ, STAGING_RSP,
// WATERMARK, and per release the "stg" notification or CHUNK_READY); decode
// checks every byte of each region against the logical pattern from its own
// view of writers and heads, frees it and reports the watermark. The ring
// holds two grid slots, so the third chunk wraps into round 1 and may only be
// written once decode freed the first region.

type stagingCase struct {
	name              string
	heads, ptp, dtp   int
	drank             int
	layers, page, hb  int
	pages, gridTokens int
	chunkReady        bool // 0.5.23: CHUNK_READY instead of the stg notification
}

func TestEmulatorStaging(t *testing.T) {
	for _, c := range []stagingCase{
		{name: "ptp2-dtp1-0.5.18", heads: 4, ptp: 2, dtp: 1, layers: 2, page: 2, hb: 4, pages: 5, gridTokens: 4},
		{name: "ptp2-dtp1-0.5.23", heads: 4, ptp: 2, dtp: 1, layers: 2, page: 2, hb: 4, pages: 5, gridTokens: 4, chunkReady: true},
		{name: "ptp1-dtp2-rank1-0.5.18", heads: 4, ptp: 1, dtp: 2, drank: 1, layers: 2, page: 2, hb: 4, pages: 5, gridTokens: 4},
		{name: "ptp1-dtp2-rank1-0.5.23", heads: 4, ptp: 1, dtp: 2, drank: 1, layers: 2, page: 2, hb: 4, pages: 5, gridTokens: 4, chunkReady: true},
		{name: "ptp4-dtp2-rank1-page1", heads: 8, ptp: 4, dtp: 2, drank: 1, layers: 3, page: 1, hb: 8, pages: 7, gridTokens: 3},
		{name: "ptp2-dtp4-rank2-gqa", heads: 2, ptp: 2, dtp: 4, drank: 2, layers: 1, page: 4, hb: 2, pages: 3, gridTokens: 8},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

func stgOwned(h, t, r int) []int { return ownedHeads(h, t, r) }

func (c stagingCase) topo(heads []int) kvmem.Shape {
	sh := kvmem.DefaultShape()
	tp := &kvmem.Topo{Heads: heads, HeadBytes: c.hb, PageTokens: c.page, VRAM: true}
	sh.Layers, sh.Slots, sh.AuxSlots, sh.Topo = c.layers, 32, 16, tp
	sh.Item = tp.ItemLen()
	return sh
}

func (c stagingCase) run(t *testing.T) {
	const room = 4242
	layers := make([]int, c.layers)
	for i := range layers {
		layers[i] = i
	}
	view := NewStagingView(c.heads, c.ptp, c.dtp, c.drank, layers, c.page, c.hb)
	grid := sglang.StagingGridPages(c.gridTokens, c.page)
	nChunks := (c.pages + grid - 1) / grid
	dec, err := kvmem.New(fmt.Sprintf("stg-dec-%s", c.name), c.topo(stgOwned(c.heads, c.dtp, c.drank)), 0, loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dec.Close() })
	ringSize := 2 * view.ChunkBytes(grid)
	ring := NewStagingRing(ringSize)
	ring.EmptyNewRound = c.chunkReady // 0.5.23's allocator
	stg, err := dec.NIXL.Alloc(int(ringSize))
	if err != nil {
		t.Fatal(err)
	}
	stgBase := uint64(nixl.DescOf(stg, 0).Addr)
	if _, err := sglang.RegisterBuffers(dec.NIXL, &sglang.Buffers{Ptrs: []uint64{stgBase}, ItemLens: []uint64{uint64(ringSize)},
		NumSlots: 1, Kind: nixl.VRAM, DevID: dec.Geo.KV.DevID}); err != nil {
		t.Fatal(err)
	}
	for i := range stg {
		stg[i] = 0xee // poison: an unwritten byte never matches by chance
	}
	md, err := dec.Agent.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	g := dec.Peer()
	g.TPSize, g.TPRank, g.GPU = c.dtp, c.drank, dec.Geo.KV.DevID
	g.StagingBase, g.StagingSize, g.NoNotifs = stgBase, ringSize, c.chunkReady

	// The prefill ranks that write this decode rank, in writer order.
	var ranks []int
	if c.ptp > c.dtp {
		for w := range c.ptp / c.dtp {
			ranks = append(ranks, c.drank*(c.ptp/c.dtp)+w)
		}
	} else {
		ranks = []int{c.drank / (c.dtp / c.ptp)}
	}
	type prefill struct {
		node  *kvmem.Node
		peer  *sglang.Peer
		slots []int32
		wm    [2]int64
	}
	var pres []*prefill
	for _, pr := range ranks {
		n, err := kvmem.New(fmt.Sprintf("stg-pre-%s-%d", c.name, pr), c.topo(stgOwned(c.heads, c.ptp, pr)), pr, loopback.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		n.Geo.TPSize, n.Geo.TPRank, n.Geo.TotalKVHeads, n.Geo.PageSize = c.ptp, pr, c.heads, c.page
		if _, err := n.Agent.LoadPeer(md); err != nil {
			t.Fatal(err)
		}
		p, err := sglang.NewPeer(&n.Geo, g)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, ok := p.Staging(); !ok {
			t.Fatal("peer takes no staged writes")
		}
		f := &prefill{node: n, peer: p}
		for j := range c.pages {
			s := int32(3 + 2*j + pr) // each rank's own, scattered page numbers
			f.slots = append(f.slots, s)
			n.FillPageAt(room, int(s), j)
		}
		pres = append(pres, f)
	}

	// STAGING_REQ fan-out (prefetch_staging_reqs): every writer asks for every
	// grid slot; decode allocates once per slot and answers each.
	rsps := map[int]*wire.StagingRsp{}
	for _, f := range pres {
		for idx := range nChunks {
			req := &wire.StagingReq{Room: room, ChunkIdx: idx, ChunkPages: min(grid, c.pages-idx*grid), SessionID: dec.NIXL.Name()}
			m, err := wire.DecodeOutbound(req.Encode())
			if err != nil {
				t.Fatal(err)
			}
			rsp := ring.HandleReq(&view, m.(*wire.StagingReq))
			in, err := wire.DecodeInbound(rsp.Encode())
			if err != nil {
				t.Fatal(err)
			}
			got := in.(*wire.StagingRsp)
			if prev, ok := rsps[idx]; ok && *prev != *got {
				t.Fatalf("chunk %d allocated twice: %+v then %+v", idx, prev, got)
			}
			rsps[idx] = got
			_ = f
		}
	}
	if nChunks > 2 {
		if rsps[2].Round != 1 || rsps[2].Offset != 0 {
			t.Fatalf("the third chunk did not wrap: %+v", rsps[2])
		}
		// Before decode freed anything, the wrapped region is not writable.
		if wire.WatermarkReady(rsps[2].Round, rsps[2].End, 0, 0) {
			t.Fatal("a wrapped region was writable before the first was freed")
		}
	}

	var plan sglang.Plan
	var notifs []nixl.Notif
	for idx := range nChunks {
		rsp := rsps[idx]
		start, n := idx*grid, min(grid, c.pages-idx*grid)
		arrived := map[int]bool{}
		for _, f := range pres {
			if !wire.WatermarkReady(rsp.Round, rsp.End, f.wm[0], f.wm[1]) {
				if idx < 2 {
					t.Fatalf("chunk %d (round %d) not ready", idx, rsp.Round)
				}
				t.Fatalf("chunk %d: the watermark %v should have been advanced by the release of chunk %d", idx, f.wm, idx-2)
			}
			sc := &sglang.StagedChunk{Room: room, ChunkID: idx, IsLast: idx == nChunks-1,
				SrcPages: f.slots[start : start+n], PageStart: start, ChunkIdx: idx, Offset: rsp.Offset}
			if err := f.node.Geo.PlanStaged(&plan, f.peer, sc); err != nil {
				t.Fatal(err)
			}
			postAndWait(t, f.node.NIXL, f.peer.Agent, &plan)
			if c.chunkReady {
				if len(plan.Reqs[0].Notif) != 0 {
					t.Fatal("a 0.5.23 decode got a notification")
				}
				cr := &wire.ChunkReady{Room: room, ChunkIdx: idx, PageStart: start, NumPages: n, WriterID: dec.NIXL.Name(), PrefillRank: f.node.Geo.TPRank}
				m, err := wire.DecodeOutbound(cr.Encode())
				if err != nil {
					t.Fatal(err)
				}
				got := m.(*wire.ChunkReady)
				if got.Room != room || got.ChunkIdx != idx || got.PageStart != start || got.NumPages != n {
					t.Fatalf("CHUNK_READY %+v", got)
				}
				arrived[got.PrefillRank] = true
			}
		}
		if !c.chunkReady {
			notifs = waitNotifs(t, dec.NIXL, notifs[:0], len(pres))
			for _, nf := range notifs {
				sn, err := wire.ParseStgNotif(nf.Msg)
				if err != nil {
					t.Fatal(err)
				}
				if sn.Room != room || sn.ChunkIdx != idx || sn.ChunkID != idx || sn.PageStart != start || sn.NumPages != n ||
					sn.IsLast != (idx == nChunks-1) || sn.Agent != dec.NIXL.Name() {
					t.Fatalf("stg notification %q for chunk %d", nf.Msg, idx)
				}
				arrived[sn.Sender] = true
			}
		}
		if len(arrived) != len(pres) {
			t.Fatalf("chunk %d signalled by %d writers, want %d", idx, len(arrived), len(pres))
		}
		off, end, _, ok := ring.Region(room, idx)
		if !ok {
			t.Fatalf("chunk %d has no region", idx)
		}
		if bad := view.WrongStagedBytes(stg[off:end], room, start, n); bad != 0 {
			t.Fatalf("chunk %d: %d of %d staged bytes wrong", idx, bad, end-off)
		}
		wm, err := ring.Release(room, idx, dec.NIXL.Name())
		if err != nil {
			t.Fatal(err)
		}
		in, err := wire.DecodeInbound(wm.Encode())
		if err != nil {
			t.Fatal(err)
		}
		w := in.(*wire.Watermark)
		for _, f := range pres {
			if wire.WatermarkAfter(w.Round, w.Tail, f.wm[0], f.wm[1]) {
				f.wm = [2]int64{w.Round, w.Tail}
			}
		}
	}
	// Decode's KV pages were not touched: staging writes only the ring.
	for s := range int32(32) {
		if !dec.PagesZero([]int32{s}) {
			t.Fatalf("decode page %d written", s)
		}
	}
	// The check can fail: one byte off, or another room's bytes, are seen.
	// (The last chunk's region: an earlier one may since hold a wrapped chunk.)
	last := nChunks - 1
	off, end := rsps[last].Offset, rsps[last].End
	start, n := last*grid, c.pages-last*grid
	if bad := view.WrongStagedBytes(stg[off:end], room, start, n); bad != 0 {
		t.Fatalf("last region: %d wrong", bad)
	}
	stg[off+3] ^= 1
	if bad := view.WrongStagedBytes(stg[off:end], room, start, n); bad != 1 {
		t.Fatalf("a flipped byte counted %d", bad)
	}
	if bad := view.WrongStagedBytes(stg[off:end], room+1, start, n); bad == 0 {
		t.Fatal("another room's pattern matched")
	}
}

func postAndWait(t *testing.T, a nixl.Agent, peer string, plan *sglang.Plan) {
	t.Helper()
	for i := range plan.Reqs {
		x, err := sglang.MakeReq(a, 0, 0, peer, &plan.Reqs[i])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Post(x); err != nil {
			t.Fatal(err)
		}
		st := []nixl.Status{{}}
		deadline := time.Now().Add(20 * time.Second)
		for {
			if err := a.Poll([]nixl.XferID{x}, st); err != nil {
				t.Fatal(err)
			}
			if st[0].State == nixl.Failed {
				t.Fatalf("staged write failed: %v", st[0].Err)
			}
			if st[0].State != nixl.InProgress {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("staged write still in flight")
			}
			runtime.Gosched()
		}
		if err := a.Release(x); err != nil {
			t.Fatal(err)
		}
	}
}

func waitNotifs(t *testing.T, a nixl.Agent, buf []nixl.Notif, n int) []nixl.Notif {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(buf) < n {
		var err error
		if buf, err = a.Notifs(buf); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d notifications", len(buf), n)
		}
		runtime.Gosched()
	}
	return buf
}
