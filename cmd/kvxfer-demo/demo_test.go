package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDemoAcrossProcesses builds kvxferd and the emulators and runs the
// multi-process demo on a small workload: kvxferd, the scheduler and a fleet
// of decode processes of different SGLang releases, meeting only over
// SGLang's protocol and the control API. The demo exits non-zero on a pinned
// room, a wrong byte, held pages, a disagreement between the two sides, or a
// process that did not exit cleanly.
func TestDemoAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon and the emulators")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/kvxferd", "./cmd/kvxfer-sched", "./cmd/kvxfer-decode", "./cmd/kvxfer-demo")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name  string
		args  []string
		fleet []string
		// queued: whether the 0.5.18 decode is left unread messages
		// (kvxferd takes a 23-frame decode for 0.5.20 unless told otherwise).
		queued bool
	}{
		// Every release at once, kvxferd detecting each.
		{name: "every-release-auto", fleet: []string{"0.5.18", "0.5.20", "0.5.21", "0.5.22", "0.5.23"}, queued: true},
		// 23-frame decodes taken for 0.5.18: nothing queues on it; 0.5.22 is
		// found out by its first armed ABORT.
		{name: "legacy-0.5.18", args: []string{"-decode-protocol-legacy", "0.5.18"}, fleet: []string{"0.5.18", "0.5.22", "0.5.23"}},
		// Pinned: every decode taken for one release.
		{name: "pinned-0.5.22", args: []string{"-decode-protocol", "0.5.22"}, fleet: []string{"0.5.22", "0.5.22"}},
		{name: "pinned-0.5.23", args: []string{"-decode-protocol", "0.5.23"}, fleet: []string{"0.5.23"}},
		// One decode stopped (SIGSTOP) 4 s mid-run, its notification queue
		// full: the other decode's rooms must not notice (the demo fails on
		// a release timeout there: an ABORT_ACK that never came because its
		// rooms' writes waited behind the stopped decode). A short release
		// timeout ends the stopped decode's own waits; enough rooms that the
		// run is still going when the pause starts (the demo fails if not).
		{name: "paused-decode", args: []string{"-rooms", "40000", "-pause-decode", "4s", "-release-timeout", "5s"}, fleet: []string{"0.5.22", "0.5.23"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-rooms", "400", "-concurrency", "32", "-fleet", strings.Join(tc.fleet, ",")}, tc.args...)
			cmd := exec.Command(filepath.Join(bin, "kvxfer-demo"), args...)
			cmd.Env = os.Environ()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("demo failed: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "OK: no room pinned") {
				t.Fatalf("demo output lacks its verdict:\n%s", out)
			}
			// Each process's CPU per room, from its rusage: never 0 for kvxferd.
			if !regexp.MustCompile(`CPU per room \(user\+sys, whole process\): kvxferd [1-9][0-9]* µs, scheduler [0-9]+ µs, decodes [0-9]+ µs \(.*\), all [1-9][0-9]* µs`).Match(out) {
				t.Fatalf("demo output lacks the CPU per room line:\n%s", out)
			}
			// One row per decode process in each of the three summary tables.
			for _, rel := range tc.fleet {
				rows := rowsOf(string(out), rel)
				if len(rows) < 3 {
					t.Fatalf("summary lacks the rows of %s:\n%s", rel, out)
				}
				if rel == "0.5.18" {
					// Second table: ... queued_unread is the 7th column.
					if q := rows[1][6]; (q != "0") != tc.queued {
						t.Errorf("0.5.18 queued_unread %s, want queued=%v:\n%s", q, tc.queued, out)
					}
				}
			}
		})
	}
}

// rowsOf returns the summary table rows (split into fields) that start with rel.
func rowsOf(out, rel string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 6 && f[0] == rel {
			rows = append(rows, f)
		}
	}
	return rows
}

// TestEmulatorEnv: the emulators get GOMAXPROCS=-emulator-procs unless the
// environment sets it, and Go's default with 0.
func TestEmulatorEnv(t *testing.T) {
	base := []string{"PATH=/bin", "HOME=/root"}
	for _, c := range []struct {
		env   []string
		procs int
		want  string // the GOMAXPROCS entry, "" for none
	}{
		{base, 1, "GOMAXPROCS=1"},
		{base, 3, "GOMAXPROCS=3"},
		{base, 0, ""},
		{append(slices.Clone(base), "GOMAXPROCS=2"), 1, "GOMAXPROCS=2"},
	} {
		got := emulatorEnv(c.env, c.procs)
		var gm []string
		for _, kv := range got {
			if strings.HasPrefix(kv, "GOMAXPROCS=") {
				gm = append(gm, kv)
			}
		}
		switch {
		case c.want == "" && len(gm) != 0, c.want != "" && (len(gm) != 1 || gm[0] != c.want):
			t.Errorf("env %v, procs %d: GOMAXPROCS entries %v, want %q", c.env, c.procs, gm, c.want)
		}
		if len(got) < len(c.env) || !slices.Equal(got[:len(c.env)], c.env) {
			t.Errorf("env %v: the caller's entries changed: %v", c.env, got)
		}
	}
}

// TestSchedArgs: -spin-max reaches kvxfer-sched only when set (0 leaves
// kvxferd's default spin), before the workload's flags.
func TestSchedArgs(t *testing.T) {
	w := []string{"-rooms", "10"}
	if a := schedArgs("ipc://c", "j", "r", 64, 0, w); slices.Contains(a, "-spin-max") || !slices.Equal(a[len(a)-2:], w) {
		t.Fatalf("no spin: %v", a)
	}
	a := schedArgs("ipc://c", "j", "r", 64, 50*time.Microsecond, w)
	i := slices.Index(a, "-spin-max")
	if i < 0 || a[i+1] != "50µs" || !slices.Equal(a[len(a)-2:], w) {
		t.Fatalf("spin 50µs: %v", a)
	}
}

func TestGoalLine(t *testing.T) {
	for _, c := range []struct {
		fleet                        string
		share, rps, p50, cpu, l0, l1 float64
		want, not                    []string
	}{
		{"0.5.22,0.5.23", 0.2, 12000, 4.5, 30, 1, 2, []string{"rooms/s 12000 met", "p50 4.50 ms met", "kvxferd 30 µs met"}, []string{"NOT", "not the goal"}},
		{"0.5.22,0.5.23", 0.2, 9000, 6, 90, 1, 2, []string{"rooms/s 9000 NOT met", "p50 6.00 ms NOT met", "kvxferd 90 µs NOT met"}, nil},
		{"0.5.22,0.5.23", 0.2, 12000, 6, 30, 3, 5, []string{"not judged: load 5.00 > 4"}, nil},
		{"0.5.23", 0.2, 12000, 4, 30, 1, 1, []string{"not the goal's setting"}, nil},
	} {
		got := goalLine(c.fleet, c.share, c.rps, c.p50, c.cpu, c.l0, c.l1)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%q lacks %q", got, w)
			}
		}
		for _, n := range c.not {
			if strings.Contains(got, n) {
				t.Errorf("%q has %q", got, n)
			}
		}
	}
}
