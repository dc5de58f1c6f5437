package actors

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/clock"
)

type countedClock struct {
	*clock.Fake
	reads *atomic.Int64
}

func (c countedClock) Now() time.Time {
	c.reads.Add(1)
	return c.Fake.Now()
}

// StepClock.Since is one reading per step: of the step's clock, or
// of the observer's own clock when given; a new step reads again, and
// outside a step there is no step time.
func TestStepClockSince(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	eng := countedClock{clock.NewFake(base), new(atomic.Int64)}
	own := countedClock{clock.NewFake(base.Add(time.Hour)), new(atomic.Int64)}
	c := NewStepClock(eng)
	if _, in := c.Since(base, nil); in {
		t.Fatal("a step time outside a step")
	}
	c.Begin()
	if _, ok := c.Since0(); ok {
		t.Fatal("Since0 valid before the step's first Since")
	}
	eng.Advance(time.Second)
	d1, in := c.Since(base, nil)
	eng.Advance(time.Second)
	d2, _ := c.Since(base, nil)
	if !in || d1 != time.Second || d2 != time.Second || eng.reads.Load() != 1 {
		t.Fatalf("step: %v then %v (in %v) after %d readings; want 1s twice, one reading", d1, d2, in, eng.reads.Load())
	}
	if at := c.Now(); !at.Equal(base.Add(time.Second)) || eng.reads.Load() != 1 {
		t.Fatalf("Now %v after Since, %d readings: not the step's reading", at, eng.reads.Load())
	}
	if d, ok := c.Since0(); !ok || d != time.Second {
		t.Fatalf("Since0 %v, %v within the step, want 1s", d, ok)
	}
	c.End()
	if _, ok := c.Since0(); ok {
		t.Fatal("Since0 valid after the step")
	}
	c.Begin()
	if d, _ := c.Since(base, nil); d != 2*time.Second || eng.reads.Load() != 2 {
		t.Fatalf("next step: %v after %d readings, want 2s after 2", d, eng.reads.Load())
	}
	c.End()
	c.Begin()
	d1, _ = c.Since(base, own)
	d2, _ = c.Since(base, own)
	if d1 != time.Hour || d2 != time.Hour || own.reads.Load() != 1 || eng.reads.Load() != 2 {
		t.Fatalf("own clock: %v, %v; own read %d times, engine's %d", d1, d2, own.reads.Load(), eng.reads.Load())
	}
	c.End()
}
