package main

import (
	"io"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestProcsWith(t *testing.T) {
	for _, tc := range []struct {
		base, spare int
		envSet      bool
		want        int
	}{
		{2, 1, false, 3},
		{2, 0, false, 2},
		{16, 1, false, 17},
		{2, 1, true, 2}, // the operator's GOMAXPROCS wins
		{4, 3, true, 4},
	} {
		if got := procsWith(tc.base, tc.spare, tc.envSet); got != tc.want {
			t.Errorf("procsWith(%d, %d, %v) = %d, want %d", tc.base, tc.spare, tc.envSet, got, tc.want)
		}
	}
}

// TestSpareProcsApplied: kvxferd sets GOMAXPROCS from -spare-procs as soon as
// its flags parse (before anything that can fail), from the runtime's own
// choice rather than the current value, so starting twice does not add twice;
// out of range is an error.
func TestSpareProcsApplied(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	noEnv := func(string) string { return "" }
	for range 2 {
		// No -nixl-backend: run stops after the flags, with GOMAXPROCS set.
		if err := runWithOutput([]string{"-spare-procs", "2"}, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), "-nixl-backend") {
			t.Fatalf("err = %v, want the missing -nixl-backend", err)
		}
		if got := runtime.GOMAXPROCS(0); got != baseProcs+2 {
			t.Fatalf("GOMAXPROCS = %d, want %d", got, baseProcs+2)
		}
	}
	env := func(k string) string {
		if k == "GOMAXPROCS" {
			return "7"
		}
		return ""
	}
	if err := runWithOutput([]string{"-spare-procs", "2"}, env, io.Discard); err == nil {
		t.Fatal("want the missing -nixl-backend")
	}
	if got := runtime.GOMAXPROCS(0); got != baseProcs {
		t.Fatalf("with GOMAXPROCS set: %d, want the runtime's %d", got, baseProcs)
	}
	if err := runWithOutput([]string{"-spare-procs", "-1"}, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), "-spare-procs") {
		t.Fatalf("err = %v, want -spare-procs out of range", err)
	}
}

// TestGCPercentApplied: kvxferd sets Go's GC percent from -gc-percent (default
// defaultGCPercent, or KVXFER_GC_PERCENT) as soon as its flags parse, unless
// GOGC is set; out of range is an error.
func TestGCPercentApplied(t *testing.T) {
	orig := debug.SetGCPercent(100)
	defer debug.SetGCPercent(orig)
	current := func() int {
		p := debug.SetGCPercent(100)
		debug.SetGCPercent(p)
		return p
	}
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, tc := range []struct {
		args []string
		env  func(string) string
		want int
	}{
		{nil, env(), defaultGCPercent},
		{[]string{"-gc-percent", "150"}, env(), 150},
		{nil, env("KVXFER_GC_PERCENT", "250"), 250},
		{[]string{"-gc-percent", "300"}, env("KVXFER_GC_PERCENT", "250"), 300},
		{[]string{"-gc-percent", "300"}, env("GOGC", "50"), 100}, // the operator's GOGC wins: left alone
	} {
		debug.SetGCPercent(100)
		// No -nixl-backend: run stops after the flags, with the GC percent set.
		if err := runWithOutput(tc.args, tc.env, io.Discard); err == nil || !strings.Contains(err.Error(), "-nixl-backend") {
			t.Fatalf("%v: err = %v, want the missing -nixl-backend", tc.args, err)
		}
		if got := current(); got != tc.want {
			t.Errorf("%v: GC percent %d, want %d", tc.args, got, tc.want)
		}
	}
	if err := runWithOutput([]string{"-gc-percent", "0"}, env(), io.Discard); err == nil || !strings.Contains(err.Error(), "-gc-percent") {
		t.Fatalf("err = %v, want -gc-percent out of range", err)
	}
}
