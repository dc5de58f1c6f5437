package hostile

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
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
	sched, decode         *exec.Cmd
	schedDone, decodeDone chan struct{}
	schedErr, decodeErr   error
	schedJSON, decodeJSON string
	schedLog, decodeLog   string
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
	w := &workload{t: t, o: o, schedDone: make(chan struct{}), decodeDone: make(chan struct{}), start: time.Now(),
		schedJSON: filepath.Join(dir, "sched.json"), decodeJSON: filepath.Join(dir, "decode.json"),
		schedLog: filepath.Join(dir, "sched.log"), decodeLog: filepath.Join(dir, "decode.log")}
	common := []string{"-rooms", strconv.Itoa(o.rooms), "-seed", strconv.FormatUint(o.seed, 10), "-abort-share", "0",
		"-concurrency", strconv.Itoa(o.conc), "-rate", strconv.FormatFloat(o.rate, 'f', -1, 64)}
	w.sched = exec.Command(filepath.Join(bin, "kvxfer-sched"), append([]string{"-control", d.ctl, "-json", w.schedJSON}, common...)...)
	dargs := append([]string{"-bootstrap", d.boot, "-json", w.decodeJSON, "-sglang", o.release, "-page-size", "1",
		"-kv-cache-dtype", "auto", "-topology-retry", "20ms", "-topology-attempts", "1500", "-quiet",
		"-waiting-timeout", "30s", "-release-timeout", "15s"}, common...)
	w.decode = exec.Command(filepath.Join(bin, "kvxfer-decode"), append(dargs, o.decodeArgs...)...)
	for _, c := range []struct {
		cmd  *exec.Cmd
		log  string
		done chan struct{}
		err  *error
	}{{w.sched, w.schedLog, w.schedDone, &w.schedErr}, {w.decode, w.decodeLog, w.decodeDone, &w.decodeErr}} {
		f, err := os.Create(c.log)
		if err != nil {
			t.Fatal(err)
		}
		c.cmd.Stdout, c.cmd.Stderr = f, f
		c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", c.cmd.Path, err)
		}
		go func() {
			*c.err = c.cmd.Wait()
			f.Close()
			close(c.done)
		}()
	}
	t.Cleanup(func() {
		for _, c := range []*exec.Cmd{w.sched, w.decode} {
			if c.ProcessState == nil {
				c.Process.Kill()
			}
		}
		<-w.schedDone
		<-w.decodeDone
	})
	return w
}

// result waits for both processes (killing them after timeout) and returns a
// one-line description and whether every room succeeded with verified bytes.
func (w *workload) result(timeout time.Duration) (string, bool) {
	deadline := time.After(timeout)
	timedOut := false
	select {
	case <-w.schedDone:
	case <-w.decodeDone:
		// A decode that gave up (wrong page size, a lost prefill) leaves the
		// scheduler waiting for its grace: end it soon.
		if w.decodeErr != nil {
			select {
			case <-w.schedDone:
			case <-time.After(5 * time.Second):
				w.sched.Process.Kill()
			}
		}
	case <-deadline:
	}
	for _, done := range []chan struct{}{w.schedDone, w.decodeDone} {
		select {
		case <-done:
		case <-deadline:
			timedOut = true
			w.sched.Process.Kill()
			w.decode.Process.Kill()
			<-w.schedDone
			<-w.decodeDone
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
	ok := !timedOut && w.schedErr == nil && w.decodeErr == nil && s.Rooms == w.o.rooms && s.Pinned == 0 &&
		d.Outcomes["success"] == w.o.rooms && d.WrongBytes == 0 && d.AuxErrors == 0 && d.PagesHeld == 0
	desc := fmt.Sprintf("honest %d/%d rooms success, %.1f MB verified, %d wrong bytes, %d pinned (%.1f s)",
		d.Outcomes["success"], w.o.rooms, float64(d.BytesVerified)/1e6, d.WrongBytes, s.Pinned, time.Since(w.start).Seconds())
	if !ok {
		desc += fmt.Sprintf(" [sched: %v, decode: %v, timed out: %v, outcomes %v, errors %v]", w.schedErr, w.decodeErr, timedOut, d.Outcomes, d.Errors)
		w.t.Logf("sched log tail:\n%s\ndecode log tail:\n%s", tail(w.schedLog, 15), tail(w.decodeLog, 15))
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
