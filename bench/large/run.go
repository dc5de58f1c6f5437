package large

import (
	"bytes"
	_ "embed"
	"encoding/base64"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kvxfer/kvxfer/bench/stats"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
)

//go:embed peer.py
var peerPy []byte

// pageAlign is the alignment of every slab (the stand-in's, each
// initiator's): SGLang's KV tensors are at least 64-byte aligned, and a copy
// between buffers whose offsets differ within a cache line runs at about
// half the speed of an aligned one.
const pageAlign = 4096

// The engines of a cell, in the order of the first round (later rounds
// rotate it).
const (
	Memcpy        = "memcpy"         // Go copy of the merged pairs between two slabs of this process
	Kvxfer        = "kvxfer"         // kvxfer's Go NIXL binding posting the merged list (Create)
	KvxferPrepped = "kvxfer-prepped" // the same binding over SGLang's per-page prepared indices (Make)
	Py            = "nixl-py"        // NIXL's Python API posting the merged list (initialize_xfer)
	PySGLang      = "nixl-py-sglang" // NIXL's Python API as SGLang posts: make_prepped_xfer, per-page indices
	// Cma is the copy under UCX's shared-memory transport without NIXL or
	// UCX: process_vm_writev of the merged pairs into the decode stand-in,
	// one call per descriptor, as UCX's cma transport makes one per put.
	Cma = "cma"
	// CmaBatched is the same copy with up to 1,024 descriptors per call:
	// what the kernel does when descriptors are not copied one by one.
	CmaBatched = "cma-batched"
)

// Engines lists them. The cma engines run only where the decode stand-in is
// on this host and the transport is shared memory (Results.CmaSkipped says
// why not).
var Engines = []string{Memcpy, Kvxfer, KvxferPrepped, Py, PySGLang, Cma, CmaBatched}

// Config is a large-room run: every geometry at every in-flight count.
type Config struct {
	Geometries []Geometry `json:"geometries"`
	InFlight   []int      `json:"in_flight"`
	// Pairs measured rounds per engine and cell, after Warm dropped ones; a
	// round moves at least RoundBytes (whole rounds of InFlight rooms).
	Pairs      int    `json:"pairs"`
	Warm       int    `json:"warm"`
	RoundBytes int    `json:"round_bytes"`
	Seed       uint64 `json:"seed"`
	// Transport is UCX_TLS for every process ("sm,self": shared memory and
	// cma on one host; "tcp,self" for the namespace pair).
	Transport string `json:"transport"`
	// Python runs peer.py ("": $KVXFER_NIXL_PYTHON, else python3); LibPath
	// is libnixl ("": libnixl.Find). TargetWrap prefixes the target's command
	// (e.g. "ip netns exec NS" for a second host).
	// NoProgressThread runs both initiators (the Go agent and the Python
	// one) without NIXL's progress thread. On cma the copy is done inside
	// the initiator's own progress calls while it holds the UCX worker's
	// lock, and the progress thread spins on that lock meanwhile
	// (pthread_spin_lock: 40 % of the Go process's samples under perf).
	NoProgressThread bool     `json:"no_progress_thread,omitempty"`
	Python           string   `json:"-"`
	LibPath          string   `json:"-"`
	TargetWrap       []string `json:"target_wrap,omitempty"`
}

// Results is what a run measured.
type Results struct {
	Config  Config    `json:"config"`
	Skipped string    `json:"skipped,omitempty"` // why nothing ran (no NIXL here)
	Started time.Time `json:"started"`
	// CmaSkipped says why the cma engines did not run ("": they did).
	CmaSkipped string    `json:"cma_skipped,omitempty"`
	LoadAvg    [2]string `json:"loadavg"`
	Cells      []Cell    `json:"cells"`
}

// Cell is one geometry at one in-flight count.
type Cell struct {
	Geometry  Geometry `json:"geometry"`
	InFlight  int      `json:"in_flight"`
	RoomBytes int      `json:"room_bytes"`
	Iters     int      `json:"rounds_of_rooms_per_round"`
	// DescsMerged and DescsSGLang are descriptors per room: kvxfer's merged
	// list and SGLang's prepared-path indices (one per buffer and page).
	DescsMerged float64 `json:"descs_per_room_merged"`
	DescsSGLang float64 `json:"descs_per_room_sglang"`
	// Verified: after a kvxfer round into zeroed decode memory, and again
	// after a kvxfer-prepped one (and each cma engine's, where they run),
	// every merged destination range held its source bytes (CRC-32 on both
	// sides).
	Verified bool           `json:"verified"`
	Engines  []EngineResult `json:"engines"`
	// Ratios are medians of per-pair ratios of kvxfer's rate to memcpy's
	// ("kvxfer/memcpy"), to nixl-py's, to nixl-py-sglang's, to the better of
	// memcpy and nixl-py in that pair ("kvxfer/best") and, where it ran, to
	// cma's ("kvxfer/cma").
	Ratios  map[string]float64 `json:"ratios"`
	LoadAvg [2]string          `json:"loadavg"`
}

