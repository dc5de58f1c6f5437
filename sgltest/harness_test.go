package sgltest

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/daemon"
	"github.com/kvxfer/kvxfer/internal/testrig/schedmem"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/transport/control"
)

// Geometry shared by the prefill scheduler and every decode peer: MHA, K of
// every layer then V, page size 1, and SGLang's MetadataBuffers aux layout
// (decode_peer.py aux_layout with hidden_size 64 in fp16), bootstrap_room last.
const (
	layers   = 2
	slots    = 1024
	item     = 256
	auxSlots = 512
)

var auxItems = []uint64{64, 64, 64, 64, 512, 512, 64, 128, 128, 64}

var geo = schedmem.Layout{Layers: layers, Slots: slots, Item: item, AuxSlots: auxSlots, AuxItems: auxItems}

func TestMain(m *testing.M) {
	if _, ok := os.LookupEnv("UCX_TLS"); !ok {
		os.Setenv("UCX_TLS", "tcp,self,sm") // no GPU, no IB here
	}
	// libnixl finds NIXL through a Python that has the wheel: prefer the
	// NIXL venv, else an SGLang venv (both hold nixl-cu12 1.5.1).
	if os.Getenv("KVXFER_LIBNIXL") == "" && os.Getenv("KVXFER_NIXL_PYTHON") == "" {
		for _, py := range append([]string{"/opt/kvxfer-nixl/bin/python"}, venvPythons()...) {
			if _, err := os.Stat(py); err == nil {
				os.Setenv("KVXFER_NIXL_PYTHON", py)
				break
			}
		}
	}
	os.Exit(m.Run())
}

func venvPythons() []string {
	var out []string
	for _, v := range Versions() {
		out = append(out, filepath.Join(Root(), v, "bin", "python"))
	}
	return out
}

func required() bool { return os.Getenv("KVXFER_REQUIRE_SGLANG") == "1" }

// needVenv returns the venv or skips (fails with KVXFER_REQUIRE_SGLANG=1).
func needVenv(t testing.TB, version string) Venv {
	t.Helper()
	v, err := FindVenv(version)
	if err != nil {
		if required() {
			t.Fatalf("KVXFER_REQUIRE_SGLANG=1: %v", err)
		}
		t.Skip(err)
	}
	return v
}

func needNIXL(t testing.TB) {
	t.Helper()
	if _, err := libnixl.Find(""); err != nil {
		if required() {
			t.Fatalf("KVXFER_REQUIRE_SGLANG=1 but NIXL is missing (bash scripts/install-nixl.sh): %v", err)
		}
		t.Skipf("NIXL not available (bash scripts/install-nixl.sh): %v", err)
	}
}

func script() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "tests", "sglang", "decode_peer.py")
}

// Timeouts the decode peers run with, short so that a missing signal costs
// seconds, not SGLang's 300 s / 30 s defaults.
func waitingTimeout() time.Duration  { return envDuration("KVXFER_SGL_WAITING_TIMEOUT", 8*time.Second) }
func releaseTimeout() time.Duration  { return envDuration("KVXFER_SGL_RELEASE_TIMEOUT", 4*time.Second) }
func decodeDeadline() time.Duration  { return waitingTimeout() + 4*time.Second }
func releaseDeadline() time.Duration { return releaseTimeout() + 3*time.Second }

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

var seq atomic.Int64

// env is one kvxferd (in-process, libnixl backend), the prefill scheduler
// driving it over the control API, and decode peers.
type env struct {
	t     testing.TB
	d     *daemon.Daemon
	sched *scheduler
	peers map[string]*Peer
}

func newEnv(t testing.TB, versions ...string) *env {
	t.Helper()
	return newEnvWith(t, nil, versions...)
}

// newEnvWith lets mod change kvxferd's configuration.
func newEnvWith(t testing.TB, mod func(*daemon.Config), versions ...string) *env {
	t.Helper()
	venvs := make([]Venv, len(versions))
	for i, v := range versions {
		venvs[i] = needVenv(t, v)
	}
	needNIXL(t)
	e := &env{t: t, peers: map[string]*Peer{}}
	e.d = startDaemon(t, mod)
	e.sched = newScheduler(t, e.d)
	for _, v := range venvs {
		e.peers[v.Version] = e.startPeer(v)
	}
	return e
}

