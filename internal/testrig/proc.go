package testrig

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Proc is a child process under test.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  string // the file that holds its stdout and stderr
	// Started is when Start returned.
	Started time.Time

	done chan struct{}
	err  error
}

// ProcOpts says how Start runs and ends a process.
type ProcOpts struct {
	// Log is the file for stdout and stderr (default NAME.log in a
	// temporary directory of the test).
	Log string
	// Grace is how long the cleanup waits after SIGTERM before it kills a
	// process that still runs; 0 kills it at once.
	Grace time.Duration
	// TailLines of the log are logged when the test failed (default 40).
	TailLines int
}

// Start starts cmd, its output in a log file and SIGKILL as its parent-death
// signal (a test binary that dies leaves no process behind). The test's
// cleanup stops it if it still runs, and logs the log's tail if the test
// failed.
func Start(t testing.TB, name string, cmd *exec.Cmd, o ProcOpts) *Proc {
	t.Helper()
	if o.Log == "" {
		o.Log = filepath.Join(t.TempDir(), name+".log")
	}
	if o.TailLines == 0 {
		o.TailLines = 40
	}
	logf, err := os.Create(o.Log)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, Log: o.Log, Started: time.Now(), done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		if p.Alive() {
			p.Stop(o.Grace)
		}
		if t.Failed() {
			t.Logf("%s log tail (%s):\n%s", name, p.Log, Tail(p.Log, o.TailLines))
		}
	})
	return p
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how the process exited (nil: status 0); only valid after Done.
func (p *Proc) Err() error { return p.err }

// Alive reports whether the process still runs.
func (p *Proc) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// ExitDesc says how the process ended ("" while it runs).
func (p *Proc) ExitDesc() string {
	if p.Alive() {
		return ""
	}
	if p.err == nil {
		return "exit 0"
	}
	return p.err.Error()
}

// Wait waits up to limit for the process to exit and returns how it exited;
// ok is false when it still runs.
func (p *Proc) Wait(limit time.Duration) (err error, ok bool) {
	select {
	case <-p.done:
		return p.err, true
	case <-time.After(limit):
		return nil, false
	}
}

// Stop sends SIGTERM and waits up to limit; it returns how long the exit
// took (limit and false when it did not exit: the process is then killed).
// A limit of 0 kills at once.
func (p *Proc) Stop(limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	if limit > 0 {
		p.Cmd.Process.Signal(syscall.SIGTERM)
		if _, ok := p.Wait(limit); ok {
			return time.Since(start), true
		}
	}
	p.Kill()
	return limit, false
}

// Kill sends SIGKILL and waits for the exit.
func (p *Proc) Kill() {
	p.Cmd.Process.Kill()
	<-p.done
}

// WaitReady waits until ready returns nil, failing the test when the process
// exits first or after within, with ready's last error and the log's tail.
func (p *Proc) WaitReady(t testing.TB, within time.Duration, ready func() error) {
	t.Helper()
	err := errors.New("not checked")
	Until(within, func() bool {
		if err = ready(); err == nil || !p.Alive() {
			return true
		}
		return false
	})
	switch {
	case err == nil:
	case !p.Alive():
		t.Fatalf("%s exited at start (%s); log:\n%s", p.Name, p.ExitDesc(), Tail(p.Log, 40))
	default:
		t.Fatalf("%s did not come up in %v (%v); log:\n%s", p.Name, within, err, Tail(p.Log, 40))
	}
}

// FileExists is a WaitReady condition: the process created path (a socket,
// a summary file).
func FileExists(path string) func() error {
	return func() error {
		_, err := os.Stat(path)
		return err
	}
}

// Tail returns the last n lines of the file at path, each cut at 400 bytes.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return LastLines(string(b), n)
}

// LastLines returns the last n lines of s, each cut at 400 bytes.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if len(l) > 400 {
			lines[i] = l[:400] + "…"
		}
	}
	return strings.Join(lines, "\n")
}
