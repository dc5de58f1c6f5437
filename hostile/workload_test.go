package hostile

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
)

// workloadOpts sizes an honest workload: kvxfer-sched and one kvxfer-decode
// (SGLang 0.5.23 unless release says otherwise) sharing a seed, no planned
// aborts, so every room must succeed with every byte verified.
type workloadOpts struct {
	rooms   int
	rate    float64 // rooms per second on both sides (0: as fast as concurrency allows)
	conc    int
	seed    uint64
	release string
	// decodeArgs are extra flags for kvxfer-decode.
	decodeArgs []string
}

// workload is a running honest scheduler + decode pair.
type workload struct {
	t                     *testing.T
	o                     workloadOpts
	sched, decode         *testrig.Proc
	schedJSON, decodeJSON string
	start                 time.Time
}

// schedSummary and decodeSummary are the fields of the emulators' -json
// summaries the suite checks.
type schedSummary struct {
	Rooms      int      `json:"rooms"`
	Pinned     int      `json:"pinned"`
	Unexpected []string `json:"unexpected"`
	P99        float64  `json:"p99_ms"`
}

type decodeSummary struct {
	Rooms         int            `json:"rooms"`
	Outcomes      map[string]int `json:"outcomes"`
	BytesVerified int64          `json:"bytes_verified"`
	WrongBytes    int64          `json:"wrong_bytes"`
	AuxErrors     int            `json:"aux_errors"`
	PagesHeld     int            `json:"pages_held"`
	Errors        []string       `json:"errors"`
}

func startWorkload(t *testing.T, d *kvxferd, o workloadOpts) *workload {
	t.Helper()
	if o.rooms == 0 {
		o.rooms = 300
	}
	if o.conc == 0 {
		o.conc = 32
	}
	if o.seed == 0 {
		o.seed = 7
	}
	if o.release == "" {
		o.release = "0.5.23"
	}
	bin := binDir(t)
	dir := t.TempDir()
	w := &workload{t: t, o: o, start: time.Now(),
		schedJSON: filepath.Join(dir, "sched.json"), decodeJSON: filepath.Join(dir, "decode.json")}
	common := []string{"-rooms", strconv.Itoa(o.rooms), "-seed", strconv.FormatUint(o.seed, 10), "-abort-share", "0",
		"-concurrency", strconv.Itoa(o.conc), "-rate", strconv.FormatFloat(o.rate, 'f', -1, 64)}
	sched := exec.Command(filepath.Join(bin, "kvxfer-sched"), append([]string{"-control", d.ctl, "-json", w.schedJSON}, common...)...)
	dargs := append([]string{"-bootstrap", d.boot, "-json", w.decodeJSON, "-sglang", o.release, "-page-size", "1",
		"-kv-cache-dtype", "auto", "-topology-retry", "20ms", "-topology-attempts", "1500", "-quiet",
		"-waiting-timeout", "30s", "-release-timeout", "15s"}, common...)
	decode := exec.Command(filepath.Join(bin, "kvxfer-decode"), append(dargs, o.decodeArgs...)...)
	w.sched = testrig.Start(t, "kvxfer-sched", sched, testrig.ProcOpts{Log: filepath.Join(dir, "sched.log")})
	w.decode = testrig.Start(t, "kvxfer-decode", decode, testrig.ProcOpts{Log: filepath.Join(dir, "decode.log")})
	return w
}

// result waits for both processes (killing them after timeout) and returns a
// one-line description and whether every room succeeded with verified bytes.
func (w *workload) result(timeout time.Duration) (string, bool) {
	deadline := time.After(timeout)
	timedOut := false
	select {
	case <-w.sched.Done():
	case <-w.decode.Done():
		// A decode that gave up (wrong page size, a lost prefill) leaves the
		// scheduler waiting for its grace: end it soon.
		if w.decode.Err() != nil {
			select {
			case <-w.sched.Done():
			case <-time.After(5 * time.Second):
				w.sched.Cmd.Process.Kill()
			}
		}
	case <-deadline:
	}
	for _, done := range []<-chan struct{}{w.sched.Done(), w.decode.Done()} {
		select {
		case <-done:
		case <-deadline:
			timedOut = true
			w.sched.Cmd.Process.Kill()
			w.decode.Cmd.Process.Kill()
			<-w.sched.Done()
			<-w.decode.Done()
		}
	}
	var s schedSummary
	var d decodeSummary
	if b, err := os.ReadFile(w.schedJSON); err == nil {
		json.Unmarshal(b, &s)
	}
	if b, err := os.ReadFile(w.decodeJSON); err == nil {
		json.Unmarshal(b, &d)
	}
	ok := !timedOut && w.sched.Err() == nil && w.decode.Err() == nil && s.Rooms == w.o.rooms && s.Pinned == 0 &&
		d.Outcomes["success"] == w.o.rooms && d.WrongBytes == 0 && d.AuxErrors == 0 && d.PagesHeld == 0
	desc := fmt.Sprintf("honest %d/%d rooms success, %.1f MB verified, %d wrong bytes, %d pinned (%.1f s)",
		d.Outcomes["success"], w.o.rooms, float64(d.BytesVerified)/1e6, d.WrongBytes, s.Pinned, time.Since(w.start).Seconds())
	if !ok {
		desc += fmt.Sprintf(" [sched: %v, decode: %v, timed out: %v, outcomes %v, errors %v]", w.sched.Err(), w.decode.Err(), timedOut, d.Outcomes, d.Errors)
		w.t.Logf("sched log tail:\n%s\ndecode log tail:\n%s", testrig.Tail(w.sched.Log, 15), testrig.Tail(w.decode.Log, 15))
	}
	return desc, ok
}

// checkHonest waits for the workload and records it as a row of the table.
func checkHonest(t *testing.T, w *workload, timeout time.Duration) {
	t.Helper()
	desc, ok := w.result(timeout)
	record(t, "honest rooms during the attack", "all succeed, 0 wrong bytes", desc, ok)
}

// checkDaemon records the common assertions: alive, /health and /healthz
// answer, the canaries are unchanged, and the resources are within bounds.
func checkDaemon(t *testing.T, d *kvxferd, peak procStats, b procBounds, canaries ...*canary) {
	t.Helper()
	err := d.health(5 * time.Second)
	desc := "alive, /health and /healthz 200"
	if err != nil {
		desc = err.Error()
	}
	record(t, "daemon alive and answering", "alive, /health and /healthz 200", desc, err == nil)
	for _, c := range canaries {
		why := c.check()
		m := "unchanged"
		if why != "" {
			m = why
		}
		record(t, "canary "+filepath.Base(filepath.Dir(c.path))+"/"+"hostile-canary-*", "hash, size, mtime unchanged", m, why == "")
	}
	b.check(t, peak)
}

// procBounds are upper bounds on a daemon's resources (0: not checked).
type procBounds struct {
	rssMiB  float64
	threads int
	fds     int
}

func (b procBounds) String() string {
	return fmt.Sprintf("RSS ≤ %.0f MiB, threads ≤ %d, fds ≤ %d", b.rssMiB, b.threads, b.fds)
}

func (b procBounds) check(t *testing.T, peak procStats) {
	t.Helper()
	ok := (b.rssMiB == 0 || peak.rssMiB() <= b.rssMiB) && (b.threads == 0 || peak.Threads <= b.threads) && (b.fds == 0 || peak.FDs <= b.fds)
	record(t, "peak resources", b.String(), "peak "+peak.String(), ok)
}