func (e *env) startPeer(v Venv) *Peer {
	t := e.t
	t.Helper()
	peerEnv := []string{
		"SGLANG_HOST_IP=127.0.0.1",
		fmt.Sprintf("SGLANG_DISAGGREGATION_WAITING_TIMEOUT=%g", waitingTimeout().Seconds()),
		fmt.Sprintf("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT=%g", releaseTimeout().Seconds()),
		"PYTHONUNBUFFERED=1",
	}
	var stderr *os.File
	if os.Getenv("KVXFER_SGL_PEER_STDERR") == "1" {
		stderr = os.Stderr
	}
	cfg := PeerConfig{Venv: v, Script: script(), Bootstrap: e.d.BootstrapAddr(), Layers: layers, Slots: slots,
		Item: item, AuxSlots: auxSlots, Env: peerEnv}
	if stderr != nil {
		cfg.Stderr = stderr
	}
	p, err := StartPeer(cfg)
	if err != nil {
		t.Fatalf("decode peer %s: %v", v.Version, err)
	}
	t.Cleanup(func() {
		if !p.Killed() {
			checkPeerHealth(t, p)
		}
		if t.Failed() {
			if ws, err := p.Warnings(); err == nil {
				for _, w := range ws {
					t.Logf("decode %s %s %s: %s", v.Version, w.Level, w.Logger, w.Msg)
				}
			}
			t.Logf("decode %s stderr tail:\n%s", v.Version, lastLines(p.Stderr(), 40))
		}
		p.Close()
	})
	if fmt.Sprint(p.Info.AuxItemLens) != fmt.Sprint(auxItems) {
		t.Fatalf("decode aux layout %v, prefill registers %v", p.Info.AuxItemLens, auxItems)
	}
	return p
}

// protocolComplaints are SGLang log lines that mean kvxferd sent this decode
// something its release does not take.
var protocolComplaints = []string{
	"Generation-less ABORT_ACK", "unexpected message tag", "malformed prefill status",
	"unparsable prefill status", "Incomplete ABORT_ACK", "Malformed ABORT_ACK",
	"Ignoring non-terminal status", "No expected prefill response count",
}

// checkPeerHealth fails the test on a protocol complaint in the decode's log,
// and on NIXL notifications left unread by a release that reads none (spec
// §1.4: they pile up inside that decode's agent).
func checkPeerHealth(t testing.TB, p *Peer) {
	t.Helper()
	ws, err := p.Warnings()
	if err != nil {
		t.Errorf("decode %s: %v", p.Info.Version, err)
		return
	}
	for _, w := range ws {
		for _, c := range protocolComplaints {
			if strings.Contains(w.Msg, c) {
				t.Errorf("decode %s logged %s: %s", p.Info.Version, w.Level, w.Msg)
			}
		}
	}
	msgs, ok, err := p.UnreadNotifs()
	if err != nil {
		t.Errorf("decode %s: %v", p.Info.Version, err)
	} else if ok && len(msgs) > 0 {
		n := len(msgs)
		if n > 5 {
			msgs = msgs[:5]
		}
		t.Errorf("decode %s never reads NIXL notifications, yet %d were sent to it, e.g. %q", p.Info.Version, n, msgs)
	}
}

func startDaemon(t testing.TB, mod func(*daemon.Config)) *daemon.Daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvs") // short: ipc paths are limited to 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := daemon.Config{
		HostIP: "127.0.0.1", ServeBootstrap: true, DebugAddr: "127.0.0.1:0",
		ControlEndpoint: "ipc://" + filepath.Join(dir, "ctl.sock"),
		NewAgent: func(name string) (daemon.Agent, error) {
			a, err := libnixl.New(fmt.Sprintf("%s-%d", name, seq.Add(1)), libnixl.Options{})
			if err != nil {
				return nil, err
			}
			return daemon.WithFileMapping(a), nil
		},
	}
	// No Dialect: kvxferd detects each decode's SGLang release from its frames.
	if mod != nil {
		mod(&cfg)
	}
	d, err := daemon.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	})
	return d
}

// scheduler plays SGLang's prefill scheduler: it owns the KV and aux memory
// (files kvxferd maps and registers with NIXL) and drives rooms over the
// control API.
type scheduler struct {
	mu  sync.Mutex // the control client is used from one goroutine at a time
	kv  []byte
	aux []byte
	cli *control.Client
	// shm, when set (useShm), carries open, init, send, abort and clear on
	// the shared-memory ring and answers polls from the status table;
	// request/reply keeps hello and register_memory.
	shm *control.ShmClient
}

