package sgltest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/daemon"
	"github.com/kvxfer/kvxfer/internal/testrig/schedmem"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/transport/control"
)

// The topology tests deploy one kvxferd per prefill rank (one hosts the
// bootstrap server, the others register into it) and one SGLang decode
// process per decode rank, each with its own rank identity (attention TP size
// and rank, PP size and rank, MLA or MHA, layer ids) running SGLang's own
// receiver code — rank mapping, dummy ranks, required_dst_info_num, the
// success count, the DP rank lookup — over real NIXL (UCX, DRAM). Every byte
// every decode rank holds afterwards is checked against a pattern of the
// byte's logical coordinates (model layer, K or V, request page, global KV
// head, byte in the head), which each side lays out as SGLang's pools do: the
// expected bytes never go through kvxferd's geometry.

// topoCase is one deployment.
type topoCase struct {
	name     string
	mla      bool
	heads    int // total KV heads (MHA)
	ptp, ppp int // prefill attention TP and PP sizes
	pdp      int // prefill DP (attention) size
	dtp, dpp int // decode
	layers   int // model layers
	bph      int // bytes per head per token (MLA: per token)
	layerIDs bool
	lb       string // prefill -load-balance-method ("": follow_bootstrap_room)
	refuse   string // SGLang's refusal every decode registration gets, if any
	rooms    int
}

const topoSlots, topoAux = 256, 64

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

func topoByte(room uint64, layer, kv, j, g, x int) byte {
	return byte(int(room%89)*5 + layer*31 + kv*17 + j*13 + g*29 + x*3 + 1)
}

// topoBufs is the KV buffer list of a rank holding model layers [from, to):
// K of every layer then V (MHA), one per layer (MLA).
func (c *topoCase) topoBufs(from, to int) (layer, half []int) {
	halves := 2
	if c.mla {
		halves = 1
	}
	for h := range halves {
		for l := from; l < to; l++ {
			layer, half = append(layer, l), append(half, h)
		}
	}
	return layer, half
}

func (c *topoCase) heads1(tp, r int) []int {
	if c.mla {
		return []int{0}
	}
	return ownedHeads(c.heads, tp, r)
}

// prefillRank is one kvxferd and its scheduler.
type prefillRank struct {
	tp, pp, dp  int
	d           *daemon.Daemon
	cli         *control.Client
	kv, aux     []byte
	layer, half []int
	heads       []int
	item        int
}

