package telemetry

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/kv"
)

// slowPost is a transfer layer whose Post takes 3 ms of the fake clock and
// completes the write inside Post.
type slowPost struct{ clk *clock.Fake }

func (s slowPost) Post(_ kv.Transfer, done kv.DoneFunc) {
	s.clk.Advance(3 * time.Millisecond)
	done(kv.ReasonNone, nil)
}

// readyToSend opens room id, gives it one transfer info for 2 pages and
// inits it: its next Send completes it.
func readyToSend(eng *actors.Engine, id uint64) {
	eng.Open(id)
	eng.TransferInfo(id, info("a", 2, 1))
	eng.Init(id, 2, 0)
	eng.PollSync([]uint64{id}, nil)
}

// TestStepSharesOneClockReading: the callbacks of one room step (a Send:
// the post, the write completing inside Post, the status changes) share the
// clock reading taken at the step's first callback, although the clock moved
// during the step; the next step (Clear) reads the clock again.
func TestStepSharesOneClockReading(t *testing.T) {
	clk := clock.NewFake(epoch)
	exp := tracetest.NewInMemoryExporter()
	obs, err := New(Config{Exporter: exp, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := actors.New(actors.Config{Clock: clk, Transfers: slowPost{clk}, Observer: obs, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	const id = 77
	readyToSend(eng, id)
	clk.Advance(10 * time.Millisecond)
	eng.Send(id, []int32{0, 1}, nil) // posted at +10 ms; the clock reads +13 ms when it completes
	if r := eng.PollSync([]uint64{id}, nil)[0]; r.Status != kv.StatusSuccess {
		t.Fatalf("room %v/%v, want Success", r.Status, r.Reason)
	}
	eng.Clear(id) // at +13 ms
	eng.PollSync([]uint64{id}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := obs.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var roomSeen, xferSeen bool
	for _, s := range exp.GetSpans() {
		switch s.Name {
		case RoomSpan:
			roomSeen = true
			if got := s.EndTime.Sub(epoch); got != 13*time.Millisecond {
				t.Errorf("room span ends at +%v, want +13ms (Clear's own step)", got)
			}
			for _, e := range s.Events[1:] { // after WaitingForInput (Init, at +0)
				if got := e.Time.Sub(epoch); got != 10*time.Millisecond {
					t.Errorf("status event %v at +%v, want +10ms (the Send's step)", e.Attributes, got)
				}
			}
		case TransferSpan:
			xferSeen = true
			if s.StartTime.Sub(epoch) != 10*time.Millisecond || !s.EndTime.Equal(s.StartTime) {
				t.Errorf("transfer span +%v..+%v, want +10ms..+10ms", s.StartTime.Sub(epoch), s.EndTime.Sub(epoch))
			}
		}
	}
	if !roomSeen || !xferSeen {
		t.Fatalf("spans %v", exp.GetSpans())
	}
	if err := eng.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := obs.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRecordClockOutsideStep: a record reads the clock afresh for each
// callback outside a step, once per step inside one, and again in the next
// step.
func TestRecordClockOutsideStep(t *testing.T) {
	clk := clock.NewFake(epoch)
	obs, err := New(Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	r := obs.created(1).(*roomRec)
	at := func() time.Duration { return time.Duration(r.now()) }
	clk.Advance(time.Millisecond)
	if at() != time.Millisecond {
		t.Fatalf("unbound: %v", at())
	}
	steps := actors.NewStepClock(clk)
	r.BindSteps(steps)
	clk.Advance(time.Millisecond)
	if at() != 2*time.Millisecond {
		t.Fatalf("outside a step: %v", at())
	}
	steps.Begin()
	clk.Advance(time.Millisecond)
	first := at()
	clk.Advance(time.Millisecond)
	if first != 3*time.Millisecond || at() != first {
		t.Fatalf("in a step: %v then %v, want 3ms twice", first, at())
	}
	steps.End()
	if at() != 4*time.Millisecond {
		t.Fatalf("after the step: %v, want 4ms", at())
	}
	steps.Begin()
	clk.Advance(time.Millisecond)
	if at() != 5*time.Millisecond {
		t.Fatalf("next step: %v, want 5ms", at())
	}
	steps.End()
}

// countingClock is a fake clock that counts its readings.
type countingClock struct {
	*clock.Fake
	reads *atomic.Int64
}

func (c countingClock) Now() time.Time {
	c.reads.Add(1)
	return c.Fake.Now()
}

// TestStepReadsTheClockOnce: engine and Observer on one clock read it once
// for a whole Send step — the deadline the room arms, the post, the write
// completing inside Post, the status changes; with the engine on another
// clock, the record reads the Observer's own clock and not the engine's.
func TestStepReadsTheClockOnce(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "one-clock", false: "two-clocks"}[shared], func(t *testing.T) {
			engClk := countingClock{clock.NewFake(epoch), new(atomic.Int64)}
			obsClk := engClk
			if !shared {
				obsClk = countingClock{clock.NewFake(epoch), new(atomic.Int64)}
			}
			exp := tracetest.NewInMemoryExporter()
			obs, err := New(Config{Exporter: exp, Clock: obsClk})
			if err != nil {
				t.Fatal(err)
			}
			eng, err := actors.New(actors.Config{Clock: engClk, Transfers: &manualXfers{auto: true}, Observer: obs, Shards: 1})
			if err != nil {
				t.Fatal(err)
			}
			const id = 78
			readyToSend(eng, id)
			engBefore, obsBefore := engClk.reads.Load(), obsClk.reads.Load()
			eng.Send(id, []int32{0, 1}, nil)
			if r := eng.PollSync([]uint64{id}, nil)[0]; r.Status != kv.StatusSuccess {
				t.Fatalf("room %v/%v, want Success", r.Status, r.Reason)
			}
			engReads, obsReads := engClk.reads.Load()-engBefore, obsClk.reads.Load()-obsBefore
			if shared && engReads != 1 {
				t.Errorf("one clock: %d readings for the Send step, want 1", engReads)
			}
			if !shared && (engReads != 1 || obsReads != 1) {
				t.Errorf("two clocks: engine read %d times, Observer %d, want 1 and 1", engReads, obsReads)
			}
			// The Clear step: the record's retirement and the tombstone's
			// TTL (kept by the shard) share the step's reading.
			engBefore, obsBefore = engClk.reads.Load(), obsClk.reads.Load()
			eng.Clear(id)
			testrig.Eventually(t, 10*time.Second, "the room retired to a tombstone", func() bool { return eng.Live() == actors.LiveRooms{} })
			engReads, obsReads = engClk.reads.Load()-engBefore, obsClk.reads.Load()-obsBefore
			if shared && engReads != 1 {
				t.Errorf("one clock: %d readings for the Clear step, want 1", engReads)
			}
			if !shared && (engReads != 1 || obsReads != 1) {
				t.Errorf("two clocks, Clear: engine read %d times, Observer %d, want 1 and 1", engReads, obsReads)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := eng.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if err := obs.Close(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
