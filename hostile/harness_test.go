package hostile

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
)

// hostile skips the test unless KVXFER_HOSTILE=1.
func hostile(t *testing.T) {
	t.Helper()
	if os.Getenv("KVXFER_HOSTILE") != "1" {
		t.Skip("hostile suite: set KVXFER_HOSTILE=1 (make test-hostile)")
	}
}

// binDir is where kvxferd, kvxfer-sched and kvxfer-decode are.
func binDir(t *testing.T) string {
	t.Helper()
	return testrig.BinDir(t, "make test-hostile", "kvxferd", "kvxfer-sched", "kvxfer-decode")
}

func freePort(t *testing.T) int { return testrig.FreePort(t, "127.0.0.1") }

// ---------------------------------------------------------------- kvxferd

type daemonOpts struct {
	args   []string // extra flags
	env    []string // extra environment
	nofile int      // RLIMIT_NOFILE (soft and hard) when > 0
}

// kvxferd is one daemon process under test.
type kvxferd struct {
	*testrig.Proc
	dir     string
	ctl     string // ipc:// control endpoint
	boot    string // bootstrap host:port
	debug   string // debug host:port
	zmqPort int
}

// defaultEnv keeps room deadlines short enough for a test run.
var defaultEnv = []string{
	"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=20", "KVXFER_WAITING_TIMEOUT=20",
	"KVXFER_TRANSFER_TIMEOUT=15", "KVXFER_DRAIN_TIMEOUT=3", "KVXFER_LINGER_TIMEOUT=30",
}

func startDaemon(t *testing.T, o daemonOpts) *kvxferd {
	t.Helper()
	bin := binDir(t)
	dir := t.TempDir()
	d := &kvxferd{dir: dir, ctl: "ipc://" + filepath.Join(dir, "ctl.sock")}
	bp, dp := freePort(t), freePort(t)
	d.zmqPort = freePort(t)
	d.boot, d.debug = "127.0.0.1:"+strconv.Itoa(bp), "127.0.0.1:"+strconv.Itoa(dp)
	args := []string{"-nixl-backend", "loopback", "-host", "127.0.0.1", "-control", d.ctl,
		"-disaggregation-bootstrap-port", strconv.Itoa(bp), "-debug-addr", d.debug,
		"-zmq-port", strconv.Itoa(d.zmqPort), "-log-level", "info"}
	args = append(args, o.args...)
	exe := filepath.Join(bin, "kvxferd")
	var cmd *exec.Cmd
	if o.nofile > 0 {
		// The shell sets both limits and execs kvxferd, so the pid is kvxferd's.
		cmd = exec.Command("/bin/sh", append([]string{"-c", `ulimit -n ` + strconv.Itoa(o.nofile) + ` && exec "$0" "$@"`, exe}, args...)...)
	} else {
		cmd = exec.Command(exe, args...)
	}
	cmd.Env = append(append(os.Environ(), defaultEnv...), o.env...)
	d.Proc = testrig.Start(t, "kvxferd", cmd, testrig.ProcOpts{Log: filepath.Join(dir, "kvxferd.log")})
	d.WaitReady(t, 20*time.Second, func() error {
		if err := testrig.FileExists(filepath.Join(dir, "ctl.sock"))(); err != nil {
			return fmt.Errorf("ctl %v", err)
		}
		if _, err := httpGet("http://"+d.debug+"/healthz", time.Second); err != nil {
			return fmt.Errorf("debug %v", err)
		}
		return nil
	})
	return d
}

// httpGet returns the status code of a GET (an error for a transport failure).
func httpGet(url string, timeout time.Duration) (int, error) {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	r, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	r.Body.Close()
	return r.StatusCode, nil
}

