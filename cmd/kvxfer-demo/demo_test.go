package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemoAcrossProcesses builds kvxferd and both emulators and runs the
// multi-process demo on a small workload in both decode protocols: three OS
// processes that meet only over SGLang's protocol and the control API. The
// demo exits non-zero on a pinned room, a wrong byte, held pages, or a process
// that did not exit cleanly.
func TestDemoAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs four binaries")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/kvxferd", "./cmd/kvxfer-sched", "./cmd/kvxfer-decode", "./cmd/kvxfer-demo")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, proto := range []string{"ack", "baseline"} {
		t.Run(proto, func(t *testing.T) {
			cmd := exec.Command(filepath.Join(bin, "kvxfer-demo"), "-rooms", "400", "-concurrency", "32", "-decode-protocol", proto)
			cmd.Env = os.Environ()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("demo failed: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "OK: no room pinned") || !strings.Contains(string(out), "wrong bytes 0") {
				t.Fatalf("demo output lacks its verdict:\n%s", out)
			}
		})
	}
}
