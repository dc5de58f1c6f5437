package hosts

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/internal/testrig/schedmem"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
	"github.com/kvxfer/kvxfer/sgltest"
	"github.com/kvxfer/kvxfer/transport/control"
)

// Geometry shared by the prefill scheduler and every SGLang decode peer (as
// sgltest's: decode_peer.py's defaults and aux layout).
const (
	layers   = 2
	slots    = 1024
	item     = 256
	auxSlots = 512
)

var auxItems = []uint64{64, 64, 64, 64, 512, 512, 64, 128, 128, 64}

var geo = schedmem.Layout{Layers: layers, Slots: slots, Item: item, AuxSlots: auxSlots, AuxItems: auxItems}

// Both sides read SGLang's heartbeat variables: decode gives a prefill up
// after interval × max failures of failed GET /health.
const (
	heartbeatInterval = "1"
	heartbeatFailures = "2"
)

// commonEnv is the environment of every process on either host.
func commonEnv() []string {
	env := []string{"UCX_TLS=tcp", "PYTHONUNBUFFERED=1",
		"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=" + heartbeatInterval,
		"SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=" + heartbeatFailures}
	if py := nixlPython(); py != "" {
		env = append(env, "KVXFER_NIXL_PYTHON="+py)
	}
	return env
}

// baseEnv is os.Environ without the variables that would pick an address
// for a process (each one is given its own).
func baseEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SGLANG_HOST_IP=") || strings.HasPrefix(kv, "HOST_IP=") || strings.HasPrefix(kv, "UCX_TLS=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

func nixlPython() string {
	if v := os.Getenv("KVXFER_NIXL_PYTHON"); v != "" {
		return v
	}
	for _, py := range []string{"/opt/kvxfer-nixl/bin/python", filepath.Join(sgltest.Root(), "0.5.23", "bin", "python")} {
		if _, err := os.Stat(py); err == nil {
			return py
		}
	}
	return ""
}

func required() bool { return os.Getenv("KVXFER_REQUIRE_HOSTS") == "1" }

func needNIXL(t *testing.T) {
	t.Helper()
	if py := nixlPython(); py != "" {
		os.Setenv("KVXFER_NIXL_PYTHON", py)
	}
	if _, err := libnixl.Find(""); err != nil {
		if required() {
			t.Fatalf("KVXFER_REQUIRE_HOSTS=1 but NIXL is missing (scripts/install-nixl.sh): %v", err)
		}
		t.Skipf("NIXL not available (scripts/install-nixl.sh): %v", err)
	}
}

func binDir(t *testing.T) string {
	t.Helper()
	return testrig.BinDir(t, "make test-hosts", "kvxferd", "kvxfer-sched", "kvxfer-decode")
}

func freePort(t *testing.T) int { return testrig.FreePort(t, "0.0.0.0") }

// ---------------------------------------------------------------- kvxferd

// kvxferd is a kvxferd process on the prefill host.
type kvxferd struct {
	*testrig.Proc
	dir  string
	ctl  string
	boot string // host:port decodes query
	port int
}

// startKvxferd starts kvxferd with the real NIXL backend; args add flags
// (-host among them), env adds variables.
func startKvxferd(t *testing.T, args []string, env ...string) *kvxferd {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvh") // short: ipc paths are limited to 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &kvxferd{dir: dir, ctl: "ipc://" + filepath.Join(dir, "ctl.sock"), port: freePort(t)}
	d.boot = net.JoinHostPort(prefillIP, strconv.Itoa(d.port))
	all := append([]string{"-nixl-backend", "nixl", "-control", d.ctl, "-disaggregation-bootstrap-port", strconv.Itoa(d.port),
		"-debug-addr", "", "-log-level", "info"}, args...)
	cmd := exec.Command(filepath.Join(binDir(t), "kvxferd"), all...)
	cmd.Env = append(append(baseEnv(), commonEnv()...),
		"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=30", "KVXFER_WAITING_TIMEOUT=30",
		"KVXFER_TRANSFER_TIMEOUT=40", "KVXFER_DRAIN_TIMEOUT=3", "KVXFER_LINGER_TIMEOUT=60")
	cmd.Env = append(cmd.Env, env...)
	d.Proc = testrig.Start(t, "kvxferd", cmd, testrig.ProcOpts{Log: filepath.Join(dir, "kvxferd.log"), Grace: 15 * time.Second, TailLines: 60})
	d.WaitReady(t, 30*time.Second, testrig.FileExists(filepath.Join(dir, "ctl.sock")))
	return d
}

func (d *kvxferd) log() string {
	b, _ := os.ReadFile(d.Log)
	return string(b)
}

// route asks the bootstrap server, as decode does, where the rank is.
func route(t *testing.T, boot string) (ip string, port int) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + boot + "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var ep struct {
		RankIP   string `json:"rank_ip"`
		RankPort int    `json:"rank_port"`
	}
	if err := jsonUnmarshal(b, &ep); err != nil {
		t.Fatalf("GET /route: %v: %s", err, b)
	}
	return ep.RankIP, ep.RankPort
}

// ---------------------------------------------------------------- scheduler

