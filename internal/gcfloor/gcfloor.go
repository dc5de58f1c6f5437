package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

// MaxPercent caps the percent a floor sets, so that a nearly empty heap (a
// process just started) does not ask for an absurd ratio.
const MaxPercent = 10_000

// Percent is the GC percent for a heap of live bytes: base (GOGC) where
// base's goal, live × (1 + base/100), reaches floor; otherwise the smallest
// percent whose goal does, capped at MaxPercent. A negative base (GOGC=off)
// or a zero floor leaves base.
func Percent(live, floor uint64, base int) int {
	if base < 0 || floor == 0 {
		return base
	}
	if live == 0 {
		return max(base, MaxPercent)
	}
	if live >= floor {
		return base
	}
	// ceil(floor × 100 / live) − 100, without overflow for any floor a
	// process can hold.
	p := (floor/live)*100 + ((floor%live)*100+live-1)/live - 100
	if p > MaxPercent {
		p = MaxPercent
	}
	return max(base, int(p))
}

// Tuner applies Percent after every GC cycle.
type Tuner struct {
	floor   uint64
	base    int
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
		sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	t.tune()
	t.arm()
	return t
}

// Stop restores the base percent; the hook armed for the next cycle ends
// there.
func (t *Tuner) Stop() {
	if t == nil || t.stopped.Swap(true) {
		return
	}
	debug.SetGCPercent(t.base)
}

func (t *Tuner) tune() {
	metrics.Read(t.sample)
	var live uint64
	if t.sample[0].Value.Kind() == metrics.KindUint64 {
		live = t.sample[0].Value.Uint64()
	}
	p := Percent(live, t.floor, t.base)
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
