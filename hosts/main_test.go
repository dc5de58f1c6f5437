package hosts

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// The two simulated hosts.
const (
	prefillIP = "192.0.2.1"
	decodeIP  = "192.0.2.2"
	// innerEnv carries the namespace prefix into the re-executed test binary
	// that runs inside the prefill namespace.
	innerEnv = "KVXFER_HOSTS_NS"
	skipEnv  = "KVXFER_HOSTS_SKIP"
)

var nsPrefix string // set inside the prefill namespace

func decodeNS() string { return nsPrefix + "d" }

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..")
}

// TestMain creates the two namespaces, re-runs the tests inside the prefill
// one, and removes the namespaces afterwards, whatever the outcome (also on
// SIGINT/SIGTERM). Without KVXFER_HOSTS=1 it only runs the tests, which skip.
func TestMain(m *testing.M) {
	if os.Getenv("KVXFER_HOSTS") != "1" {
		os.Exit(m.Run())
	}
	if p := os.Getenv(innerEnv); p != "" {
		nsPrefix = p
		os.Exit(m.Run())
	}
	prefix := fmt.Sprintf("kvxh%d", os.Getpid())
	scripts := filepath.Join(repoRoot(), "scripts")
	down := func() { _ = exec.Command(filepath.Join(scripts, "netns-down.sh"), prefix).Run() }
	out, err := exec.Command(filepath.Join(scripts, "netns-up.sh"), prefix).CombinedOutput()
	if err != nil {
		reason := strings.TrimSpace(string(out))
		if reason == "" {
			reason = err.Error()
		}
		fmt.Fprintf(os.Stderr, "hosts: cannot create the two namespaces: %s\n", reason)
		os.Setenv(skipEnv, "network namespaces cannot be created here: "+reason)
		os.Exit(m.Run()) // every test skips (or fails with KVXFER_REQUIRE_HOSTS=1) with the reason
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	cmd := exec.Command("ip", append([]string{"netns", "exec", prefix + "p", os.Args[0]}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), innerEnv+"="+prefix)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		down()
		fmt.Fprintln(os.Stderr, "hosts: starting the tests in the prefill namespace:", err)
		os.Exit(1)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	code := 0
	select {
	case err = <-done:
	case s := <-sig:
		_ = cmd.Process.Signal(s)
		err = <-done
	}
	if err != nil {
		code = 1
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() > 0 {
			code = ee.ExitCode()
		}
	}
	down()
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), prefix) {
		fmt.Fprintf(os.Stderr, "hosts: namespaces %sp/%sd still exist after teardown\n", prefix, prefix)
		code = 1
	}
	os.Exit(code)
}

// needHosts skips (or fails, with KVXFER_REQUIRE_HOSTS=1) outside the prefill namespace.
func needHosts(t *testing.T) {
	t.Helper()
	var reason string
	switch {
	case os.Getenv("KVXFER_HOSTS") != "1":
		reason = "two-host suite: set KVXFER_HOSTS=1 (make test-hosts)"
	case os.Getenv(skipEnv) != "":
		reason = os.Getenv(skipEnv)
	case nsPrefix == "":
		reason = "not inside the prefill namespace"
	default:
		return
	}
	if os.Getenv("KVXFER_REQUIRE_HOSTS") == "1" && os.Getenv("KVXFER_HOSTS") == "1" {
		t.Fatal("KVXFER_REQUIRE_HOSTS=1: " + reason)
	}
	t.Skip(reason)
}

// inDecode returns a command run in the decode namespace.
func inDecode(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", decodeNS(), name}, args...)...)
}

// setLink takes the veth pair down or up (from the decode side: carrier goes
// on both ends, as when a cable is pulled).
func setLink(t *testing.T, up bool) {
	t.Helper()
	state := "down"
	if up {
		state = "up"
	}
	if out, err := exec.Command("ip", "-n", decodeNS(), "link", "set", "veth-d", state).CombinedOutput(); err != nil {
		t.Fatalf("ip link set veth-d %s: %v %s", state, err, out)
	}
	if up {
		// The connected route comes back with the link; the default route
		// (auto-detection) was removed with it and is put back.
		_ = exec.Command("ip", "-n", decodeNS(), "route", "replace", "default", "dev", "veth-d").Run()
	}
}