// scheduler plays SGLang's prefill scheduler: it owns the KV and aux memory
// (files kvxferd maps and registers with NIXL) and drives rooms over the
// control API.
type scheduler struct {
	mu  sync.Mutex
	kv  []byte
	aux []byte
	cli *control.Client
}

func mapFile(t *testing.T, path string, n int) []byte {
	t.Helper()
	if err := os.WriteFile(path, make([]byte, n), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

func newScheduler(t *testing.T, d *kvxferd) *scheduler {
	t.Helper()
	kvPath, auxPath := filepath.Join(d.dir, "kv"), filepath.Join(d.dir, "aux")
	s := &scheduler{kv: mapFile(t, kvPath, geo.KVLen()), aux: mapFile(t, auxPath, geo.AuxLen())}
	var err error
	if s.cli, err = control.Dial(d.ctl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cli.Close() })
	kv, aux := geo.FileRegistrations(kvPath, auxPath)
	if _, err := s.cli.RegisterMemory(kv); err != nil {
		t.Fatalf("register KV: %v\n%s", err, testrig.Tail(d.Log, 30))
	}
	if _, err := s.cli.RegisterMemory(aux); err != nil {
		t.Fatalf("register aux: %v\n%s", err, testrig.Tail(d.Log, 30))
	}
	return s
}

// hroom is one room: prefill slots src, decode pages dst (page j of the
// request is src[j] on prefill, dst[j] on decode), its chunks and aux slot.
type hroom struct {
	id       uint64
	src, dst []int32
	chunks   []int
	aux      int
}

func (r hroom) spec() sgltest.RoomSpec { return sgltest.RoomSpec{Room: r.id, Pages: r.dst, Aux: r.aux} }

func (s *scheduler) open(t *testing.T, r hroom) {
	t.Helper()
	geo.Prep(s.kv, s.aux, r.id, r.src, r.aux)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.cli.Open(r.id, ""); err != nil {
		t.Fatalf("open %d: %v", r.id, err)
	}
	if err := s.cli.Init(r.id, len(r.src), r.aux); err != nil {
		t.Fatalf("init %d: %v", r.id, err)
	}
}

func (s *scheduler) sendChunk(t *testing.T, r hroom, i int) {
	t.Helper()
	from := 0
	for _, n := range r.chunks[:i] {
		from += n
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.cli.Send(r.id, r.src[from:from+r.chunks[i]], nil); err != nil {
		t.Fatalf("send %d chunk %d: %v", r.id, i, err)
	}
}

func (s *scheduler) start(t *testing.T, r hroom) {
	t.Helper()
	s.open(t, r)
	for i := range r.chunks {
		s.sendChunk(t, r, i)
	}
}

func (s *scheduler) poll(t *testing.T, ids []uint64) []kv.Reply {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	reps, err := s.cli.Poll(ids, nil)
	if err != nil {
		t.Fatalf("poll: %v", err)
	}
	return reps
}

func (s *scheduler) abort(t *testing.T, ids ...uint64) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.cli.Abort(ids...); err != nil {
		t.Fatalf("abort: %v", err)
	}
}

// waitTerminal polls until every room is terminal, returning the replies and
// when each room was first seen terminal; it fails at the deadline.
func (s *scheduler) waitTerminal(t *testing.T, ids []uint64, within time.Duration) ([]kv.Reply, []time.Time) {
	t.Helper()
	at := make([]time.Time, len(ids))
	deadline := time.Now().Add(within)
	for {
		reps := s.poll(t, ids)
		done := true
		for i, r := range reps {
			if r.Status.Terminal() {
				if at[i].IsZero() {
					at[i] = time.Now()
				}
			} else {
				done = false
			}
		}
		if done {
			return reps, at
		}
		if time.Now().After(deadline) {
			var bad []string
			for i, r := range reps {
				if !r.Status.Terminal() && len(bad) < 10 {
					bad = append(bad, fmt.Sprintf("%d:%v", ids[i], r.Status))
				}
			}
			t.Fatalf("prefill rooms not terminal after %v: %s", within, strings.Join(bad, " "))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitBootstrapped polls until no room is still Bootstrapping (each has its
// transfer info), failing at the deadline.
func (s *scheduler) waitBootstrapped(t *testing.T, ids []uint64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		done := true
		for _, r := range s.poll(t, ids) {
			done = done && r.Status != kv.StatusBootstrapping
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("transfer infos not all in after %v", within)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ---------------------------------------------------------------- rooms

// alloc hands out decode pages, prefill slots and aux slots round-robin.
type alloc struct {
	nextID       uint64
	page, aux, s int
}

func (a *alloc) room(pages int, chunks ...int) hroom {
	a.nextID++
	r := hroom{id: a.nextID, chunks: chunks, aux: a.aux}
	a.aux = (a.aux + 1) % auxSlots
	for range pages {
		r.dst = append(r.dst, int32(a.page))
		r.src = append(r.src, int32(a.s))
		a.page = (a.page + 1) % slots
		a.s = (a.s + 7) % slots // another page order than decode's
	}
	return r
}

func ids(rs []hroom) []uint64 {
	out := make([]uint64, len(rs))
	for i, r := range rs {
		out[i] = r.id
	}
	return out
}

// verify checks every byte of room r's pages and aux row in decode memory.
func verify(t *testing.T, p *sgltest.Peer, r hroom) {
	t.Helper()
	kv, auxBufs, err := p.Read(r.dst, r.aux)
	if err != nil {
		t.Fatal(err)
	}
	if len(kv) != 2*layers || len(auxBufs) != len(auxItems) {
		t.Fatalf("decode read %d KV and %d aux buffers", len(kv), len(auxBufs))
	}
	for b, buf := range kv {
		for j := range r.dst {
			page := buf[j*item : (j+1)*item]
			for k, v := range page {
				if want := kvmem.Pattern(r.id, b, j, k); v != want {
					t.Fatalf("room %d: decode buffer %d page %d byte %d = %d, want %d", r.id, b, r.dst[j], k, v, want)
				}
			}
		}
	}
	for i, row := range auxBufs {
		if i == len(auxItems)-1 {
			if got := binary.LittleEndian.Uint64(row); got != r.id {
				t.Fatalf("room %d: decode aux bootstrap_room = %d", r.id, got)
			}
			continue
		}
		for k, v := range row {
			if want := schedmem.AuxByte(r.id, i, k); v != want {
				t.Fatalf("room %d: decode aux buffer %d byte %d = %d, want %d", r.id, i, k, v, want)
			}
		}
	}
}

// ---------------------------------------------------------------- decode peers

// venvInDecode returns the release's venv with its python wrapped to run in
// the decode namespace (ip netns exec execs it: the pid is python's).
func venvInDecode(t *testing.T, version string) sgltest.Venv {
	t.Helper()
	v, err := sgltest.FindVenv(version)
	if err != nil {
		if required() || os.Getenv("KVXFER_REQUIRE_SGLANG") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	w := filepath.Join(t.TempDir(), "python")
	script := fmt.Sprintf("#!/bin/sh\nexec ip netns exec %s %s \"$@\"\n", decodeNS(), v.Python)
	if err := os.WriteFile(w, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	v.Python = w
	return v
}

// startPeer starts SGLang's decode in the decode namespace against boot.
func startPeer(t *testing.T, v sgltest.Venv, boot string) *sgltest.Peer {
	t.Helper()
	env := append(commonEnv(), "SGLANG_HOST_IP="+decodeIP,
		"SGLANG_DISAGGREGATION_WAITING_TIMEOUT=8", // 0.5.18 hears of a prefill abort only through it
		"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT=4")
	cfg := sgltest.PeerConfig{Venv: v, Script: filepath.Join(repoRoot(), "tests", "sglang", "decode_peer.py"), Bootstrap: boot,
		Layers: layers, Slots: slots, Item: item, AuxSlots: auxSlots, Env: env}
	if os.Getenv("KVXFER_SGL_PEER_STDERR") == "1" {
		cfg.Stderr = os.Stderr
	}
	p, err := sgltest.StartPeer(cfg)
	if err != nil {
		t.Fatalf("decode peer %s: %v", v.Version, err)
	}
	t.Cleanup(func() {
		if t.Failed() && !p.Killed() {
			if ws, err := p.Warnings(); err == nil {
				for _, w := range ws {
					t.Logf("decode %s %s %s: %s", v.Version, w.Level, w.Logger, w.Msg)
				}
			}
		}
		if t.Failed() {
			t.Logf("decode %s stderr tail:\n%s", v.Version, testrig.LastLines(p.Stderr(), 30))
		}
		p.Close()
	})
	if p.Info.IP != decodeIP {
		t.Fatalf("decode peer reports IP %s, want %s", p.Info.IP, decodeIP)
	}
	return p
}

// ---------------------------------------------------------------- table

// row is one line of the scenario table.
type row struct {
	decode, scenario, result string
	took                     time.Duration
	note                     string
}

type table struct {
	mu   sync.Mutex
	rows []row
}

var results table

func (tb *table) add(r row) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.rows = append(tb.rows, r)
}

// scenario runs f as a subtest and records its row.
func scenario(t *testing.T, decode, name string, f func(t *testing.T, note func(format string, args ...any))) bool {
	var note string
	start := time.Now()
	ran := false
	var skipped bool
	ok := t.Run(name, func(t *testing.T) {
		ran = true
		defer func() { skipped = t.Skipped() }()
		f(t, func(format string, args ...any) { note = fmt.Sprintf(format, args...) })
	})
	if !ran {
		return ok
	}
	res := "PASS"
	switch {
	case skipped:
		res = "SKIP"
	case !ok:
		res = "FAIL"
	}
	results.add(row{decode, name, res, time.Since(start), note})
	return ok
}

func (tb *table) markdown() string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var b bytes.Buffer
	fmt.Fprintln(&b, "| decode | scenario | result | time | what was measured |")
	fmt.Fprintln(&b, "|---|---|---|---:|---|")
	for _, r := range tb.rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f s | %s |\n", r.decode, r.scenario, r.result, r.took.Seconds(), r.note)
	}
	return b.String()
}
