package decode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/daemon"
	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// The topologies SGLang's decode cannot run on a CPU-only machine (a
// heterogeneous-TP MHA or whole-model decode needs VRAM destinations, which
// UCX cannot register without CUDA, and SGLang's prefill refuses DRAM ones),
// played by the decode emulator against real kvxferd processes (one per
// prefill rank, loopback NIXL, VRAM-labelled decode memory). Each decode rank
// checks every byte it holds against kvmem's logical pattern of (model layer,
// K/V, request page, token, global KV head, byte): its expected bytes come
// from its own layers and heads, never from the prefill's geometry.

type emuTopo struct {
	name      string
	mla       bool
	heads     int
	ptp, ppp  int
	pcp       int // prefill attention CP size (0: 1)
	dtp       int
	layers    int
	headBytes int
	page      int
	layerIDs  bool
	release   Release
	state     bool // a hybrid-model state buffer (one slot per room)
	hostV     bool // decode's V buffers in DRAM, K in VRAM (mixed kinds)
	staging   bool // decode announces a staging ring (SGLANG_DISAGG_STAGING_BUFFER=1)
	// prefillStaging runs kvxferd with -staging (grid: 2 pages): it asks
	// decode for a region per grid slot and routes the answers.
	prefillStaging bool
	stagingBytes   int64     // decode's ring (0: 64 KiB)
	wantReason     string    // SGLang's refusal, if the decode must be refused
	wantFail       kv.Reason // the prefill rooms' reason with wantReason (0: peer_rejected)
}