// useShm moves s onto the shared-memory control path, as a scheduler with
// KVXFER_SHM on does.
func (s *scheduler) useShm(t testing.TB) {
	t.Helper()
	sc, err := control.AttachShm(s.cli, control.ShmOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	s.shm = sc
}

// barrier (shm only) waits until kvxferd consumed every record submitted:
// they reached the engine, as a request/reply call had when it returned, so
// the scenarios' ordering against decode's messages is the same on both
// paths. The caller holds mu.
func (s *scheduler) barrier(t testing.TB) {
	t.Helper()
	if s.shm != nil {
		if err := s.shm.Barrier(); err != nil {
			t.Fatalf("shm barrier: %v", err)
		}
	}
}

// trySend sends pages of room id and returns the error (a send may be
// refused after an abort or a failure).
func (s *scheduler) trySend(id uint64, pages []int32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shm != nil {
		err := s.shm.Send(id, pages, nil)
		if err == nil {
			err = s.shm.Barrier()
		}
		return err
	}
	return s.cli.Send(id, pages, nil)
}

func newScheduler(t testing.TB, d *daemon.Daemon) *scheduler {
	t.Helper()
	kvPath, auxPath := geo.Files(t, t.TempDir())
	view, err := loopback.New(fmt.Sprintf("sgl-sched-view-%d-%d", os.Getpid(), seq.Add(1)), loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { view.Close() })
	s := &scheduler{}
	if s.kv, err = view.Attach(kvPath); err != nil {
		t.Fatal(err)
	}
	if s.aux, err = view.Attach(auxPath); err != nil {
		t.Fatal(err)
	}
	if s.cli, err = control.Dial(d.ControlEndpoint()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cli.Close() })
	kv, aux := geo.FileRegistrations(kvPath, auxPath)
	if _, err := s.cli.RegisterMemory(kv); err != nil {
		t.Fatal(err)
	}
	if _, err := s.cli.RegisterMemory(aux); err != nil {
		t.Fatal(err)
	}
	if !d.Live() {
		t.Fatal("kvxferd not live after KV and aux were registered")
	}
	return s
}

// prefillRoom is one room as the prefill scheduler sends it.
type prefillRoom struct {
	id     uint64
	src    []int32 // prefill slots; page j of the request is src[j]
	chunks []int
	aux    int
}

func (s *scheduler) open(t testing.TB, r prefillRoom) {
	t.Helper()
	geo.Prep(s.kv, s.aux, r.id, r.src, r.aux)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shm != nil {
		if err := s.shm.Open(r.id); err != nil {
			t.Fatalf("shm open %d: %v", r.id, err)
		}
		if err := s.shm.Init(r.id, len(r.src), r.aux); err != nil {
			t.Fatalf("shm init %d: %v", r.id, err)
		}
		s.barrier(t)
		return
	}
	if _, err := s.cli.Open(r.id, ""); err != nil {
		t.Fatalf("open %d: %v", r.id, err)
	}
	if err := s.cli.Init(r.id, len(r.src), r.aux); err != nil {
		t.Fatalf("init %d: %v", r.id, err)
	}
}

// sendChunk sends chunk i of r (page ranges follow r.chunks).
func (s *scheduler) sendChunk(t testing.TB, r prefillRoom, i int) {
	t.Helper()
	from := 0
	for _, n := range r.chunks[:i] {
		from += n
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shm != nil {
		if err := s.shm.Send(r.id, r.src[from:from+r.chunks[i]], nil); err != nil {
			t.Fatalf("shm send %d chunk %d: %v", r.id, i, err)
		}
		s.barrier(t)
		return
	}
	if err := s.cli.Send(r.id, r.src[from:from+r.chunks[i]], nil); err != nil {
		t.Fatalf("send %d chunk %d: %v", r.id, i, err)
	}
}

func (s *scheduler) start(t testing.TB, r prefillRoom) {
	t.Helper()
	s.open(t, r)
	for i := range r.chunks {
		s.sendChunk(t, r, i)
	}
}

func (s *scheduler) poll(t testing.TB, ids []uint64) []kv.Reply {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shm != nil {
		// The table answers rooms open in the session; a room not open
		// there (not yet opened, or cleared) is asked over request/reply,
		// as the Python client does.
		if reps, err := s.shm.Poll(ids, nil); err == nil {
			return reps
		}
	}
	reps, err := s.cli.Poll(ids, nil)
	if err != nil {
		t.Fatalf("poll: %v", err)
	}
	return reps
}

func (s *scheduler) abort(t testing.TB, ids ...uint64) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shm != nil {
		for _, id := range ids {
			if err := s.shm.Abort(id); err != nil {
				t.Fatalf("shm abort: %v", err)
			}
		}
		s.barrier(t)
		return
	}
	if err := s.cli.Abort(ids...); err != nil {
		t.Fatalf("abort: %v", err)
	}
}

