package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Attack F6 (docs/hostile.md): a kvxferd process held to 1,024 open files, with 2,000
// stalled-body connections held against each of its HTTP servers, still
// answers /health (bootstrap) and /healthz and /metrics (debug), and its fds
// stay under the limit.
//
// The stalled clients are all accepted (held, or closed by the connection
// guard) before the probes go out: the test waits for exactly the number of
// closes the guard must make, so no sleep decides the outcome.
//
// KVXFERD_BIN runs a prebuilt binary instead of building this one, and
// KVXFER_F6_REPORT=1 only reports what happened (for measuring a binary
// without the guard, which never reaches the wait's condition).
const (
	floodConns = 2000
	floodLimit = 1024
	// The guard's defaults at a 1,024 limit: a main pool of 1024/8 and a
	// reserve of 16, per server.
	floodHeld = floodLimit/8 + 16
)

// TestHelperKvxferdWithNofile is not a test: run by TestHTTPFloodAtFDLimit
// with KVXFER_HELPER_EXEC set, it lowers RLIMIT_NOFILE and execs kvxferd, so
// the daemon starts with the limit already in place (Go's start-up raises the
// soft limit only to the hard one, which is lowered too).
func TestHelperKvxferdWithNofile(t *testing.T) {
	bin := os.Getenv("KVXFER_HELPER_EXEC")
	if bin == "" {
		t.Skip("helper process only")
	}
	n, _ := strconv.ParseUint(os.Getenv("KVXFER_HELPER_NOFILE"), 10, 64)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: n}); err != nil {
		fmt.Fprintln(os.Stderr, "setrlimit:", err)
		os.Exit(3)
	}
	args := append([]string{bin}, strings.Fields(os.Getenv("KVXFER_HELPER_ARGS"))...)
	err := syscall.Exec(bin, args, os.Environ())
	fmt.Fprintln(os.Stderr, "exec:", err)
	os.Exit(3)
}

func buildKvxferd(t *testing.T) string {
	if bin := os.Getenv("KVXFERD_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "kvxferd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// stalled is a client that sent headers announcing a body and then one byte
// of it; closed is set once the server closes it.
type stalled struct {
	c      net.Conn
	closed atomic.Bool
}

func TestHTTPFloodAtFDLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kvxferd process and 4,000 connections")
	}
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("needs /proc")
	}
	report := os.Getenv("KVXFER_F6_REPORT") == "1"
	bin := buildKvxferd(t)
	dir, err := os.MkdirTemp("", "kvxf6")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^TestHelperKvxferdWithNofile$")
	cmd.Env = append(os.Environ(), "KVXFER_HELPER_EXEC="+bin, "KVXFER_HELPER_NOFILE="+strconv.Itoa(floodLimit),
		"KVXFER_HELPER_ARGS=-host 127.0.0.1 -disaggregation-bootstrap-port 0 -debug-addr 127.0.0.1:0 -nixl-backend loopback "+
			"-control ipc://"+filepath.Join(dir, "ctl.sock")+" "+os.Getenv("KVXFER_F6_ARGS"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	boot, debug := readAddrs(t, stderr)
	limits, _ := os.ReadFile(fmt.Sprintf("/proc/%d/limits", cmd.Process.Pid))
	if !regexp.MustCompile(`Max open files\s+1024\s+1024`).Match(limits) {
		t.Fatalf("kvxferd's limits:\n%s", limits)
	}

	var floods [2][]*stalled
	for i, addr := range []string{boot, debug} {
		for range floodConns {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				if report {
					continue
				}
				t.Fatalf("dial %d to %s: %v", len(floods[i]), addr, err)
			}
			defer c.Close()
			fmt.Fprintf(c, "PUT /route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
			s := &stalled{c: c}
			floods[i] = append(floods[i], s)
			go func() {
				_, _ = io.Copy(io.Discard, c)
				s.closed.Store(true)
			}()
		}
	}
	closedCount := func(i int) int {
		n := 0
		for _, s := range floods[i] {
			if s.closed.Load() {
				n++
			}
		}
		return n
	}
	if report {
		time.Sleep(2 * time.Second)
	} else {
		// Every stalled client accepted: all but the held ones closed.
		deadline := time.Now().Add(60 * time.Second) // a hang guard, not a condition
		for closedCount(0) < floodConns-floodHeld || closedCount(1) < floodConns-floodHeld {
			if time.Now().After(deadline) {
				t.Fatalf("after 60 s, %d and %d of %d stalled clients closed; want %d", closedCount(0), closedCount(1),
					floodConns, floodConns-floodHeld)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	fds := countFDs(cmd.Process.Pid)
	t.Logf("stalled clients: bootstrap %d dialled, %d closed by kvxferd; debug %d dialled, %d closed; kvxferd fds %d (limit %d)",
		len(floods[0]), closedCount(0), len(floods[1]), closedCount(1), fds, floodLimit)

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	probe := func(url string) (int, string, error) {
		resp, err := client.Get(url)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	code, body, err := probe("http://" + boot + "/health")
	t.Logf("bootstrap /health: %d %q %v", code, body, err)
	if !report && (err != nil || code != 200 || body != "OK") {
		t.Fatalf("/health with %d stalled connections at a %d fd limit: %d %q %v", floodConns, floodLimit, code, body, err)
	}
	code, body, err = probe("http://" + debug + "/healthz")
	t.Logf("debug /healthz: %d %q %v", code, strings.TrimSpace(body), err)
	if !report && (err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "not live")) {
		t.Fatalf("/healthz: %d %q %v", code, body, err)
	}
	code, body, err = probe("http://" + debug + "/metrics")
	m := regexp.MustCompile(`(?m)^kvxfer_process_open_fds\S* (\S+)$`).FindStringSubmatch(body)
	t.Logf("debug /metrics: %d %v, kvxfer_process_open_fds %v", code, err, m)
	if !report {
		if err != nil || code != 200 || m == nil {
			t.Fatalf("/metrics: %d %v %v", code, err, m)
		}
		if fds >= floodLimit-100 {
			t.Fatalf("kvxferd holds %d fds at a %d limit", fds, floodLimit)
		}
		if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
			t.Fatalf("kvxferd died: %v", err)
		}
	}
}

// readAddrs reads kvxferd's log until its start line and returns the
// bootstrap and debug addresses; the rest of the log is drained.
func readAddrs(t *testing.T, r io.Reader) (boot, debug string) {
	t.Helper()
	sc := bufio.NewScanner(r)
	re := regexp.MustCompile(`kvxferd started.* bootstrap=(\S+) debug=(\S+)`)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			go func() { _, _ = io.Copy(io.Discard, r) }()
			return m[1], m[2]
		}
	}
	t.Fatalf("kvxferd did not start:\n%s", strings.Join(lines, "\n"))
	return "", ""
}

func countFDs(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(es)
}
