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

// TestGCFloorFlag: -gc-floor-mib out of range is an error, and a run that
// ends leaves the GC percent as it found it (the floor's tuner stopped).
func TestGCFloorFlag(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, v := range []string{"-1", "1048577"} {
		if err := runWithOutput([]string{"-gc-floor-mib", v}, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), "-gc-floor-mib") {
			t.Fatalf("-gc-floor-mib %s: err = %v, want out of range", v, err)
		}
	}
	before := debug.SetGCPercent(100)
	debug.SetGCPercent(before)
	if err := runWithOutput([]string{"-gc-floor-mib", "64"}, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), "-nixl-backend") {
		t.Fatalf("err = %v, want the missing -nixl-backend", err)
	}
	if after := debug.SetGCPercent(before); after != before {
		t.Fatalf("GC percent after the run %d, want %d as before", after, before)
	}
}
