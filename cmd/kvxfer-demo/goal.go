package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The end-to-end goal (docs/benchmarks.md, "Goals"): with a 0.5.22/0.5.23
// fleet and 20 % aborts, at least goalRoomsPerS, time-to-terminal p50 at most
// goalP50Millis at a load of at most goalLoad, and kvxferd at most
// goalCPUMicros of CPU per room over its whole life.
const (
	goalRoomsPerS = 10000
	goalP50Millis = 5.0
	goalCPUMicros = 40.0
	goalLoad      = 4.0
)

// loadAvg1 is the 1-minute load average (NaN-free: -1 when unreadable).
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// goalLine says, for one run, whether each part of the end-to-end goal was
// met; the p50 part counts only at a load of at most goalLoad (the worse of
// the loads at the start and the end), and the run must have been the goal's
// setting (fleet 0.5.22,0.5.23, 20 % aborts) for the line to say "met".
func goalLine(fleet string, abortShare, roomsPerS, p50Millis, cpuMicros, loadStart, loadEnd float64) string {
	load := max(loadStart, loadEnd)
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	setting := fleet == "0.5.22,0.5.23" && abortShare == 0.2
	p50 := mark(p50Millis <= goalP50Millis)
	if load > goalLoad {
		p50 = fmt.Sprintf("not judged: load %.2f > %.0f", load, goalLoad)
	}
	s := fmt.Sprintf("goal (≥ %d rooms/s, TTT p50 ≤ %.0f ms at load ≤ %.0f, kvxferd ≤ %.0f µs CPU/room): rooms/s %.0f %s; p50 %.2f ms %s; kvxferd %.0f µs %s; load %.2f–%.2f",
		goalRoomsPerS, goalP50Millis, goalLoad, goalCPUMicros,
		roomsPerS, mark(roomsPerS >= goalRoomsPerS), p50Millis, p50, cpuMicros, mark(cpuMicros <= goalCPUMicros), loadStart, loadEnd)
	if !setting {
		s += " (not the goal's setting: fleet 0.5.22,0.5.23 with -abort-share 0.2)"
	}
	return s
}