func httpBody(url string, timeout time.Duration) ([]byte, int, error) {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	r, err := c.Get(url)
	if err != nil {
		return nil, 0, err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	return b, r.StatusCode, err
}

// health checks /health (bootstrap) and /healthz (debug, live rank): nil when
// both answer 200 within timeout.
func (d *kvxferd) health(timeout time.Duration) error {
	if !d.Alive() {
		return fmt.Errorf("kvxferd exited: %s", d.ExitDesc())
	}
	if c, err := httpGet("http://"+d.boot+"/health", timeout); err != nil || c != 200 {
		return fmt.Errorf("/health: %d %v", c, err)
	}
	if c, err := httpGet("http://"+d.debug+"/healthz", timeout); err != nil || c != 200 {
		return fmt.Errorf("/healthz: %d %v", c, err)
	}
	return nil
}

// waitLive waits until /healthz answers 200 (the scheduler registered memory).
func (d *kvxferd) waitLive(timeout time.Duration) error {
	live := testrig.Until(timeout, func() bool {
		c, err := httpGet("http://"+d.debug+"/healthz", time.Second)
		return (err == nil && c == 200) || !d.Alive()
	})
	switch {
	case !d.Alive():
		return fmt.Errorf("kvxferd exited: %s", d.ExitDesc())
	case !live:
		return fmt.Errorf("not live after %s", timeout)
	}
	return nil
}

// counters reads /debug/rooms' counters and stats.
func (d *kvxferd) counters() (map[string]int64, map[string]any) {
	b, _, err := httpBody("http://"+d.debug+"/debug/rooms?limit=1", 5*time.Second)
	if err != nil {
		return nil, nil
	}
	var v struct {
		Counters map[string]int64 `json:"counters"`
		Stats    map[string]any   `json:"stats"`
	}
	json.Unmarshal(b, &v)
	return v.Counters, v.Stats
}

func (d *kvxferd) logSize() int64 {
	st, err := os.Stat(d.Log)
	if err != nil {
		return 0
	}
	return st.Size()
}

// logCount counts log lines containing s.
func (d *kvxferd) logCount(s string) int {
	f, err := os.Open(d.Log)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			n++
		}
	}
	return n
}

// ---------------------------------------------------------------- /proc

// procStats is one sample of a process's resources.
type procStats struct {
	RSSKiB  int64
	Threads int
	FDs     int
	Maps    int // mapped files (lines of /proc/pid/maps with a path under /dev/shm or a tmp dir)
}

func (p procStats) String() string {
	return fmt.Sprintf("RSS %.1f MiB, %d threads, %d fds", float64(p.RSSKiB)/1024, p.Threads, p.FDs)
}

func (p procStats) rssMiB() float64 { return float64(p.RSSKiB) / 1024 }

func readProc(pid int) (procStats, error) {
	var s procStats
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			s.RSSKiB, _ = strconv.ParseInt(f[1], 10, 64)
		case "Threads:":
			s.Threads, _ = strconv.Atoi(f[1])
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, err
	}
	s.FDs = len(ents)
	if m, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid)); err == nil {
		seen := map[string]bool{}
		for _, l := range strings.Split(string(m), "\n") {
			if i := strings.Index(l, " /"); i >= 0 {
				p := strings.TrimSpace(l[i:])
				if (strings.HasPrefix(p, "/dev/shm/") || strings.HasPrefix(p, os.TempDir())) && !seen[p] {
					seen[p] = true
					s.Maps++
				}
			}
		}
	}
	return s, nil
}

func (d *kvxferd) proc() procStats {
	s, _ := readProc(d.Pid())
	return s
}

// sampler records the peak of each figure while an attack runs.
type sampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	peak procStats
	last procStats
}

func (d *kvxferd) sample(every time.Duration) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			if p, err := readProc(d.Pid()); err == nil {
				s.mu.Lock()
				s.last = p
				s.peak.RSSKiB = max(s.peak.RSSKiB, p.RSSKiB)
				s.peak.Threads = max(s.peak.Threads, p.Threads)
				s.peak.FDs = max(s.peak.FDs, p.FDs)
				s.peak.Maps = max(s.peak.Maps, p.Maps)
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-time.After(every):
			}
		}
	}()
	return s
}

