package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/daemon"
	"github.com/kvxfer/kvxfer/emul/decode"
	"github.com/kvxfer/kvxfer/emul/sched"
	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
)

// TestRealNIXLMode: kvxfer-decode -nixl-backend nixl against a kvxferd on
// the real NIXL backend (UCX over TCP and shared memory here; across hosts
// in the two-host suite, docs/hosts.md). A loopback decode could not be
// loaded by a libnixl kvxferd at all, so every room succeeding, bytes
// verified, shows decode's memory is registered with the real library.
func TestRealNIXLMode(t *testing.T) {
	if os.Getenv("UCX_TLS") == "" {
		t.Setenv("UCX_TLS", "tcp,self,sm")
	}
	if os.Getenv("KVXFER_LIBNIXL") == "" && os.Getenv("KVXFER_NIXL_PYTHON") == "" {
		if _, err := os.Stat("/opt/kvxfer-nixl/bin/python"); err == nil {
			t.Setenv("KVXFER_NIXL_PYTHON", "/opt/kvxfer-nixl/bin/python")
		}
	}
	if _, err := libnixl.Find(""); err != nil {
		if os.Getenv("KVXFER_REQUIRE_SGLANG") == "1" {
			t.Fatalf("NIXL missing (scripts/install-nixl.sh): %v", err)
		}
		t.Skipf("NIXL not available (scripts/install-nixl.sh): %v", err)
	}
	dir, err := os.MkdirTemp("", "kvdn") // ipc paths are limited to 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	d, err := daemon.Start(daemon.Config{HostIP: "127.0.0.1", ServeBootstrap: true, KVCacheDtype: "auto",
		ControlEndpoint: "ipc://" + filepath.Join(dir, "ctl.sock"),
		NewAgent: func(name string) (daemon.Agent, error) {
			a, err := libnixl.New(name, libnixl.Options{})
			if err != nil {
				return nil, err
			}
			return daemon.WithFileMapping(a), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	}()
	const rooms = 60
	wl := workload.Default(1)
	wl.AbortShare = 0
	type schedResult struct {
		sum sched.Summary
		err error
	}
	done := make(chan schedResult, 1)
	go func() {
		_, sum, err := sched.Run(sched.Config{Control: d.ControlEndpoint(), Workload: wl, Rooms: rooms,
			Concurrency: 8, Grace: 60 * time.Second, Shape: decode.DefaultConfig().Shape})
		done <- schedResult{sum, err}
	}()
	js := filepath.Join(t.TempDir(), "decode.json")
	var out strings.Builder
	err = run([]string{"-nixl-backend", "nixl", "-bootstrap", d.BootstrapAddr(), "-rooms", fmt.Sprint(rooms),
		"-concurrency", "8", "-abort-share", "0", "-quiet", "-json", js, "-topology-retry", "10ms", "-topology-attempts", "1000"},
		func(string) string { return "" }, &out)
	if err != nil {
		t.Fatalf("kvxfer-decode -nixl-backend nixl: %v\n%s", err, out.String())
	}
	sr := <-done
	if sr.err != nil || sr.sum.Pinned != 0 {
		t.Fatalf("scheduler: %v, %d pinned", sr.err, sr.sum.Pinned)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var s decode.Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if s.Rooms != rooms || s.Outcomes["success"] != rooms || s.BytesVerified == 0 || s.WrongBytes != 0 {
		t.Fatalf("decode: %d rooms, outcomes %v, %d bytes verified, %d wrong", s.Rooms, s.Outcomes, s.BytesVerified, s.WrongBytes)
	}
}