func ownedHeads(h, t, r int) []int {
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

func (c emuTopo) shape(layers, start int, heads []int, vram bool) kvmem.Shape {
	sh := kvmem.DefaultShape()
	t := &kvmem.Topo{MLA: c.mla, StartLayer: start, Heads: heads, HeadBytes: c.headBytes, PageTokens: c.page, VRAM: vram, HostV: vram && c.hostV}
	sh.Layers, sh.Slots, sh.AuxSlots, sh.Topo = layers, 32, 16, t
	sh.Item = t.ItemLen()
	if c.state {
		sh.StateSlots, sh.StateItem, sh.StateBufs = 8, 48, 2
	}
	return sh
}

type emuPrefill struct {
	node *kvmem.Node
	d    *daemon.Daemon
	cli  *control.Client
}

func (c emuTopo) startPrefill(t *testing.T, tp, pp, cp int, bootstrap string) *emuPrefill {
	t.Helper()
	n := c.layers / c.ppp
	heads := ownedHeads(max(c.heads, 1), c.ptp, tp)
	node, err := kvmem.New(fmt.Sprintf("emu-topo-pre-%d", prefillSeq.Add(1)), c.shape(n, pp*n, heads, false),
		sglang.SenderID(pp, c.ptp, tp), loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	dir, err := os.MkdirTemp("", "kvt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := daemon.Config{HostIP: "127.0.0.1", ServeBootstrap: bootstrap == "", ControlEndpoint: "ipc://" + filepath.Join(dir, "c.sock"),
		Rank:     daemon.Rank{TPSize: c.ptp, TPRank: tp, PPSize: c.ppp, PPRank: pp, CPSize: max(c.pcp, 1), CPRank: cp, DPSize: 1},
		MLA:      c.mla,
		NoKV:     sglang.NoKVWithCount,
		PageSize: c.page,
		Topology: daemon.Topology{KVHeadNum: len(heads), TotalKVHeads: c.heads, StartLayer: pp * n},
	}
	if c.prefillStaging {
		cfg.Staging = daemon.StagingConfig{Enabled: true, ChunkedPrefillSize: 2 * c.page}
	}
	if c.layerIDs {
		cfg.Topology.KVLayerIDs = node.LayerIDs()
	}
	if bootstrap != "" {
		cfg.BootstrapURL = "http://" + bootstrap
	}
	d, err := daemon.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	})
	if err := d.Activate(node.Agent, node.Geo); err != nil {
		t.Fatalf("prefill tp%d pp%d cp%d: %v", tp, pp, cp, err)
	}
	cli, err := control.Dial(d.ControlEndpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return &emuPrefill{node: node, d: d, cli: cli}
}

func (c emuTopo) run(t *testing.T) {
	var pre []*emuPrefill
	boot := ""
	for cp := range max(c.pcp, 1) {
		for pp := range c.ppp {
			for tp := range c.ptp {
				p := c.startPrefill(t, tp, pp, cp, boot)
				if boot == "" {
					boot = p.d.BootstrapAddr()
				}
				pre = append(pre, p)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var emus []*Emulator
	for d := range c.dtp {
		cfg := DefaultConfig()
		cfg.Bootstrap, cfg.PageSize, cfg.TPSize, cfg.TPRank, cfg.PPSize, cfg.MLA = boot, c.page, c.dtp, d, 1, c.mla
		cfg.Shape = c.shape(c.layers, 0, ownedHeads(max(c.heads, 1), c.dtp, d), true)
		cfg.Workload.DummyShare, cfg.Release, cfg.WaitingTimeout = 0, c.release, 5*time.Second
		cfg.State = c.state
		if c.staging {
			cfg.StagingBytes = 1 << 16
			if c.stagingBytes > 0 {
				cfg.StagingBytes = c.stagingBytes
			}
		}
		cfg.Name = fmt.Sprintf("emu-topo-dec%d", d)
		e, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		if err := e.Start(ctx); err != nil {
			t.Fatal(err)
		}
		emus = append(emus, e)
	}
	for i := range 3 {
		r := uint64(0xe0000 + 31*i + c.ptp*7 + c.dtp)
		plan := workload.Plan{Index: i, Room: r, Pages: 5, Chunks: []int{3, 2}, Agents: 1}
		cuts := []int{0, 3, 5}
		if c.prefillStaging {
			// SGLang's scheduler sends one chunk per staging-grid slot
			// (compute_grid_segments): 2 pages here.
			plan.Chunks, cuts = []int{2, 2, 1}, []int{0, 2, 4, 5}
		}
		src := []int32{4, 9, 10, 1, 30}
		for _, p := range pre {
			for j, s := range src {
				p.node.FillPageAt(r, int(s), j)
			}
			p.node.WriteAux(7, r)
			if c.state {
				FillState(p.node, r, 5)
			}
			if _, err := p.cli.Open(r, ""); err != nil {
				t.Fatal(err)
			}
			if err := p.cli.Init(r, len(src), 7); err != nil {
				t.Fatal(err)
			}
		}
		results := make([]Result, len(emus))
		var wg sync.WaitGroup
		for k, e := range emus {
			wg.Add(1)
			go func() { defer wg.Done(); results[k] = e.RunRoom(ctx, plan) }()
		}
		for _, p := range pre {
			for k := 1; k < len(cuts); k++ {
				var state [][]int32
				if c.state && k == len(cuts)-1 {
					state = [][]int32{{5}}
				}
				if err := p.cli.Send(r, src[cuts[k-1]:cuts[k]], state); err != nil {
					t.Fatal(err)
				}
			}
		}
		if c.wantReason != "" {
			want := kv.ReasonPeerRejected
			if c.wantFail != kv.ReasonNone {
				want = c.wantFail
			}
			seen := false
			for _, p := range pre {
				rep := pollTerminal(t, p.cli, r)
				seen = seen || rep.Reason == want
				// A failure at transfer time reaches decode, which aborts
				// the room at every prefill rank: one still waiting fails
				// decode_abort instead.
				if rep.Reason != want && (c.wantFail == kv.ReasonNone || rep.Reason != kv.ReasonDecodeAbort) {
					t.Fatalf("prefill room %d: %v %v, want %v", r, rep.Status, rep.Reason, want)
				}
			}
			if !seen {
				t.Fatalf("prefill room %d: no rank failed %v", r, want)
			}
			wg.Wait()
			for k, res := range results {
				if res.Outcome == OutcomeSuccess || !strings.Contains(res.Reason, c.wantReason) {
					t.Fatalf("decode tp%d: %v %q, want a failure with %q", k, res.Outcome, res.Reason, c.wantReason)
				}
				if st := emus[k].Staging(); c.prefillStaging && (st.Oversized == 0 || st.Scattered != 0 || st.Late != 0) {
					t.Fatalf("decode tp%d: %+v, want oversized regions and nothing staged", k, st)
				}
			}
			return
		}
		wg.Wait()
		for k, res := range results {
			if res.Outcome != OutcomeSuccess || res.WrongBytes != 0 || res.AuxError != "" || res.BytesVerified == 0 {
				t.Fatalf("decode tp%d room %d: %v %q, %d wrong of %d bytes, aux %q", k, r, res.Outcome, res.Reason, res.WrongBytes, res.BytesVerified, res.AuxError)
			}
		}
		for _, p := range pre {
			if rep := pollTerminal(t, p.cli, r); rep.Status != kv.StatusSuccess {
				t.Fatalf("prefill room %d: %v %v", r, rep.Status, rep.Reason)
			}
			_ = p.cli.Clear(r)
		}
	}
	if c.prefillStaging {
		c.checkStagingHandshake(t, pre, emus, 3)
		return
	}
	if c.staging {
		// kvxferd's staging is off (SGLang's default): it writes head slices
		// into the pages (checked above) and asks decode for no staging region.
		for k, e := range emus {
			reg, err := e.primary.registration(&e.cfg)
			if err != nil || reg.StagingBasePtr == 0 || reg.StagingTotalSize != 1<<16 {
				t.Fatalf("decode tp%d announced no staging ring: %+v %v", k, reg, err)
			}
			e.mu.Lock()
			n := e.c.pull[wire.TagStagingReq]
			e.mu.Unlock()
			if n != 0 {
				t.Fatalf("decode tp%d got %d STAGING_REQ", k, n)
			}
		}
	}
}

func pollTerminal(t *testing.T, cli *control.Client, r uint64) kv.Reply {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		reps, err := cli.Poll([]uint64{r}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if reps[0].Status.Terminal() {
			return reps[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("prefill room %d: %v after 10 s", r, reps[0].Status)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestEmulatorTopologies: heterogeneous TP (MHA head slices both ways, GQA
// replication, MLA fan-in with dummy ranks) and PP2 → PP1, for a notification
// release (0.5.18) and a KV_STATUS one (0.5.23), every byte by head and layer.
func TestEmulatorTopologies(t *testing.T) {
	cases := []emuTopo{
		{name: "MHA TP1→TP2", heads: 4, ptp: 1, ppp: 1, dtp: 2, layers: 2, headBytes: 8, page: 2},
		{name: "MHA TP2→TP1", heads: 4, ptp: 2, ppp: 1, dtp: 1, layers: 2, headBytes: 8, page: 2},
		{name: "MHA TP4→TP2 GQA 2 heads", heads: 2, ptp: 4, ppp: 1, dtp: 2, layers: 2, headBytes: 16, page: 1},
		{name: "MLA TP2→TP1", mla: true, ptp: 2, ppp: 1, dtp: 1, layers: 3, headBytes: 32, page: 1},
		{name: "MHA PP2→PP1", heads: 2, ptp: 1, ppp: 2, dtp: 1, layers: 4, headBytes: 16, page: 1, layerIDs: true},
		{name: "MHA TP2 PP2→TP1 PP1", heads: 4, ptp: 2, ppp: 2, dtp: 1, layers: 4, headBytes: 8, page: 2, layerIDs: true},
		{name: "MLA PP2→PP1", mla: true, ptp: 1, ppp: 2, dtp: 1, layers: 4, headBytes: 32, page: 1, layerIDs: true},
		{name: "MHA TP1→TP1 + state buffer", heads: 2, ptp: 1, ppp: 1, dtp: 1, layers: 2, headBytes: 16, page: 1, state: true},
		{name: "MLA TP2→TP1 (dummy) + state buffer", mla: true, ptp: 2, ppp: 1, dtp: 1, layers: 2, headBytes: 32, page: 1, state: true},
		{name: "MLA TP1→TP2 + state buffer", mla: true, ptp: 1, ppp: 1, dtp: 2, layers: 2, headBytes: 32, page: 1, state: true},
		// Mixed decode memory (K VRAM, V DRAM): one write per run of equal
		// kinds, "_part_i_n" notifications (0.5.18), one success (0.5.23).
		// A decode with its staging ring on (both directions of heterogeneous
		// TP): kvxferd, staging off, serves it through the head-slice path.
		{name: "MHA TP1→TP2, decode staging on", heads: 4, ptp: 1, ppp: 1, dtp: 2, layers: 2, headBytes: 8, page: 2, staging: true},
		{name: "MHA TP2→TP1, decode staging on", heads: 4, ptp: 2, ppp: 1, dtp: 1, layers: 2, headBytes: 8, page: 2, staging: true},
		{name: "MHA TP1→TP1 mixed VRAM/DRAM", heads: 2, ptp: 1, ppp: 1, dtp: 1, layers: 2, headBytes: 16, page: 1, hostV: true},
		{name: "MHA TP2→TP2 mixed VRAM/DRAM, 3 chunks' worth", heads: 4, ptp: 2, ppp: 1, dtp: 2, layers: 3, headBytes: 8, page: 2, hostV: true},
		{name: "MHA TP2→TP1 mixed kinds (refused)", heads: 4, ptp: 2, ppp: 1, dtp: 1, layers: 2, headBytes: 8, page: 1, hostV: true,
			wantReason: "NIXL destination mixed KV memory kinds are not implemented safely yet: ['DRAM', 'VRAM']"},
		// CP rank 1 is SGLang's dummy CP rank: decode pulls from CP rank 0
		// only; rank 1's rooms must still succeed, writing nothing.
		{name: "MHA CP2 (dummy CP rank) → TP1", heads: 2, ptp: 1, ppp: 1, pcp: 2, dtp: 1, layers: 2, headBytes: 16, page: 1},
		{name: "MHA TP2 CP2 → TP2", heads: 4, ptp: 2, ppp: 1, pcp: 2, dtp: 2, layers: 2, headBytes: 8, page: 1},
		{name: "MHA PP2→PP1 without prefill layer ids (refused)", heads: 2, ptp: 1, ppp: 2, dtp: 1, layers: 4, headBytes: 16, page: 1,
			wantReason: "Layer metadata must be provided by both PD peers or neither"},
	}
	for _, rel := range []Release{Release0518, Release0523} {
		for _, c := range cases {
			c.release = rel
			if c.wantReason != "" && rel == Release0518 {
				continue // reads no failure status: it would only time out
			}
			t.Run(rel.String()+"/"+c.name, c.run)
		}
	}
}

// checkStagingHandshake: with kvxferd -staging (grid 2 pages) each room of 5
// pages went as 3 grid-slot chunks (2, 2, 1 pages). Every prefill rank asked
// every decode rank for the 3 regions; decode answered each; every kvxferd
// held each chunk until its region was known, then wrote it into decode's
// ring (stg notification for 0.5.18, CHUNK_READY for 0.5.23); decode checked
// every byte of every region from its own view, scattered it into the
// room's pages (checked again above), freed it and sent WATERMARKs.
func (c emuTopo) checkStagingHandshake(t *testing.T, pre []*emuPrefill, emus []*Emulator, rooms int) {
	t.Helper()
	const slots = 3
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok := true
		for _, e := range emus {
			s := e.Staging()
			if s.Answered != int64(slots*rooms*len(pre)) || s.Scattered != int64(slots*rooms) || s.Regions != 0 {
				ok = false
			}
		}
		for _, p := range pre {
			if s := p.d.StagingStats(); s.RspRouted != int64(slots*rooms*len(emus)) {
				ok = false
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			for k, e := range emus {
				t.Logf("decode tp%d: %+v", k, e.Staging())
			}
			for k, p := range pre {
				t.Logf("prefill tp%d: %+v", k, p.d.StagingStats())
			}
			t.Fatal("staging incomplete")
		}
		time.Sleep(time.Millisecond)
	}
	for k, e := range emus {
		s := e.Staging()
		e.mu.Lock()
		want := int64(rooms) * (2*e.stg.view.ChunkBytes(2) + e.stg.view.ChunkBytes(1))
		e.mu.Unlock()
		if s.Skipped != 0 || s.Oversized != 0 || s.StagedWrong != 0 || s.StagedBytes != want || s.Late != 0 || s.BadRegion != 0 || s.Watermarks != int64(slots*rooms) {
			t.Fatalf("decode tp%d: %+v (want %d staged bytes)", k, s, want)
		}
		e.mu.Lock()
		round, _ := e.stg.ring.Watermark()
		e.mu.Unlock()
		// The small ring wraps; a large one only on 0.5.23's rule (a ring
		// emptied by a free starts a new round).
		if c.stagingBytes > 0 && round == 0 || c.stagingBytes == 0 && c.release == Release0518 && round != 0 {
			t.Fatalf("decode tp%d: ring at round %d (ring %d bytes)", k, round, c.stagingBytes)
		}
	}
	ready := 0
	if c.release == Release0523 {
		ready = slots * rooms * len(emus)
	}
	for k, p := range pre {
		s := p.d.StagingStats()
		if s.Peers != len(emus) || s.ReqsSent != int64(slots*rooms*len(emus)) || s.ReqsFailed != 0 ||
			s.Staged != int64(slots*rooms*len(emus)) || s.Refused != 0 || s.HeldNow != 0 || s.ChunkReady != int64(ready) {
			t.Fatalf("prefill tp%d: %+v", k, s)
		}
	}
}

// TestEmulatorStagingHandshake: kvxferd -staging against decodes with their
// staging ring on, heterogeneous TP both ways (fan-in: two writers per
// region), both signalling releases: the whole staged path over real
// sockets and loopback NIXL, every staged byte and every page byte checked
// (checkStagingHandshake).
func TestEmulatorStagingHandshake(t *testing.T) {
	for _, rel := range []Release{Release0518, Release0523} {
		for _, c := range []emuTopo{
			{name: "MHA TP2→TP1", heads: 4, ptp: 2, ppp: 1, dtp: 1, layers: 2, headBytes: 8, page: 2, staging: true, prefillStaging: true},
			{name: "MHA TP1→TP2", heads: 4, ptp: 1, ppp: 1, dtp: 2, layers: 2, headBytes: 8, page: 2, staging: true, prefillStaging: true},
			// A ring smaller than one region: decode answers ALLOC_OVERSIZED
			// and kvxferd fails the room (SGLang raises "Chunk staging
			// allocation permanently failed"): no staged chunk arrives; the
			// decode hears it on KV_STATUS (0.5.23; 0.5.18 reads no status).
			{name: "MHA TP2→TP1, ring smaller than a region", heads: 4, ptp: 2, ppp: 1, dtp: 1, layers: 2, headBytes: 8, page: 2,
				staging: true, prefillStaging: true, stagingBytes: 128, wantReason: "invalid_request", wantFail: kv.ReasonInvalidRequest},
			// A ring of two 2-page regions (512 B each): a room's third slot
			// wraps into the next round over its first, and kvxferd must hold
			// it until decode's WATERMARK says the first was freed.
			{name: "MHA TP2→TP1, ring of 2 slots", heads: 4, ptp: 2, ppp: 1, dtp: 1, layers: 2, headBytes: 8, page: 2, staging: true, prefillStaging: true, stagingBytes: 1024},
		} {
			c.release = rel
			if c.wantReason != "" && rel == Release0518 {
				continue // reads no failure status: it would only time out
			}
			t.Run(rel.String()+"/"+c.name, c.run)
		}
	}
}
