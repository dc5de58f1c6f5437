package testrig

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeT records a Fatalf instead of ending the test, so that the failure
// path of a wait can be checked.
type fakeT struct {
	testing.TB
	failed atomic.Bool
	msg    string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed.Store(true)
	f.msg = format
	for _, a := range args {
		if s, ok := a.(string); ok {
			f.msg += " " + s
		}
	}
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int64
	Eventually(t, 10*time.Second, "three checks", func() bool { return n.Add(1) >= 3 })
	if n.Load() != 3 {
		t.Fatalf("condition checked %d times, want 3", n.Load())
	}
}

func TestEventuallyFailsNamingWhatItWaitedFor(t *testing.T) {
	f := &fakeT{TB: t}
	Eventually(f, 5*time.Millisecond, "the moon", func() bool { return false })
	if !f.failed.Load() || !strings.Contains(f.msg, "the moon") {
		t.Fatalf("failed %v with %q", f.failed.Load(), f.msg)
	}
}

func TestProcLogsAndStops(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	p := Start(t, "sleeper", exec.Command("/bin/sh", "-c", `echo hello; touch "$0"; exec sleep 60`, ready), ProcOpts{Grace: 5 * time.Second})
	p.WaitReady(t, 10*time.Second, FileExists(ready))
	if !p.Alive() || p.ExitDesc() != "" {
		t.Fatalf("alive %v, exit %q", p.Alive(), p.ExitDesc())
	}
	if _, ok := p.Stop(5 * time.Second); !ok {
		t.Fatal("sleep did not exit on SIGTERM")
	}
	if p.Alive() || !strings.Contains(p.ExitDesc(), "terminated") {
		t.Fatalf("after Stop: alive %v, exit %q", p.Alive(), p.ExitDesc())
	}
	if got := Tail(p.Log, 5); got != "hello" {
		t.Fatalf("log %q", got)
	}
}

func TestWaitReadyFailsWhenTheProcessExits(t *testing.T) {
	p := Start(t, "quitter", exec.Command("/bin/sh", "-c", "exit 3"), ProcOpts{})
	f := &fakeT{TB: t}
	p.WaitReady(f, 10*time.Second, FileExists(filepath.Join(t.TempDir(), "never")))
	if !f.failed.Load() || !strings.Contains(f.msg, "exited at start") {
		t.Fatalf("failed %v with %q", f.failed.Load(), f.msg)
	}
}

func TestLastLinesCutsLongLines(t *testing.T) {
	s := "a\nb\n" + strings.Repeat("x", 500) + "\n"
	got := LastLines(s, 2)
	if !strings.HasPrefix(got, "b\n") || len(got) != len("b\n")+400+len("…") {
		t.Fatalf("LastLines = %q", got)
	}
}

func TestRepoRoot(t *testing.T) {
	if _, err := os.Stat(filepath.Join(RepoRoot(), "go.mod")); err != nil {
		t.Fatal(err)
	}
}