func (c *topoCase) startPrefill(t *testing.T, tp, pp, dp int, bootstrap string) *prefillRank {
	t.Helper()
	from, to := c.layers*pp/c.ppp, c.layers*(pp+1)/c.ppp
	p := &prefillRank{tp: tp, pp: pp, dp: dp, heads: c.heads1(c.ptp, tp)}
	p.layer, p.half = c.topoBufs(from, to)
	p.item = len(p.heads) * c.bph
	p.d = startDaemon(t, func(cfg *daemon.Config) {
		cfg.Rank = daemon.Rank{TPSize: c.ptp, TPRank: tp, PPSize: c.ppp, PPRank: pp, CPSize: 1, DPSize: c.pdp, DPRank: dp}
		cfg.MLA = c.mla
		cfg.LoadBalanceMethod = c.lb
		cfg.Topology = daemon.Topology{KVHeadNum: len(p.heads), TotalKVHeads: c.heads, StartLayer: from}
		if c.layerIDs {
			cfg.Topology.KVLayerIDs = p.layer
		}
		if bootstrap != "" {
			cfg.ServeBootstrap, cfg.BootstrapURL = false, "http://"+bootstrap
		}
	})
	dir := t.TempDir()
	kvPath, auxPath := filepath.Join(dir, "kv"), filepath.Join(dir, "aux")
	auxLen := 0
	for _, it := range auxItems {
		auxLen += int(it) * topoAux
	}
	for path, n := range map[string]int{kvPath: len(p.layer) * topoSlots * p.item, auxPath: auxLen} {
		if err := os.WriteFile(path, make([]byte, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	view, err := loopback.New(fmt.Sprintf("sgl-topo-view-%d-%d", os.Getpid(), seq.Add(1)), loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { view.Close() })
	if p.kv, err = view.Attach(kvPath); err != nil {
		t.Fatal(err)
	}
	if p.aux, err = view.Attach(auxPath); err != nil {
		t.Fatal(err)
	}
	if p.cli, err = control.Dial(p.d.ControlEndpoint()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cli.Close() })
	kv := &control.MemoryRegistration{Kind: control.KindKV}
	for b := range p.layer {
		kv.Buffers = append(kv.Buffers, control.Region{Shm: kvPath, Offset: uint64(b * topoSlots * p.item), Length: uint64(topoSlots * p.item), ItemLen: uint64(p.item), Mem: nixl.DRAM})
	}
	aux := &control.MemoryRegistration{Kind: control.KindAux}
	off := uint64(0)
	for _, it := range auxItems {
		aux.Buffers = append(aux.Buffers, control.Region{Shm: auxPath, Offset: off, Length: it * topoAux, ItemLen: it, Mem: nixl.DRAM})
		off += it * topoAux
	}
	for _, r := range []*control.MemoryRegistration{kv, aux} {
		if _, err := p.cli.RegisterMemory(r); err != nil {
			t.Fatal(err)
		}
	}
	if !p.d.Live() {
		t.Fatal("kvxferd not live after its memory was registered")
	}
	return p
}

// fill writes room r's pages (request page j in slot src[j]) and aux row, as
// this rank's pool holds them: its layers, its heads.
func (p *prefillRank) fill(r uint64, src []int32, auxSlot, bph int) {
	for b := range p.layer {
		for j, slot := range src {
			page := p.kv[(b*topoSlots+int(slot))*p.item : (b*topoSlots+int(slot)+1)*p.item]
			for hh, g := range p.heads {
				for x := range bph {
					page[hh*bph+x] = topoByte(r, p.layer[b], p.half[b], j, g, x)
				}
			}
		}
	}
	off := 0
	for i, it := range auxItems {
		row := p.aux[off+auxSlot*int(it) : off+(auxSlot+1)*int(it)]
		if i == len(auxItems)-1 {
			clear(row)
			binary.LittleEndian.PutUint64(row, r)
		} else {
			for k := range row {
				row[k] = schedmem.AuxByte(r, i, k)
			}
		}
		off += int(it) * topoAux
	}
}

// decodeRank is one SGLang decode process.
type decodeRank struct {
	tp, pp      int
	p           *Peer
	layer, half []int
	heads       []int
}

func (c *topoCase) startDecode(t *testing.T, v Venv, bootstrap string, tp, pp int) *decodeRank {
	t.Helper()
	from, to := c.layers*pp/c.dpp, c.layers*(pp+1)/c.dpp
	dr := &decodeRank{tp: tp, pp: pp, heads: c.heads1(c.dtp, tp)}
	dr.layer, dr.half = c.topoBufs(from, to)
	args := []string{"--tp-size", fmt.Sprint(c.dtp), "--tp-rank", fmt.Sprint(tp), "--pp-size", fmt.Sprint(c.dpp),
		"--pp-rank", fmt.Sprint(pp), "--start-layer", fmt.Sprint(from), "--heads", fmt.Sprint(len(dr.heads))}
	if c.heads > 0 {
		args = append(args, "--total-heads", fmt.Sprint(c.heads))
	}
	if c.mla {
		args = append(args, "--mla")
	}
	if c.layerIDs {
		args = append(args, "--kv-layer-ids")
	}
	cfg := PeerConfig{Venv: v, Script: script(), Bootstrap: bootstrap, Layers: to - from, Slots: topoSlots,
		Item: len(dr.heads) * c.bph, AuxSlots: topoAux, Args: args, Env: []string{
			"SGLANG_HOST_IP=127.0.0.1", "PYTHONUNBUFFERED=1",
			fmt.Sprintf("SGLANG_DISAGGREGATION_WAITING_TIMEOUT=%g", waitingTimeout().Seconds()),
			fmt.Sprintf("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT=%g", releaseTimeout().Seconds()),
		}}
	if os.Getenv("KVXFER_SGL_PEER_STDERR") == "1" {
		cfg.Stderr = os.Stderr
	}
	p, err := StartPeer(cfg)
	if err != nil {
		t.Fatalf("decode tp%d pp%d: %v", tp, pp, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if ws, err := p.Warnings(); err == nil {
				for _, w := range ws {
					t.Logf("decode tp%d pp%d %s: %s", tp, pp, w.Level, w.Msg)
				}
			}
			t.Logf("decode tp%d pp%d stderr tail:\n%s", tp, pp, lastLines(p.Stderr(), 30))
		}
		p.Close()
	})
	if p.Info.TPSize != c.dtp || p.Info.TPRank != tp || p.Info.PPSize != c.dpp || p.Info.PPRank != pp || p.Info.MLA != c.mla {
		t.Fatalf("decode_peer identity %+v", p.Info)
	}
	dr.p = p
	return dr
}

// check verifies every byte of the decode pages dst and the aux row.
func (dr *decodeRank) check(t *testing.T, r uint64, dst []int32, aux, bph int) int {
	t.Helper()
	kv, auxBufs, err := dr.p.Read(dst, aux)
	if err != nil {
		t.Fatal(err)
	}
	if len(kv) != len(dr.layer) {
		t.Fatalf("decode tp%d pp%d read %d KV buffers, want %d", dr.tp, dr.pp, len(kv), len(dr.layer))
	}
	item := len(dr.heads) * bph
	n := 0
	for b, buf := range kv {
		for j := range dst {
			for hh, g := range dr.heads {
				for x := range bph {
					got := buf[j*item+hh*bph+x]
					if want := topoByte(r, dr.layer[b], dr.half[b], j, g, x); got != want {
						t.Fatalf("room %d decode tp%d pp%d: layer %d %s page %d head %d byte %d = %d, want %d",
							r, dr.tp, dr.pp, dr.layer[b], [2]string{"K", "V"}[dr.half[b]], j, g, x, got, want)
					}
					n++
				}
			}
		}
	}
	for i, row := range auxBufs {
		if i == len(auxItems)-1 {
			if got := binary.LittleEndian.Uint64(row); got != r {
				t.Fatalf("room %d decode tp%d: aux bootstrap_room = %d", r, dr.tp, got)
			}
			continue
		}
		for k, v := range row {
			if want := schedmem.AuxByte(r, i, k); v != want {
				t.Fatalf("room %d decode tp%d: aux buffer %d byte %d = %d, want %d", r, dr.tp, i, k, v, want)
			}
		}
		n += len(row)
	}
	return n
}

func registerDPRank(t *testing.T, bootstrap string, r uint64, dp int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"bootstrap_room": r, "dp_rank": dp})
	resp, err := http.Post("http://"+bootstrap+"/register_dp_rank", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/register_dp_rank: %s", resp.Status)
	}
}

