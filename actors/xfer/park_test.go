package xfer_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// countingAgent counts Poll calls and passes the agent's wake-up and due
// times through (a plain embedding would hide them from the pool).
type countingAgent struct {
	nixl.Agent
	polls atomic.Int64
}

func (a *countingAgent) Poll(xs []nixl.XferID, out []nixl.Status) error {
	a.polls.Add(1)
	return a.Agent.Poll(xs, out)
}

func (a *countingAgent) OnProgress(wake func()) func() {
	return a.Agent.(nixl.Waker).OnProgress(wake)
}

func (a *countingAgent) Due() (time.Time, bool) { return a.Agent.(nixl.Dueer).Due() }

// until waits for cond, giving up after 20 s (a bound on a hang, not a
// decision: nothing the test checks depends on how long it took).
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testrig.Eventually(t, 20*time.Second, what, cond)
}

// barrier waits until every pool actor has handled what was queued to it.
func barrier(t *testing.T, p *xfer.Pool) {
	t.Helper()
	if err := p.Barrier(); err != nil {
		t.Fatalf("pool barrier: %v", err)
	}
}

// fakePace makes the clock that spaces a parked worker's polls a fake one for
// the test, so that a pacing timer shows as pending instead of firing.
func fakePace(t *testing.T) *clock.Fake {
	t.Helper()
	c := clock.NewFake(time.Unix(0, 0))
	t.Cleanup(xfer.SetPace(c)) // registered first: runs after the pool closed
	return c
}

// A worker whose requests make no progress parks on the agent's wake-up: it
// stops polling (no timer below 1 ms, no polling at all while nothing
// changes), and a request that completes later is still seen.
func TestPoolParksOnWakeup(t *testing.T) {
	pace := fakePace(t)
	var ag *countingAgent
	r := newRigOpts(t, rigOpts{actors: 1, wrap: func(a nixl.Agent) nixl.Agent { ag = &countingAgent{Agent: a}; return ag }})
	r.pre.Agent.SetFault(r.dec[1].Agent.Name(), loopback.Fault{Hang: true})
	hung := &roomCase{id: 701, chunks: []int{1}, srcBase: 0, dstBase: 0, aux: 1}
	r.start(hung)
	until(t, "the hung room's writes posted", func() bool { return r.pool.Stats().Requests >= 4 })
	// The spin ends after a bounded number of polls; then the count stays:
	// no poll between two barriers means no tick was queued (spinning).
	var last int64
	until(t, "the worker parked", func() bool {
		barrier(t, r.pool)
		last = ag.polls.Load()
		barrier(t, r.pool)
		return ag.polls.Load() == last
	})
	// Parked on the agent's wake-up alone: no pacing timer is armed, so
	// however long nothing changes, nothing polls.
	if n := pace.Pending(); n != 0 {
		t.Fatalf("a parked worker armed %d pacing timers with nothing in progress", n)
	}
	pace.Advance(time.Hour)
	barrier(t, r.pool)
	if n := ag.polls.Load(); n != last {
		t.Fatalf("a parked worker polled %d times with nothing in progress", n-last)
	}
	// Work for the healthy decode wakes it: the room completes.
	ok := &roomCase{id: 702, chunks: []int{2}, srcBase: 10, dstBase: 10, aux: 2, dummyB: true}
	r.start(ok)
	r.wait(ok.id, kv.StatusSuccess)
	r.verify(ok)
	r.abandon(hung.id)
}

// abandon fails rooms whose writes hang and lets their drain deadline pass
// on the fake clock, so they retire and the engine closes at once.
func (r *rig) abandon(ids ...uint64) {
	for _, id := range ids {
		r.eng.Abort(id)
	}
	r.eng.PollSync(ids, nil)
	r.clk.Advance(time.Minute)
	r.eng.PollSync(ids, nil)
}

// Quarantine is decided on the pool's clock alone: a hung request is not
// quarantined however long it hangs in wall time until the (fake) clock
// passes QuarantineAfter, and is at once when it does.
func TestQuarantineOnInjectedClock(t *testing.T) {
	pace := fakePace(t)
	r := newRigQuarantine(t, time.Minute)
	r.pre.Agent.SetFault(r.dec[1].Agent.Name(), loopback.Fault{Hang: true})
	c := &roomCase{id: 711, chunks: []int{1}, srcBase: 0, dstBase: 0, aux: 1}
	r.start(c)
	until(t, "decode 0's write done, decode 1's left in flight", func() bool {
		st := r.pool.Stats()
		return st.Posted == 2 && st.InFlight == 1
	})
	// Wall time passes (the pace clock, the only one the pool reads besides
	// its own), well past QuarantineAfter: no decision follows it.
	pace.Advance(time.Hour)
	barrier(t, r.pool)
	r.clk.Advance(59 * time.Second)
	r.eng.PollSync([]uint64{c.id}, nil)
	if st := r.pool.Stats(); st.Quarantined != 0 {
		t.Fatalf("quarantined before QuarantineAfter on the pool's clock: %+v", st)
	}
	r.clk.Advance(2 * time.Second)
	until(t, "the hung transfer quarantined", func() bool { return r.pool.Stats().Quarantined == 1 })
	if st := r.pool.Stats(); st.InFlight != 1 || st.Failed != 0 {
		t.Fatalf("quarantined transfer: pool %+v, want it still in flight (never released)", st)
	}
	r.abandon(c.id)
}