// EngineResult is one engine in one cell.
type EngineResult struct {
	Engine   string    `json:"engine"`
	GBps     float64   `json:"gb_per_s_median"` // 1e9 bytes/s
	Rounds   []float64 `json:"gb_per_s"`
	CPUPerGB float64   `json:"cpu_s_per_gb"` // process CPU (all threads) per 1e9 bytes, measured rounds
}

// Run runs cfg. A machine without NIXL (library or Python API) gets a
// Results with Skipped set and no error.
func Run(cfg Config, progress io.Writer) (*Results, error) {
	res := &Results{Config: cfg, Started: time.Now(), LoadAvg: [2]string{loadavg(), ""}}
	defer func() { res.LoadAvg[1] = loadavg() }()
	lib, err := libnixl.Find(cfg.LibPath)
	if err != nil {
		res.Skipped = fmt.Sprintf("NIXL library not found: %v", err)
		return res, nil
	}
	py := cfg.Python
	if py == "" {
		if py = os.Getenv(libnixl.EnvPython); py == "" {
			py = "python3"
		}
	}
	if out, err := exec.Command(py, "-c", "import numpy\ntry:\n import nixl._api\nexcept ImportError:\n import nixl_cu12._api").CombinedOutput(); err != nil {
		res.Skipped = fmt.Sprintf("no Python with NIXL (%s): %v %s", py, err, bytes.TrimSpace(out))
		return res, nil
	}
	dir, err := os.MkdirTemp("", "kvxfer-large-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "peer.py")
	if err := os.WriteFile(script, peerPy, 0o644); err != nil {
		return nil, err
	}
	if cfg.Transport != "" {
		os.Setenv("UCX_TLS", cfg.Transport) // read by UCX in this process and in the children
	}
	if os.Getenv("NIXL_LOG_LEVEL") == "" {
		os.Setenv("NIXL_LOG_LEVEL", "WARN")
	}
	ag, err := libnixl.New(fmt.Sprintf("kvxfer-large-%d", os.Getpid()), libnixl.Options{Path: lib, NoProgressThread: cfg.NoProgressThread})
	if err != nil {
		res.Skipped = fmt.Sprintf("NIXL agent could not start: %v", err)
		return res, nil
	}
	defer ag.Close()
	r := &runner{cfg: cfg, ag: ag, py: py, script: script, progress: progress, cmaSkipped: cmaUnsupported(cfg)}
	defer func() { res.CmaSkipped = r.cmaSkipped }()
	for _, g := range cfg.Geometries {
		cells, err := r.geometry(g)
		res.Cells = append(res.Cells, cells...)
		if err != nil {
			return res, fmt.Errorf("large %s: %w", g.Name, err)
		}
	}
	return res, nil
}

type runner struct {
	cfg      Config
	ag       *libnixl.Agent
	py       string
	script   string
	progress io.Writer
	seq      int
	// cmaSkipped says why the cma engines do not run ("": they do).
	cmaSkipped string
}

// cmaUnsupported says why cfg's decode stand-in cannot be written with
// process_vm_writev as UCX's shared-memory transport writes it ("": it can).
func cmaUnsupported(cfg Config) string {
	switch {
	case len(cfg.TargetWrap) > 0:
		return "the decode stand-in runs under " + strings.Join(cfg.TargetWrap, " ") + " (another host)"
	case !slices.Contains(strings.Split(cfg.Transport, ","), "sm"):
		return fmt.Sprintf("UCX_TLS=%s has no shared-memory transport", cfg.Transport)
	}
	return ""
}

// engines are the engines a cell runs.
func (r *runner) engines() []string {
	if r.cmaSkipped == "" {
		return Engines
	}
	return slices.DeleteFunc(slices.Clone(Engines), func(e string) bool { return e == Cma || e == CmaBatched })
}

func (r *runner) logf(format string, args ...any) {
	if r.progress != nil {
		fmt.Fprintf(r.progress, "large: "+format+"\n", args...)
	}
}

// geometry sets up both sides for g (slabs sized for the largest in-flight
// count) and measures every in-flight count.
func (r *runner) geometry(g Geometry) (cells []Cell, err error) {
	slots := g.Slots(slices.Max(r.cfg.InFlight))
	size := g.Bufs() * slots * g.PageBytes()
	r.seq++
	tgt, err := r.start(append(slices.Clone(r.cfg.TargetWrap), r.py, r.script, "target",
		"--name", fmt.Sprintf("large-tgt-%d-%d", os.Getpid(), r.seq), "--size", fmt.Sprint(size), "--bufs", fmt.Sprint(g.Bufs())))
	if err != nil {
		return nil, err
	}
	defer tgt.stop()
	var hello struct {
		Name string
		MD   string
		Addr uint64
		Len  uint64
	}
	if err := tgt.read(&hello); err != nil {
		return nil, err
	}
	if hello.Addr%pageAlign != 0 {
		// Every initiator's source is page-aligned: a stand-in that is not
		// would halve the kernel copies of the aligned ones (peer.py).
		return nil, fmt.Errorf("decode stand-in's slab at %#x is not %d-byte aligned", hello.Addr, pageAlign)
	}
	md, err := base64.StdEncoding.DecodeString(hello.MD)
	if err != nil {
		return nil, err
	}
	gs, err := r.goSide(g, slots, size, md, hello.Addr)
	if err != nil {
		return nil, err
	}
	defer gs.close()
	if r.cmaSkipped == "" {
		if err := gs.attachCma(tgt.cmd.Process.Pid); err != nil {
			r.cmaSkipped = err.Error()
			r.logf("cma engines skipped: %v", err)
		}
	}
	iargs := []string{r.py, r.script, "initiator",
		"--name", fmt.Sprintf("large-ini-%d-%d", os.Getpid(), r.seq), "--size", fmt.Sprint(size), "--bufs", fmt.Sprint(g.Bufs())}
	if r.cfg.NoProgressThread {
		iargs = append(iargs, "--no-progress-thread")
	}
	ini, err := r.start(iargs)
	if err != nil {
		return nil, err
	}
	defer ini.stop()
	ini.send(map[string]any{"md": hello.MD, "addr": hello.Addr, "slots": slots, "item": g.PageBytes()})
	var ready map[string]any
	if err := ini.read(&ready); err != nil {
		return nil, err
	}
	for _, n := range r.cfg.InFlight {
		c, err := r.cell(g, n, slots, gs, tgt, ini)
		if err != nil {
			return cells, err
		}
		cells = append(cells, c)
		r.logf("%s × %d in flight: %s", mib(g.RoomBytes()), n, c.summary())
	}
	return cells, nil
}

func (c *Cell) summary() string {
	var b strings.Builder
	for _, e := range c.Engines {
		fmt.Fprintf(&b, "%s %.2f GB/s, ", e.Engine, e.GBps)
	}
	fmt.Fprintf(&b, "kvxfer/best %.2f, descs %.0f vs %.0f", c.Ratios["kvxfer/best"], c.DescsMerged, c.DescsSGLang)
	return b.String()
}

// cell measures n rooms in flight of geometry g: Warm+Pairs rounds, every
// engine once a round, the engines' order rotating from round to round.
func (r *runner) cell(g Geometry, n, slots int, gs *goSide, tgt, ini *proc) (Cell, error) {
	c := Cell{Geometry: g, InFlight: n, RoomBytes: g.RoomBytes(), Ratios: map[string]float64{}, LoadAvg: [2]string{loadavg(), ""}}
	sp, dp := Pages(g, n, slots, r.cfg.Seed+uint64(n))
	rooms, err := Rooms(g, slots, sp, dp)
	if err != nil {
		return c, err
	}
	for _, rm := range rooms {
		c.DescsMerged += float64(len(rm.Src)) / float64(n)
		c.DescsSGLang += float64(len(rm.SrcIdx)) / float64(n)
	}
	c.Iters = max(1, r.cfg.RoundBytes/(n*g.RoomBytes()))
	// The Python initiator gets the same rooms, as offsets.
	msg := make([]map[string]any, len(rooms))
	for i, rm := range rooms {
		m := make([]uint64, 0, 3*len(rm.Src))
		for k := range rm.Src {
			m = append(m, uint64(rm.Src[k].Addr), uint64(rm.Dst[k].Addr), rm.Src[k].Len)
		}
		msg[i] = map[string]any{"m": m, "si": rm.SrcIdx, "di": rm.DstIdx}
	}
	ini.send(map[string]any{"rooms": msg})
	var ack map[string]any
	if err := ini.read(&ack); err != nil {
		return c, err
	}
	gs.setRooms(rooms)
	// Bytes first: a kvxfer round into zeroed decode memory must leave every
	// merged destination range holding its source range, and SGLang's
	// per-page request the same bytes in the same places.
	type write struct {
		post func(int) error
		what string
	}
	writes := []write{{gs.merged, "merged"}, {gs.prepped, "per-page"}}
	if r.cmaSkipped == "" {
		writes = append(writes, write{gs.cmaPerDesc, "cma"}, write{gs.cmaBatched, "cma batched"})
	}
	for _, w := range writes {
		tgt.send(map[string]bool{"zero": true})
		if err := tgt.read(&ack); err != nil {
			return c, err
		}
		if err := w.post(1); err != nil {
			return c, err
		}
		if c.Verified, err = verify(gs, tgt, rooms); err != nil {
			return c, err
		}
		if !c.Verified {
			return c, fmt.Errorf("decode memory does not hold the source bytes after a %s write", w.what)
		}
	}
	ini.signal(syscall.SIGSTOP)
	defer ini.signal(syscall.SIGCONT)
	pyRound := func(mode string) (float64, float64, error) {
		ini.signal(syscall.SIGCONT)
		defer ini.signal(syscall.SIGSTOP)
		ini.send(map[string]any{"iters": c.Iters, "mode": mode})
		var out struct{ Seconds, CPU float64 }
		err := ini.read(&out)
		return out.Seconds, out.CPU, err
	}
	goRound := func(f func(int) error) (float64, float64, error) {
		c0, t0 := cpuNow(), time.Now()
		err := f(c.Iters)
		return time.Since(t0).Seconds(), (cpuNow() - c0).Seconds(), err
	}
	round := map[string]func() (float64, float64, error){
		Memcpy:        func() (float64, float64, error) { return goRound(gs.memcpy) },
		Cma:           func() (float64, float64, error) { return goRound(gs.cmaPerDesc) },
		CmaBatched:    func() (float64, float64, error) { return goRound(gs.cmaBatched) },
		Kvxfer:        func() (float64, float64, error) { return goRound(gs.merged) },
		KvxferPrepped: func() (float64, float64, error) { return goRound(gs.prepped) },
		Py:            func() (float64, float64, error) { return pyRound("merged") },
		PySGLang:      func() (float64, float64, error) { return pyRound("sglang") },
	}
	bytesPerRound := float64(c.Iters * n * g.RoomBytes())
	engines := r.engines()
	rates := map[string][]float64{}
	cpu := map[string]float64{}
	for i := range r.cfg.Warm + r.cfg.Pairs {
		for k := range engines {
			e := engines[(i+k)%len(engines)]
			sec, cs, err := round[e]()
			if err != nil {
				return c, fmt.Errorf("%s: %w", e, err)
			}
			if i >= r.cfg.Warm {
				rates[e] = append(rates[e], bytesPerRound/sec/1e9)
				cpu[e] += cs
			}
		}
	}
	gb := bytesPerRound * float64(r.cfg.Pairs) / 1e9
	for _, e := range engines {
		c.Engines = append(c.Engines, EngineResult{Engine: e, GBps: stats.Median(rates[e]), Rounds: rates[e], CPUPerGB: cpu[e] / gb})
	}
	ratio := func(other func(i int) float64) float64 {
		per := make([]float64, r.cfg.Pairs)
		for i := range per {
			per[i] = rates[Kvxfer][i] / other(i)
		}
		return stats.Median(per)
	}
	c.Ratios["kvxfer/memcpy"] = ratio(func(i int) float64 { return rates[Memcpy][i] })
	c.Ratios["kvxfer/nixl-py"] = ratio(func(i int) float64 { return rates[Py][i] })
	c.Ratios["kvxfer/nixl-py-sglang"] = ratio(func(i int) float64 { return rates[PySGLang][i] })
	c.Ratios["kvxfer-prepped/nixl-py-sglang"] = stats.Median(pairRatios(rates[KvxferPrepped], rates[PySGLang]))
	c.Ratios["kvxfer/best"] = ratio(func(i int) float64 { return max(rates[Memcpy][i], rates[Py][i]) })
	if len(rates[Cma]) > 0 {
		c.Ratios["kvxfer/cma"] = ratio(func(i int) float64 { return rates[Cma][i] })
	}
	c.LoadAvg[1] = loadavg()
	return c, nil
}

func pairRatios(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] / b[i]
	}
	return out
}

// verify compares the CRC of every merged destination range on the target
// with that of its source range here.
func verify(gs *goSide, tgt *proc, rooms []Room) (bool, error) {
	var ranges [][2]uint64
	var want []uint32
	for _, rm := range rooms {
		for k := range rm.Src {
			ranges = append(ranges, [2]uint64{uint64(rm.Dst[k].Addr), rm.Dst[k].Len})
			want = append(want, crc32.ChecksumIEEE(gs.src[rm.Src[k].Addr:uint64(rm.Src[k].Addr)+rm.Src[k].Len]))
		}
	}
	tgt.send(map[string]any{"sum": ranges})
	var got struct{ Sums []uint32 }
	if err := tgt.read(&got); err != nil {
		return false, err
	}
	return slices.Equal(got.Sums, want), nil
}
