package telemetry

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"syscall"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// processStats is what /metrics reports about the process itself: the
// resources a hostile peer could make it hold. Values that could not be
// read are -1 and not served.
type processStats struct {
	goroutines, threads, fds, maxFDs, rss int64
}

// readProcess reads /proc/self (Linux); elsewhere only goroutines are known.
func readProcess() processStats {
	p := processStats{goroutines: int64(runtime.NumGoroutine()), threads: -1, fds: -1, maxFDs: -1, rss: -1}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		p.threads = statusField(b, "Threads:", 1)
		p.rss = statusField(b, "VmRSS:", 1024) // kB
	}
	if f, err := os.Open("/proc/self/fd"); err == nil {
		if names, err := f.Readdirnames(-1); err == nil {
			p.fds = int64(len(names)) - 1 // the descriptor reading the directory
		}
		f.Close()
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur <= 1<<62 {
		p.maxFDs = int64(rl.Cur)
	}
	return p
}

// statusField returns the number after name in /proc/self/status, times mul.
func statusField(b []byte, name string, mul int64) int64 {
	i := bytes.Index(b, []byte("\n"+name))
	if i < 0 {
		return -1
	}
	line := b[i+1+len(name):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	f := bytes.Fields(line)
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseInt(string(f[0]), 10, 64)
	if err != nil {
		return -1
	}
	return v * mul
}

// processMetrics reports the process gauges through gauge.
func processMetrics(gauge func(name, unit, desc string, pts ...metricdata.DataPoint[int64])) {
	p := readProcess()
	for _, g := range []struct {
		name, unit, desc string
		v                int64
	}{
		{"kvxfer_process_goroutines", "{goroutine}", "Goroutines in kvxferd.", p.goroutines},
		{"kvxfer_process_threads", "{thread}", "OS threads of the kvxferd process (Go's and libzmq's).", p.threads},
		{"kvxfer_process_open_fds", "{fd}", "Open file descriptors of the kvxferd process.", p.fds},
		{"kvxfer_process_max_fds", "{fd}", "The process's open-file limit (RLIMIT_NOFILE, soft).", p.maxFDs},
		{"kvxfer_process_resident_memory", "By", "Resident set size of the kvxferd process.", p.rss},
	} {
		if g.v >= 0 {
			gauge(g.name, g.unit, g.desc, metricdata.DataPoint[int64]{Attributes: noAttrs, Value: g.v})
		}
	}
}