// end stops sampling and returns the peaks.
func (s *sampler) end() procStats {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

func (s *sampler) now() procStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// ---------------------------------------------------------------- canary

// canary is an ordinary 0644 file outside kvxferd's namespace: its hash,
// size and mtime must not change.
type canary struct {
	path  string
	size  int64
	sum   [32]byte
	mtime time.Time
	orig  []byte
}

func newCanary(t *testing.T, dir string, size int) *canary {
	t.Helper()
	b := make([]byte, size)
	rand.Read(b)
	f, err := os.CreateTemp(dir, "hostile-canary-")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(b)
	f.Close()
	os.Chmod(f.Name(), 0o644)
	// An mtime in the past, so that a write in the same clock tick shows.
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	os.Chtimes(f.Name(), old, old)
	t.Cleanup(func() { os.Remove(f.Name()) })
	return &canary{path: f.Name(), size: int64(size), sum: sha256.Sum256(b), mtime: old, orig: b}
}

// check returns "" when the file is unchanged, else what changed.
func (c *canary) check() string {
	st, err := os.Stat(c.path)
	if err != nil {
		return "stat: " + err.Error()
	}
	b, err := os.ReadFile(c.path)
	if err != nil {
		return "read: " + err.Error()
	}
	var why []string
	if st.Size() != c.size {
		why = append(why, fmt.Sprintf("size %d -> %d", c.size, st.Size()))
	}
	if !st.ModTime().Equal(c.mtime) {
		why = append(why, "mtime changed")
	}
	if sha256.Sum256(b) != c.sum {
		n := 0
		for i := range min(len(b), len(c.orig)) {
			if b[i] != c.orig[i] {
				n++
			}
		}
		why = append(why, fmt.Sprintf("%d bytes differ", n))
	}
	return strings.Join(why, ", ")
}

// ---------------------------------------------------------------- report

// row is one line of the figures table.
type row struct {
	Test, Attack, Bound, Before, Measured, Result string
}

var (
	reportMu sync.Mutex
	report   []row
)

// record adds a line to the table and logs it.
func record(t *testing.T, attack, bound, measured string, ok bool) {
	t.Helper()
	res := "pass"
	if !ok {
		res = "FAIL"
	}
	r := row{Test: t.Name(), Attack: attack, Bound: bound, Measured: measured, Result: res}
	reportMu.Lock()
	report = append(report, r)
	reportMu.Unlock()
	t.Logf("| %s | %s | bound: %s | measured: %s | %s |", r.Test, attack, bound, measured, res)
	if !ok {
		t.Errorf("%s: %s exceeds bound %s", attack, measured, bound)
	}
}

func TestMain(m *testing.M) {
	start := time.Now()
	code := m.Run()
	// The soak writes its own section; the table is the attacks'.
	report = slices.DeleteFunc(report, func(r row) bool { return r.Test == "TestSoak" })
	if len(report) > 0 {
		var buf bytes.Buffer
		fmt.Fprintf(&buf, "Run of %s (suite wall time %.0f s).\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), time.Since(start).Seconds())
		fmt.Fprintln(&buf, "| test | attack | bound | measured | result |")
		fmt.Fprintln(&buf, "|---|---|---|---|---|")
		for _, r := range report {
			fmt.Fprintf(&buf, "| %s | %s | %s | %s | %s |\n", r.Test, r.Attack, r.Bound, r.Measured, r.Result)
		}
		fmt.Println("\n== hostile suite figures ==")
		fmt.Print(buf.String())
		if p := os.Getenv("KVXFER_HOSTILE_DOC"); p != "" {
			section := os.Getenv("KVXFER_HOSTILE_SECTION")
			if section == "" {
				section = "hostile"
			}
			if err := writeSection(p, section, buf.String()); err != nil {
				fmt.Println("writing", p, ":", err)
			}
		}
	}
	os.Exit(code)
}

// writeSection replaces the text between <!-- name:begin --> and
// <!-- name:end --> in the markdown file at path (appending the markers when
// missing).
func writeSection(path, name, body string) error {
	if !filepath.IsAbs(path) {
		// Relative to the repository root (make runs from there; go test
		// runs in this package's directory).
		path = filepath.Join("..", path)
	}
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	begin, end := "<!-- "+name+":begin -->", "<!-- "+name+":end -->"
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		s = strings.TrimRight(s, "\n") + "\n\n" + begin + "\n" + end + "\n"
		i, j = strings.Index(s, begin), strings.Index(s, end)
	}
	s = s[:i+len(begin)] + "\n" + body + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}

func dialTCP(addr string, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", addr, timeout)
}

func newHTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout}
}

func httpPut(url, body string) (int, error) {
	return httpPutWith(&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}, url, body)
}

func httpPutWith(c *http.Client, url, body string) (int, error) {
	req, err := http.NewRequest(http.MethodPut, url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	r, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	r.Body.Close()
	return r.StatusCode, nil
}
