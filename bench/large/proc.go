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
	"syscall"
	"time"
)

// proc is a peer.py child process speaking JSON lines.
type proc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *os.File // the child writes it directly; read back for error messages
}

func (r *runner) start(argv []string) (*proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	// A file, not a buffer: the child writes it itself, so nothing in this
	// process writes while an error message reads it.
	errf, err := os.CreateTemp("", "kvxfer-large-peer-*.stderr")
	if err != nil {
		return nil, err
	}
	_ = os.Remove(errf.Name()) // the open descriptors keep it until both ends close
	p := &proc{cmd: cmd, stderr: errf}
	cmd.Stderr = errf
	fail := func(err error) (*proc, error) { errf.Close(); return nil, err }
	if p.in, err = cmd.StdinPipe(); err != nil {
		return fail(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fail(err)
	}
	p.out = bufio.NewReaderSize(stdout, 1<<20)
	if err := cmd.Start(); err != nil {
		return fail(err)
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
			return fmt.Errorf("python peer: %v\n%s", r.err, p.stderrHead())
		}
		return json.Unmarshal(r.line, v)
	case <-time.After(120 * time.Second):
		return fmt.Errorf("python peer silent for 120s\n%s", p.stderrHead())
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
	p.stderr.Close()
}

// stderrHead is the first 64 KiB the child wrote to its stderr.
func (p *proc) stderrHead() string {
	b := make([]byte, 64<<10)
	n, _ := p.stderr.ReadAt(b, 0)
	return string(b[:n])
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
