package xfer_test

import (
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// A room that fails while its transfers wait for the pool's in-flight
// window has them withdrawn: they end (transfer_error) without a request
// posted or a byte written, so the room drains at once instead of after the
// writes ahead of it; the window then serves the next room as before.
func TestWithdrawEndsAFailedRoomsWaitingTransfersUnwritten(t *testing.T) {
	// One worker, a window of one request, and writes that complete only
	// when the test advances the fake clock: the first room's write holds
	// the window while the second room's chunks wait behind it.
	r := newRigOpts(t, rigOpts{latencyOnFake: true, actors: 1, maxInFlight: 1})
	r.pre.Agent.SetFault(r.dec[0].Agent.Name(), loopback.Fault{Latency: loopback.Fixed(30 * time.Millisecond)})
	first := &roomCase{id: 801, chunks: []int{1}, srcBase: 0, dstBase: 0, aux: 1, dummyB: true}
	r.start(first)
	until(t, "the first room's write in flight", func() bool { return r.pool.Stats().Requests > 0 })
	failed := &roomCase{id: 802, chunks: []int{1, 1}, srcBase: 4, dstBase: 4, aux: 2, dummyB: true}
	r.start(failed)
	until(t, "the second room's chunks queued", func() bool { return r.pool.Stats().Posted == 3 })
	barrier(t, r.pool)
	reqs := r.pool.Stats().Requests

	r.eng.Abort(failed.id)
	until(t, "the failed room's chunks withdrawn", func() bool { return r.pool.Stats().Withdrawn == 2 })
	st := r.pool.Stats()
	if st.Requests != reqs || st.InFlight != 1 || st.Failed != 2 {
		t.Fatalf("after the withdrawal: %+v, want no request posted since (%d), the first room's write alone in flight, 2 failed", st, reqs)
	}
	if rep := r.wait(failed.id, kv.StatusFailed); rep.Reason != kv.ReasonClientAbort {
		t.Fatalf("failed room: %v", rep.Reason)
	}

	r.passDueTimes("the first room's write")
	r.wait(first.id, kv.StatusSuccess)
	r.verify(first)
	next := &roomCase{id: 803, chunks: []int{2}, srcBase: 8, dstBase: 8, aux: 3, dummyB: true}
	r.start(next)
	until(t, "the next room's write posted", func() bool { return r.pool.Stats().Posted == 4 })
	r.passDueTimes("the next room's write")
	r.wait(next.id, kv.StatusSuccess)
	r.verify(next)
	if !r.dec[0].PagesZero([]int32{4, 5}) {
		t.Fatal("the failed room's withdrawn chunks wrote decode's pages")
	}
	if st := r.pool.Stats(); st.Withdrawn != 2 || st.Failed != 2 {
		t.Fatalf("at the end: %+v", st)
	}
}

// Withdrawing a room with nothing waiting (its transfers started, or none)
// changes nothing: its writes complete as posted.
func TestWithdrawLeavesStartedTransfers(t *testing.T) {
	r := newRigOpts(t, rigOpts{latencyOnFake: true, actors: 1})
	r.pre.Agent.SetFault(r.dec[0].Agent.Name(), loopback.Fault{Latency: loopback.Fixed(30 * time.Millisecond)})
	c := &roomCase{id: 811, chunks: []int{1, 1}, srcBase: 0, dstBase: 0, aux: 1, dummyB: true}
	r.start(c)
	until(t, "both chunks posted", func() bool { return r.pool.Stats().Posted == 2 })
	barrier(t, r.pool)
	r.pool.Withdraw(c.id, nil)
	r.pool.Withdraw(999, nil) // a room the pool never saw
	barrier(t, r.pool)
	if st := r.pool.Stats(); st.Withdrawn != 0 || st.InFlight != 2 {
		t.Fatalf("%+v: a withdrawal ended started transfers", st)
	}
	r.passDueTimes("the room's writes")
	r.wait(c.id, kv.StatusSuccess)
	r.verify(c)
}
