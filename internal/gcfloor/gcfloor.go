package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// runtimeMinHeap is Go's minimum heap goal at GOGC=100 (the runtime's
// defaultHeapMinimum); it scales with the percent, so a percent above
// floor/runtimeMinHeap × 100 would put the goal above the floor whatever the
// live heap (4 MiB × 10,000 % is 400 MiB).
const runtimeMinHeap = 4 << 20

// maxPercent is the largest percent whose minimum goal stays within floor.
func maxPercent(floor uint64) uint64 { return floor * 100 / runtimeMinHeap }

// Percent is the GC percent for a heap whose last cycle found live bytes
// live and scan bytes to scan (live heap, goroutine stacks and globals: Go's
// goal is live + scan × percent/100): base (GOGC) where base's goal reaches
// floor; otherwise the smallest percent whose goal does, capped where Go's
// minimum goal (4 MiB × percent/100) would pass the floor: a process before
// its first cycle, or with a nearly empty heap, gets the floor as its goal. A
// negative base (GOGC=off) or a zero floor leaves base.
func Percent(live, scan, floor uint64, base int) int {
	if base < 0 || floor == 0 {
		return base
	}
	scan = max(scan, live)
	if scan == 0 {
		return max(base, int(maxPercent(floor)))
	}
	if live >= floor || live+scan/100*uint64(base)+scan%100*uint64(base)/100 >= floor {
		return base
	}
	// ceil((floor − live) × 100 / scan), without overflow for any floor a
	// process can hold.
	need := floor - live
	p := (need/scan)*100 + ((need%scan)*100+scan-1)/scan
	return max(base, int(min(p, maxPercent(floor))))
}

// Tuner applies Percent after every GC cycle.
type Tuner struct {
	floor uint64
	base  int
	// mu orders a cycle's tune against Stop, so that Stop's restored base
	// is the last percent set.
	mu      sync.Mutex
	stopped atomic.Bool
	// adjusted, if set, is called with each percent set (tests).
	adjusted func(live uint64, percent int)
	sample   []metrics.Sample
}

// Start sets the percent for the current live heap and re-sets it after
// every GC cycle, until Stop. The base is the GC percent in force now (the
// GOGC environment's, or 100). A zero floor or GOGC=off starts nothing and
// returns nil (Stop on nil is a no-op).
func Start(floor uint64) *Tuner {
	return start(floor, nil)
}

func start(floor uint64, adjusted func(uint64, int)) *Tuner {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	if floor == 0 || base < 0 {
		return nil
	}
	t := &Tuner{floor: floor, base: base, adjusted: adjusted,
		sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}}
	t.tune()
	t.arm()
	return t
}

// Stop restores the base percent; the hook armed for the next cycle ends
// there.
func (t *Tuner) Stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped.Swap(true) {
		return
	}
	debug.SetGCPercent(t.base)
}

func (t *Tuner) tune() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped.Load() {
		return
	}
	metrics.Read(t.sample)
	var v [3]uint64
	for i, s := range t.sample {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	live := v[0]
	p := Percent(live, live+v[1]+v[2], t.floor, t.base)
	debug.SetGCPercent(p)
	if t.adjusted != nil {
		t.adjusted(live, p)
	}
}

// sentinel is garbage from birth: its finalizer runs once a cycle has found
// it unreachable, that is after every GC cycle, and arms the next one.
type sentinel struct{ t *Tuner }

func (t *Tuner) arm() {
	s := &sentinel{t: t}
	runtime.SetFinalizer(s, func(s *sentinel) {
		if s.t.stopped.Load() {
			return
		}
		s.t.tune()
		s.t.arm()
	})
}
