package xfer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// A client abort that lands after the last chunk was posted but before its
// writes completed: with completion held, the bytes land but decode is never
// told the room succeeded, so both sides agree it failed (invariant 10).
// Without holding, SGLang's behaviour, decode completes a room prefill failed.
func TestAbortAfterLastChunkNeverCompletesDecode(t *testing.T) {
	for _, hold := range []bool{true, false} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			// The writes' latency is on the fake clock: they complete only
			// when the test advances it, after the abort (no race with wall
			// time).
			r := newRigOpts(t, rigOpts{hold: hold, latencyOnFake: true})
			r.pre.Agent.SetFault(r.dec[0].Agent.Name(), loopback.Fault{Latency: loopback.Fixed(30 * time.Millisecond)})
			c := &roomCase{id: 501, chunks: []int{2, 1}, srcBase: 0, dstBase: 10, aux: 1, dummyB: true}
			r.start(c)
			until(t, "both chunks posted and in flight", func() bool {
				st := r.pool.Stats()
				return st.Posted == 2 && st.InFlight == 2
			})
			r.eng.Abort(c.id)
			if rep := r.wait(c.id, kv.StatusFailed); rep.Reason != kv.ReasonClientAbort {
				t.Fatalf("reason %v", rep.Reason)
			}
			r.clk.Advance(30 * time.Millisecond)
			r.passDueTimes("the aborted room's writes")
			// A later room to the same decode completes: every notification
			// of the aborted one has been delivered by then.
			ok := &roomCase{id: 502, chunks: []int{1}, srcBase: 5, dstBase: 30, aux: 2, dummyB: true}
			r.start(ok)
			until(t, "the later room's write posted", func() bool { return r.pool.Stats().Posted == 3 })
			r.passDueTimes("the later room's write")
			r.wait(ok.id, kv.StatusSuccess)
			r.verify(ok)
			notifs, _ := r.dec[0].Agent.Notifs(nil)
			for _, n := range notifs {
				r.checks[0].Feed(n.Msg)
			}
			if done := r.checks[0].Done(c.id); done == hold {
				t.Fatalf("decode completed the aborted room: %v (hold=%v)", done, hold)
			}
		})
	}
}

// passDueTimes advances the fake clock in 30 ms steps until no transfer is
// in flight: a request the pool posts after a step (a chunk's later
// requests) is due 30 ms after that step.
func (r *rig) passDueTimes(what string) {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for r.pool.Stats().InFlight != 0 {
		if time.Now().After(deadline) {
			r.t.Fatalf("never completed: %s (pool %+v)", what, r.pool.Stats())
		}
		r.clk.Advance(30 * time.Millisecond)
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkRoomCompletion is the cost of holding completion notifications
// back: rooms of 2 chunks × 4 pages, 64 at a time, through the engine, the
// pool and loopback NIXL until decode's completion rule holds for each.
func BenchmarkRoomCompletion(b *testing.B) {
	for _, hold := range []bool{false, true} {
		b.Run(fmt.Sprintf("hold=%v", hold), func(b *testing.B) {
			r := newRigWith(b, 0, hold)
			const batch = 64
			id := uint64(1)
			b.ResetTimer()
			for done := 0; done < b.N; done += batch {
				var cs []*roomCase
				for i := range min(batch, b.N-done) {
					c := &roomCase{id: id, chunks: []int{4, 4}, srcBase: (i * 8) % 200, dstBase: (i * 8) % 200, aux: i % 32, dummyB: true}
					id++
					r.start(c)
					cs = append(cs, c)
				}
				for _, c := range cs {
					r.wait(c.id, kv.StatusSuccess)
				}
				for _, c := range cs {
					r.awaitDecode(c)
				}
			}
		})
	}
}
