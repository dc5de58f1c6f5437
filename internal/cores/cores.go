// Package cores tells a spinning loop whether the machine has a processor to
// spare, so that it spins only where spinning is free.
//
// A loop that spins instead of sleeping (the transfer pool waiting for a
// write due in microseconds, the shared-memory ring's consumer waiting for
// the scheduler's next record) buys latency with a core. Where a core is
// idle that is a good trade; where every core has a runnable task (the
// shared 2-core machine at load 8–12, a host whose scheduler and decodes keep
// every core busy) the spin takes the core from work — often this process's
// own — and CPU per room rises while throughput falls. The kernel's count of
// runnable tasks right now is the fourth field of /proc/loadavg
// ("running/total"); Free compares it with the processors this process may
// run on, reading the file at most once per Probe.Every. The kernel does not
// see this process's own goroutines that are ready but wait for a Go
// processor (every P busy, two of them spinning, say): Free also asks the Go
// runtime for that count (/sched/goroutines/runnable) and answers false while
// any wait, since a spin would hold a processor one of them needs.
package cores

import (
	"bytes"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Probe caches the answer. Read returns the runnable tasks now; Waiting, if
// set, this process's goroutines ready to run but waiting for a processor;
// Now is the clock that spaces the reads. The zero Probe is not usable: see
// New.
type Probe struct {
	Read    func() (int, error)
	Waiting func() int
	Now     func() time.Time
	CPUs    int
	Every   time.Duration

	at   atomic.Int64 // UnixNano of the last read; 0: never
	free atomic.Bool
	busy atomic.Bool // a read is in progress
}

// New is a probe of this machine and process: /proc/loadavg and the Go
// runtime's runnable goroutines, every 1 ms, runtime.NumCPU.
func New() *Probe {
	p := newMachine()
	p.Waiting = goWaiting
	return p
}

// newMachine is a probe of the kernel's count alone: /proc/loadavg, every
// 1 ms, runtime.NumCPU.
func newMachine() *Probe {
	return &Probe{Read: readLoadavg, Now: time.Now, CPUs: runtime.NumCPU(), Every: time.Millisecond}
}

// Default is the process's probe.
var Default = New()

// Free is Default.Free.
func Free() bool { return Default.Free() }

// Machine is a probe of the kernel's count alone, for a spin that does the
// work rather than wait for it: libnixl's owner, whose progress calls are
// what copy the bytes on shared memory, cma and tcp.
var Machine = newMachine()

// MachineFree is Machine.Free.
func MachineFree() bool { return Machine.Free() }

// Free reports whether no more tasks are runnable than there are processors
// (the caller, running, counts as one of them) and no goroutine of this
// process waits for a Go processor. Until the first read, and when the file
// cannot be read, the kernel's side answers true: spinning is what the loops
// did before they asked.
func (p *Probe) Free() bool {
	now := p.Now().UnixNano()
	last := p.at.Load()
	if last != 0 && now-last < int64(p.Every) {
		return p.free.Load()
	}
	if !p.busy.CompareAndSwap(false, true) {
		return p.free.Load() || last == 0
	}
	defer p.busy.Store(false)
	n, err := p.Read()
	free := err != nil || n <= p.CPUs
	if free && p.Waiting != nil {
		free = p.Waiting() == 0
	}
	p.free.Store(free)
	p.at.Store(now)
	return p.free.Load()
}

// readLoadavg parses the runnable count ("r" of "r/t") from /proc/loadavg.
// The file is opened once and read from its start each time (pread): the
// loops ask every millisecond, and an open and a close per read were two of
// its three system calls.
func readLoadavg() (int, error) {
	f, err := loadavg()
	if err != nil {
		return 0, err
	}
	var buf [128]byte
	n, err := f.ReadAt(buf[:], 0)
	if n == 0 && err != nil {
		return 0, err
	}
	return parseRunnable(buf[:n])
}

// loadavg is /proc/loadavg, opened at the first read and kept for the
// process's life.
var loadavg = sync.OnceValues(func() (*os.File, error) { return os.Open("/proc/loadavg") })

// parseRunnable reads the fourth field's numerator of a /proc/loadavg line.
func parseRunnable(b []byte) (int, error) {
	fields := bytes.Fields(b)
	if len(fields) < 4 {
		return 0, strconv.ErrSyntax
	}
	r, _, ok := bytes.Cut(fields[3], []byte("/"))
	if !ok {
		return 0, strconv.ErrSyntax
	}
	return strconv.Atoi(string(r))
}

// goWaiting is the Go runtime's count of goroutines ready to run but not
// running (its run queues; approximate, read under the scheduler's lock, about
// 50 ns).
func goWaiting() int {
	s := [1]metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}
	metrics.Read(s[:])
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0 // a runtime without the metric: the kernel's count decides
	}
	return int(s[0].Value.Uint64())
}
