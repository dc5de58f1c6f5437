package libnixl_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
)

// pyPeer is a child Python process running testdata/nixl_peer.py, i.e. a NIXL
// agent built with NIXL's own Python API.
type pyPeer struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *syncBuf
	Name   string
	MD     []byte
	Addr   uintptr
	Len    uint64
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var (
	pyOnce sync.Once
	pyBin  string
	pyErr  error
)

// python returns an interpreter that can import NIXL's Python API, or skips.
func python(t testing.TB) string {
	t.Helper()
	pyOnce.Do(func() {
		pyBin = os.Getenv(libnixl.EnvPython)
		if pyBin == "" {
			pyBin = "python3"
		}
		out, err := exec.Command(pyBin, "-c", "import numpy\ntry:\n import nixl._api\nexcept ImportError:\n import nixl_cu12._api").CombinedOutput()
		if err != nil {
			pyErr = &pyMissing{string(out)}
		}
	})
	if pyErr != nil {
		t.Skipf("no Python with NIXL (%s=%q): %v", libnixl.EnvPython, pyBin, pyErr)
	}
	return pyBin
}

type pyMissing struct{ out string }

func (p *pyMissing) Error() string { return p.out }

// startPeer runs nixl_peer.py with args, reads its hello line and registers
// cleanup that ends the process.
func startPeer(t testing.TB, hello bool, args ...string) *pyPeer {
	t.Helper()
	py := python(t)
	cmd := exec.Command(py, append([]string{"testdata/nixl_peer.py"}, args...)...)
	p := &pyPeer{cmd: cmd, stderr: &syncBuf{}}
	cmd.Stderr = p.stderr
	var err error
	if p.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.out = bufio.NewReader(stdout)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("python peer stderr:\n%s", p.stderr.String())
		}
	})
	if hello {
		var h struct {
			Name string
			MD   string
			Addr uint64
			Len  uint64
		}
		p.read(t, &h)
		p.Name, p.Addr, p.Len = h.Name, uintptr(h.Addr), h.Len
		if p.MD, err = base64.StdEncoding.DecodeString(h.MD); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func (p *pyPeer) read(t testing.TB, v any) {
	t.Helper()
	type res struct {
		line []byte
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		for { // NIXL's Python logger may print to stdout too: skip non-JSON lines
			line, err := p.out.ReadBytes('\n')
			if err != nil || bytes.HasPrefix(line, []byte("{")) {
				ch <- res{line, err}
				return
			}
		}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("python peer: %v\nstderr:\n%s", r.err, p.stderr.String())
		}
		if err := json.Unmarshal(r.line, v); err != nil {
			t.Fatalf("python peer said %q: %v", r.line, err)
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("python peer silent for 90s\nstderr:\n%s", p.stderr.String())
	}
}

// signal sends sig (SIGSTOP, SIGCONT) to the peer's process.
func (p *pyPeer) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("python peer: %v: %v", sig, err)
	}
}

func (p *pyPeer) send(t testing.TB, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		t.Fatalf("python peer stdin: %v", err)
	}
}

// pattern is the byte pattern nixl_peer.py checks: seed + 131*(i/4096) + 7*i.
func pattern(b []byte, seed int) {
	for i := range b {
		b[i] = byte(seed + 131*(i/4096) + 7*i)
	}
}

// waitAll polls xs until every one is terminal and fails unless all are Done.
func waitAll(t testing.TB, ag nixl.Agent, xs ...nixl.XferID) {
	t.Helper()
	st := make([]nixl.Status, len(xs))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := ag.Poll(xs, st); err != nil {
			t.Fatal(err)
		}
		done := 0
		for i, s := range st {
			switch s.State {
			case nixl.Done:
				done++
			case nixl.Failed:
				t.Fatalf("request %d failed: %v", xs[i], s.Err)
			}
		}
		if done == len(xs) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests not done after 30s: %v", st)
		}
		time.Sleep(50 * time.Microsecond)
	}
}
