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

// parkOnHungRoom starts one room whose writes to decode 1 hang on a rig with
// one pool actor, and returns once that actor stopped polling: its polls so
// far, counted. No poll between two barriers means no tick was queued.
func parkOnHungRoom(t *testing.T, id uint64) (*rig, *countingAgent, *roomCase, int64) {
	t.Helper()
	var ag *countingAgent
	r := newRigOpts(t, rigOpts{actors: 1, wrap: func(a nixl.Agent) nixl.Agent { ag = &countingAgent{Agent: a}; return ag }})
	hung, last := startHung(t, r, id, &ag.polls)
	return r, ag, hung, last
}

// startHung starts room id, whose writes to decode 1 hang, on r, and
// returns once its pool actor stopped polling: its polls so far, counted in
// polls.
func startHung(t *testing.T, r *rig, id uint64, polls *atomic.Int64) (*roomCase, int64) {
	t.Helper()
	r.pre.Agent.SetFault(r.dec[1].Agent.Name(), loopback.Fault{Hang: true})
	hung := &roomCase{id: id, chunks: []int{1}, srcBase: 0, dstBase: 0, aux: 1}
	r.start(hung)
	until(t, "the hung room's writes posted", func() bool { return r.pool.Stats().Requests >= 4 })
	var last int64
	until(t, "the worker parked", func() bool {
		barrier(t, r.pool)
		last = polls.Load()
		barrier(t, r.pool)
		return polls.Load() == last
	})
	return hung, last
}

// A worker whose requests make no progress parks on the agent's wake-up: it
// stops polling (no timer below 1 ms, no polling at all while nothing
// changes), and a request that completes later is still seen.
func TestPoolParksOnWakeup(t *testing.T) {
	pace := fakePace(t)
	r, ag, hung, last := parkOnHungRoom(t, 701)
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
	r.healthyRoom(702)
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

// With no processor free a worker does not spin on requests that made no
// progress: it parks after its first empty poll (the spin is bounded by one
// poll, not spinTicks), and work that arrives later still completes.
func TestPoolParksAtOnceWithoutAFreeCore(t *testing.T) {
	fakePace(t)
	t.Cleanup(xfer.SetCoreFree(func() bool { return false }))
	r, _, hung, last := parkOnHungRoom(t, 721)
	// A spinning worker makes SpinTicks empty polls before it parks (19
	// polls in all here with the gate off). With no core free it parks after
	// its first empty poll; before that come its start and the polls that
	// saw the healthy decode's writes complete, whose number depends on
	// when those completions land, so the bound is the spin, not a count.
	if last >= xfer.SpinTicks {
		t.Fatalf("%d polls before parking with no core free; want fewer than a spin's %d", last, xfer.SpinTicks)
	}
	r.healthyRoom(722)
	r.abandon(hung.id)
}

// selfPollingAgent is a countingAgent that says it polls its own requests
// (nixl.SelfPoller; the loopback agent does wake its pollers when a request
// ends) and runs batches (nixl.Batcher), counting posts made inside a batch
// and on the agent itself.
type selfPollingAgent struct {
	countingAgent
	batches, batchPosts, loosePosts atomic.Int64
}

func (a *selfPollingAgent) PollsItself() bool { return true }

func (a *selfPollingAgent) Batch(f func(nixl.Requests)) error {
	a.batches.Add(1)
	f(batchOf{a})
	return nil
}

func (a *selfPollingAgent) Post(x nixl.XferID) (nixl.State, error) {
	a.loosePosts.Add(1)
	return a.countingAgent.Post(x)
}

// batchOf is what selfPollingAgent's batches hand out.
type batchOf struct{ a *selfPollingAgent }

func (b batchOf) Make(op nixl.Op, l nixl.ListID, li []int32, r nixl.ListID, ri []int32, n []byte) (nixl.XferID, error) {
	return b.a.Agent.Make(op, l, li, r, ri, n)
}

func (b batchOf) Create(op nixl.Op, lk nixl.MemKind, l []nixl.Desc, p string, rk nixl.MemKind, r []nixl.Desc, n []byte) (nixl.XferID, error) {
	return b.a.Agent.Create(op, lk, l, p, rk, r, n)
}

func (b batchOf) Post(x nixl.XferID) (nixl.State, error) {
	b.a.batchPosts.Add(1)
	return b.a.Agent.Post(x)
}

func (b batchOf) Poll(xs []nixl.XferID, out []nixl.Status) error {
	return b.a.countingAgent.Poll(xs, out)
}

func (b batchOf) Release(x nixl.XferID) error { return b.a.Agent.Release(x) }

// A worker over an agent that polls its own requests (libnixl: every call a
// hop onto its owner thread) posts each job's requests in one batch, and
// does not spin even with a processor free: it parks after its first poll
// that found nothing done, and the agent's wake-up brings the next.
func TestPoolParksAtOnceOnASelfPollingAgent(t *testing.T) {
	fakePace(t)
	t.Cleanup(xfer.SetCoreFree(func() bool { return true }))
	var ag *selfPollingAgent
	r := newRigOpts(t, rigOpts{actors: 1, wrap: func(a nixl.Agent) nixl.Agent {
		ag = &selfPollingAgent{countingAgent: countingAgent{Agent: a}}
		return ag
	}})
	hung, last := startHung(t, r, 731, &ag.polls)
	if last >= xfer.SpinTicks {
		t.Fatalf("%d polls before parking on a self-polling agent; want fewer than a spin's %d", last, xfer.SpinTicks)
	}
	r.healthyRoom(732)
	if n := ag.loosePosts.Load(); n != 0 {
		t.Fatalf("%d requests posted outside a batch", n)
	}
	if ag.batchPosts.Load() == 0 || ag.batches.Load() == 0 {
		t.Fatalf("no request posted in a batch (%d batches)", ag.batches.Load())
	}
	r.abandon(hung.id)
}

// healthyRoom runs room id, whose writes go to the healthy decode, to
// Success and checks its bytes.
func (r *rig) healthyRoom(id uint64) {
	ok := &roomCase{id: id, chunks: []int{2}, srcBase: 10, dstBase: 10, aux: 2, dummyB: true}
	r.start(ok)
	r.wait(ok.id, kv.StatusSuccess)
	r.verify(ok)
}