// debugRejections returns /debug/peers' rejection reasons of d.
func debugRejections(t *testing.T, d *daemon.Daemon) []string {
	t.Helper()
	resp, err := http.Get("http://" + d.DebugAddr() + "/debug/peers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Peers []struct {
			Rejected string `json:"rejected"`
		} `json:"peers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range body.Peers {
		if p.Rejected != "" {
			out = append(out, p.Rejected)
		}
	}
	return out
}

// run deploys the case and plays its rooms; it returns the bytes verified.
func (c *topoCase) run(t *testing.T, v Venv, note func(string)) {
	needNIXL(t)
	if c.pdp == 0 {
		c.pdp = 1
	}
	if c.rooms == 0 {
		c.rooms = 3
	}
	var pre []*prefillRank
	bootstrap := ""
	for dp := range c.pdp {
		for pp := range c.ppp {
			for tp := range c.ptp {
				p := c.startPrefill(t, tp, pp, dp, bootstrap)
				if bootstrap == "" {
					bootstrap = p.d.BootstrapAddr()
				}
				pre = append(pre, p)
			}
		}
	}
	byPort := map[int]*prefillRank{}
	for _, p := range pre {
		byPort[p.d.PullPort()] = p
	}
	var dec []*decodeRank
	var mu sync.Mutex
	var wg sync.WaitGroup
	for pp := range c.dpp {
		for tp := range c.dtp {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dr := c.startDecode(t, v, bootstrap, tp, pp)
				mu.Lock()
				dec = append(dec, dr)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	if len(dec) != c.dtp*c.dpp {
		t.FailNow()
	}
	sort.Slice(dec, func(i, j int) bool { return dec[i].pp*c.dtp+dec[i].tp < dec[j].pp*c.dtp+dec[j].tp })
	src := []int32{5, 9, 10, 2, 40, 41, 42}
	dst := []int32{17, 3, 4, 99, 100, 7, 60}
	chunks := []int{3, 4}
	verified := 0
	for i := range c.rooms {
		r := uint64(0x70000+i*7919) + uint64(c.ptp*100+c.dtp*10+c.ppp)
		dpRank := int(r % uint64(c.pdp))
		if c.lb != "" && c.pdp > 1 {
			dpRank = i % c.pdp // round robin, told to the bootstrap server as SGLang's sender does
			registerDPRank(t, bootstrap, r, dpRank)
		}
		group := []*prefillRank{}
		for _, p := range pre {
			if p.dp == dpRank {
				group = append(group, p)
			}
		}
		for _, p := range group {
			p.fill(r, src, 3+i, c.bph)
			if _, err := p.cli.Open(r, ""); err != nil {
				t.Fatal(err)
			}
			if err := p.cli.Init(r, len(src), 3+i); err != nil {
				t.Fatal(err)
			}
		}
		aux := 10 + i
		for _, dr := range dec {
			views, err := dr.p.Open([]RoomSpec{{Room: r, Pages: dst, Aux: aux}}, true)
			if err != nil {
				t.Fatal(err)
			}
			if v := views[0]; v.Error != nil {
				t.Fatalf("decode tp%d open room %d: %s", dr.tp, r, *v.Error)
			}
			if v := views[0]; v.PrefillDP == nil || *v.PrefillDP != dpRank {
				t.Fatalf("decode tp%d pulls room %d from prefill DP rank %v, the prefill holds it on %d", dr.tp, r, v.PrefillDP, dpRank)
			}
		}
		for _, p := range group {
			off := 0
			for _, n := range chunks {
				if err := p.cli.Send(r, src[off:off+n], nil); err != nil {
					t.Fatal(err)
				}
				off += n
			}
		}
		if c.refuse != "" {
			c.checkRefused(t, v, r, group, dec)
			note("refused at registration: " + c.refuse)
			return
		}
		for _, dr := range dec {
			views, timedOut, err := dr.p.Wait([]uint64{r}, "terminal", decodeDeadline())
			if err != nil {
				t.Fatal(err)
			}
			if timedOut || views[0].Phase != "success" {
				t.Fatalf("decode tp%d pp%d room %d: %+v (timed out %v)", dr.tp, dr.pp, r, views[0], timedOut)
			}
			verified += dr.check(t, r, dst, aux, c.bph)
		}
		for _, p := range group {
			reps := waitPrefillRooms(t, p.cli, []uint64{r}, 10*time.Second)
			if reps[0].Status != kv.StatusSuccess {
				t.Fatalf("prefill tp%d pp%d dp%d room %d: %v %v", p.tp, p.pp, p.dp, r, reps[0].Status, reps[0].Reason)
			}
			_ = p.cli.Clear(r)
		}
	}
	note(fmt.Sprintf("%d prefill × %d decode ranks, %d rooms, %d bytes verified", len(pre), len(dec), c.rooms, verified))
}

// checkRefused: every prefill rank the decodes registered with refused them
// with SGLang's reason (/debug/peers), its room failed peer_rejected, and a
// decode that reads statuses (0.5.20+) failed the room with that reason.
func (c *topoCase) checkRefused(t *testing.T, v Venv, r uint64, group []*prefillRank, dec []*decodeRank) {
	t.Helper()
	for _, p := range group {
		reps := waitPrefillRooms(t, p.cli, []uint64{r}, 10*time.Second)
		if reps[0].Status != kv.StatusFailed || reps[0].Reason != kv.ReasonPeerRejected {
			t.Fatalf("prefill tp%d room %d: %v %v, want failed peer_rejected", p.tp, r, reps[0].Status, reps[0].Reason)
		}
		rej := debugRejections(t, p.d)
		if len(rej) == 0 || !strings.Contains(rej[0], c.refuse) {
			t.Fatalf("prefill tp%d /debug/peers rejections %q, want %q", p.tp, rej, c.refuse)
		}
	}
	if v.Version == "0.5.18" {
		return // reads no statuses: it waits for its own timeout, as with SGLang's prefill
	}
	for _, dr := range dec {
		views, timedOut, err := dr.p.Wait([]uint64{r}, "terminal", decodeDeadline())
		if err != nil {
			t.Fatal(err)
		}
		if timedOut || views[0].Phase != "failed" || !strings.Contains(views[0].ReasonText(), c.refuse) {
			t.Fatalf("decode tp%d room %d: %+v, want failed with %q", dr.tp, r, views[0], c.refuse)
		}
	}
}

func waitPrefillRooms(t *testing.T, cli *control.Client, ids []uint64, within time.Duration) []kv.Reply {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		reps, err := cli.Poll(ids, nil)
		if err != nil {
			t.Fatal(err)
		}
		done := true
		for _, r := range reps {
			done = done && r.Status.Terminal()
		}
		if done {
			return reps
		}
		if time.Now().After(deadline) {
			t.Fatalf("prefill rooms %v not terminal after %v: %+v", ids, within, reps)
		}
		time.Sleep(time.Millisecond)
	}
}

// topoCases are the deployments proven with SGLang's decode processes. The
// heterogeneous-TP MHA and PP2→PP1 ones are refusals here: SGLang's prefill
// refuses a DRAM decode in both (see docs/sglang-compat.md, topologies), and
// UCX cannot register VRAM without CUDA; their bytes are proven with the
// loopback backend (nixl/sglang TestTopologyBytes, emul/decode).
var topoCases = []topoCase{
	{name: "MLA TP1→TP2", mla: true, ptp: 1, ppp: 1, dtp: 2, dpp: 1, layers: 3, bph: 96},
	{name: "MLA TP2→TP1 (dummy rank)", mla: true, ptp: 2, ppp: 1, dtp: 1, dpp: 1, layers: 3, bph: 96},
	{name: "MLA TP4→TP2 (dummy ranks)", mla: true, ptp: 4, ppp: 1, dtp: 2, dpp: 1, layers: 2, bph: 64, rooms: 2},
	{name: "MHA TP2 PP2→PP2", heads: 4, ptp: 2, ppp: 2, dtp: 2, dpp: 2, layers: 4, bph: 32},
	{name: "MLA TP2 PP2→TP1 PP2 (dummy)", mla: true, ptp: 2, ppp: 2, dtp: 1, dpp: 2, layers: 4, bph: 64, rooms: 2},
	{name: "MHA DP2 follow_bootstrap_room", heads: 2, ptp: 1, ppp: 1, pdp: 2, dtp: 1, dpp: 1, layers: 2, bph: 64, rooms: 4},
	{name: "MHA DP2 round_robin", heads: 2, ptp: 1, ppp: 1, pdp: 2, dtp: 1, dpp: 1, layers: 2, bph: 64, rooms: 4, lb: "round_robin"},
	{name: "MHA TP1→TP2 refused (DRAM)", heads: 4, ptp: 1, ppp: 1, dtp: 2, dpp: 1, layers: 2, bph: 32,
		refuse: "NIXL heterogeneous-TP direct-to-host KV transfer is not implemented safely yet", rooms: 1},
	{name: "MHA TP2→TP1 refused (DRAM)", heads: 4, ptp: 2, ppp: 1, dtp: 1, dpp: 1, layers: 2, bph: 32,
		refuse: "NIXL heterogeneous-TP direct-to-host KV transfer is not implemented safely yet", rooms: 1},
	{name: "MHA PP2→PP1 refused (DRAM)", heads: 2, ptp: 1, ppp: 2, dtp: 1, dpp: 1, layers: 4, bph: 32, layerIDs: true,
		refuse: "NIXL PD transfer does not support HiSparse combined with decode-only speculative decoding.", rooms: 1},
}

// TestSGLangTopologies runs every topology against each release's decode
// processes and logs the topology × release matrix.
func TestSGLangTopologies(t *testing.T) {
	var m matrix
	defer m.log(t)
	for _, v := range Versions() {
		for _, c := range topoCases {
			m.run(t, v, c.name, func(t *testing.T, note func(string)) {
				venv := needVenv(t, v)
				c := c
				c.run(t, venv, note)
			})
		}
	}
}