func (s *scheduler) clearRooms(ids ...uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shm != nil {
		for _, id := range ids {
			_ = s.shm.Clear(id) // a room not open in the session has nothing to clear
		}
		_ = s.shm.Barrier()
		return
	}
	_ = s.cli.Clear(ids...)
}

// waitPrefill polls until every room is terminal (or until cond holds for
// every room when cond is set), failing at the deadline.
func (s *scheduler) waitPrefill(t testing.TB, ids []uint64, within time.Duration, cond func(kv.Reply) bool) []kv.Reply {
	t.Helper()
	if cond == nil {
		cond = func(r kv.Reply) bool { return r.Status.Terminal() }
	}
	deadline := time.Now().Add(within)
	for {
		reps := s.poll(t, ids)
		done := true
		for _, r := range reps {
			if !cond(r) {
				done = false
				break
			}
		}
		if done {
			return reps
		}
		if time.Now().After(deadline) {
			var bad []string
			for i, r := range reps {
				if !cond(r) {
					bad = append(bad, fmt.Sprintf("%d:%v/%v", ids[i], r.Status, r.Reason))
				}
				if len(bad) == 10 {
					break
				}
			}
			t.Fatalf("prefill rooms not there after %v: %s", within, strings.Join(bad, " "))
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// verify checks every byte of room r's destination pages and aux row in decode memory.
func verify(t testing.TB, p *Peer, r uint64, dst []int32, aux int) {
	t.Helper()
	kv, auxBufs, err := p.Read(dst, aux)
	if err != nil {
		t.Fatal(err)
	}
	if len(kv) != 2*layers || len(auxBufs) != len(auxItems) {
		t.Fatalf("decode read %d KV and %d aux buffers", len(kv), len(auxBufs))
	}
	for b, buf := range kv {
		for j := range dst {
			page := buf[j*item : (j+1)*item]
			for k, v := range page {
				if want := kvmem.Pattern(r, b, j, k); v != want {
					t.Fatalf("room %d: decode buffer %d page %d (request page %d) byte %d = %d, want %d", r, b, dst[j], j, k, v, want)
				}
			}
		}
	}
	for i, row := range auxBufs {
		if i == len(auxItems)-1 {
			if got := binary.LittleEndian.Uint64(row); got != r {
				t.Fatalf("room %d: decode aux slot %d bootstrap_room = %d", r, aux, got)
			}
			for k, v := range row[8:] {
				if v != 0 {
					t.Fatalf("room %d: bootstrap_room row byte %d = %d", r, 8+k, v)
				}
			}
			continue
		}
		for k, v := range row {
			if want := schedmem.AuxByte(r, i, k); v != want {
				t.Fatalf("room %d: decode aux buffer %d slot %d byte %d = %d, want %d", r, i, aux, k, v, want)
			}
		}
	}
}

// matrix collects release × scenario results for the final log.
type matrix struct {
	mu   sync.Mutex
	rows []matrixRow
}

type matrixRow struct {
	release, scenario string
	ok, skipped       bool
	d                 time.Duration
	note              string
}

func (m *matrix) run(t *testing.T, release, scenario string, f func(t *testing.T, note func(string))) {
	var note string
	start := time.Now()
	var skipped, ran bool
	ok := t.Run(release+"/"+scenario, func(t *testing.T) {
		ran = true
		defer func() { skipped = t.Skipped() }()
		f(t, func(s string) { note = s })
	})
	if !ran { // filtered out by -run
		return
	}
	m.mu.Lock()
	m.rows = append(m.rows, matrixRow{release, scenario, ok, skipped, time.Since(start), note})
	m.mu.Unlock()
}

func (m *matrix) log(t *testing.T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var releases []string
	seen := map[string]bool{}
	for _, r := range m.rows {
		if !seen[r.release] {
			seen[r.release] = true
			releases = append(releases, r.release)
		}
	}
	sort.Strings(releases)
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-8s %-32s %-5s %8s  %s\n", "release", "scenario", "res", "time", "note")
	for _, rel := range releases {
		for _, r := range m.rows {
			if r.release != rel {
				continue
			}
			res := "PASS"
			switch {
			case r.skipped:
				res = "SKIP"
			case !r.ok:
				res = "FAIL"
			}
			fmt.Fprintf(&b, "%-8s %-32s %-5s %7.2fs  %s\n", r.release, r.scenario, res, r.d.Seconds(), r.note)
		}
	}
	t.Log(b.String())
}
