package large

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a peer.py child process speaking JSON lines.
type proc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *limitWriter
}

func (r *runner) start(argv []string) (*proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	p := &proc{cmd: cmd, stderr: &limitWriter{n: 64 << 10}}
	cmd.Stderr = p.stderr
	var err error
	if p.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.out = bufio.NewReaderSize(stdout, 1<<20)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *proc) send(v any) {
	b, _ := json.Marshal(v)
	_, _ = p.in.Write(append(b, '\n'))
}

// read reads the next JSON line (NIXL may print others), with a deadline.
func (p *proc) read(v any) error {
	type res struct {
		line []byte
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		for {
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
			return fmt.Errorf("python peer: %v\n%s", r.err, p.stderr.String())
		}
		return json.Unmarshal(r.line, v)
	case <-time.After(120 * time.Second):
		return fmt.Errorf("python peer silent for 120s\n%s", p.stderr.String())
	}
}

func (p *proc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

func (p *proc) stop() {
	p.signal(syscall.SIGCONT)
	p.in.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

// limitWriter keeps the first n bytes written (the child's stderr, for
// error messages); exec writes it from its own goroutine.
type limitWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
	n  int
}

func (w *limitWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := w.n - w.b.Len(); room > 0 {
		w.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (w *limitWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:min(3, len(strings.Fields(string(b))))], " ")
}
