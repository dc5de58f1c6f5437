package dict

import (
	"testing"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// One test per rule of spec §7, each against both variants, so the comparison
// with the actor engine is against upstream as it is (and against its best
// repair), not against a straw man.

func TestRule01UpdateStatus(t *testing.T) {
	type step struct {
		s    kv.Status
		w    writer
		want kv.Status
		ok   bool // present after the step
	}
	cases := []struct {
		name     string
		v        Variant
		nonstick bool
		steps    []step
	}{
		{"upstream/absent-Failed-is-a-no-op", Upstream, false, []step{{kv.StatusFailed, byBootstrap, 0, false}}},
		{"upstream/absent-inserts-from-any-writer", Upstream, false, []step{{kv.StatusTransferring, byWorker, kv.StatusTransferring, true}}},
		{"upstream/max-merge", Upstream, false, []step{
			{kv.StatusWaitingForInput, byBootstrap, kv.StatusWaitingForInput, true},
			{kv.StatusBootstrapping, bySender, kv.StatusWaitingForInput, true},
			{kv.StatusTransferring, byWorker, kv.StatusTransferring, true}}},
		{"upstream/Failed-sticky", Upstream, false, []step{
			{kv.StatusTransferring, byWorker, kv.StatusTransferring, true},
			{kv.StatusFailed, bySender, kv.StatusFailed, true},
			{kv.StatusSuccess, byWorker, kv.StatusFailed, true}}},
		{"upstream/Success-then-Failed-fails", Upstream, false, []step{
			{kv.StatusSuccess, byWorker, kv.StatusSuccess, true},
			{kv.StatusFailed, bySender, kv.StatusFailed, true}}},
		{"upstream/pre-30352-Failed-resurrects", Upstream, true, []step{
			{kv.StatusTransferring, byWorker, kv.StatusTransferring, true},
			{kv.StatusFailed, bySender, kv.StatusFailed, true},
			{kv.StatusTransferring, byWorker, kv.StatusTransferring, true}}},
		{"fixed/only-the-sender-inserts", Fixed, false, []step{
			{kv.StatusWaitingForInput, byBootstrap, 0, false},
			{kv.StatusSuccess, byWorker, 0, false},
			{kv.StatusBootstrapping, bySender, kv.StatusBootstrapping, true}}},
		{"fixed/Success-sticky", Fixed, false, []step{
			{kv.StatusBootstrapping, bySender, kv.StatusBootstrapping, true},
			{kv.StatusSuccess, byWorker, kv.StatusSuccess, true},
			{kv.StatusFailed, bySender, kv.StatusSuccess, true}}},
		{"fixed/Failed-sticky", Fixed, false, []step{
			{kv.StatusBootstrapping, bySender, kv.StatusBootstrapping, true},
			{kv.StatusFailed, byBootstrap, kv.StatusFailed, true},
			{kv.StatusTransferring, byWorker, kv.StatusFailed, true}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, c.v, func(cfg *Config) { cfg.NonStickyFailed = c.nonstick })
			for i, s := range c.steps {
				h.e.update(1, s.s, s.w)
				got, ok := h.e.status.get(1)
				if ok != s.ok || (ok && got != s.want) {
					t.Fatalf("step %d update(%v): got %v present=%v, want %v present=%v", i, s.s, got, ok, s.want, s.ok)
				}
			}
		})
	}
}

func TestRule02CheckStatusDefault(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		r := h.poll(42) // no sender, no entry
		if h.e.fixed {
			if r.Status != kv.StatusFailed || r.Reason != kv.ReasonInvalidRequest {
				t.Fatalf("fixed: unknown room polls %+v, want Failed/invalid_request", r)
			}
			return
		}
		if r.Status != kv.StatusWaitingForInput || h.e.check(42) != kv.StatusWaitingForInput {
			t.Fatalf("upstream: unknown room polls %+v, want the WaitingForInput default", r)
		}
	})
}

func TestRule03SenderCreate(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		h.e.Open(1)
		h.want(1, kv.StatusBootstrapping)
		// Decode faster than prefill: every info before the sender.
		h.e.TransferInfo(2, ti("a", epA, 1, 1))
		h.e.SettleBootstrap()
		st, ok := h.e.status.get(2)
		if h.e.fixed == ok {
			t.Fatalf("before the sender: status %v present=%v (upstream inserts, fixed does not)", st, ok)
		}
		h.e.Open(2)
		h.want(2, kv.StatusWaitingForInput) // upstream: max(WFI, Bootstrapping); fixed: Open promotes
	})
}

func TestRule04RegistrationFirstWins(t *testing.T) {
	for _, v := range []Variant{Upstream, Fixed} {
		t.Run(v.String(), func(t *testing.T) {
			h := newHarness(t, v, func(c *Config) { c.RequireRegistration = true })
			h.e.Register("a")
			h.e.Register("a")
			h.e.SettleBootstrap()
			if n := h.e.peers.len(); n != 1 {
				t.Fatalf("%d peers after a duplicate registration", n)
			}
			h.e.Open(1)
			h.e.TransferInfo(1, ti("a", epA, 1, 1))
			h.e.Open(2)
			h.e.TransferInfo(2, ti("b", epB, 1, 1)) // never registered
			h.e.SettleBootstrap()
			for _, id := range []uint64{1, 2} {
				h.e.Init(id, 1, 0)
				h.e.Send(id, []int32{7}, nil)
			}
			h.e.SettleWorkers()
			h.want(1, kv.StatusSuccess)
			if r := h.want(2, kv.StatusFailed); r.Reason != kv.ReasonInvalidRequest {
				t.Fatalf("unregistered agent: reason %v", r.Reason)
			}
			if len(h.g.Posts(2)) != 0 {
				t.Fatal("a write went to an unregistered agent")
			}
		})
	}
}

func TestRule05TransferInfo(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		h.e.Open(1)
		a, b := ti("a", epA, 2, 2), ti("b", epB, 2, 2)
		a.PrefixLen, b.PrefixLen = 16, 32
		h.e.TransferInfo(1, a)
		h.e.SettleBootstrap()
		h.want(1, kv.StatusBootstrapping)
		h.e.TransferInfo(1, b)
		h.e.SettleBootstrap()
		if r := h.want(1, kv.StatusWaitingForInput); r.PrefixLen != 16 {
			t.Fatalf("prefix length %d, want the first info's 16", r.PrefixLen)
		}
		h.e.Init(1, 1, 0)
		h.e.Send(1, []int32{5}, nil)
		h.e.SettleWorkers()
		h.want(1, kv.StatusSuccess)
		h.e.Clear(1)
		// A late info for the cleared room.
		h.e.TransferInfo(1, ti("a", epA, 1, 1))
		h.e.SettleBootstrap()
		l := h.leaks()
		if h.e.fixed {
			if l.Total() != 0 {
				t.Fatalf("fixed: a late info left %+v", l)
			}
			return
		}
		if l.RequestStatus != 1 || l.TransferInfos != 1 || l.PrefixLen != 1 || h.e.check(1) != kv.StatusWaitingForInput {
			t.Fatalf("upstream: a late info should re-create status, infos and prefix (P6): %+v", l)
		}
	})
}

func TestRule06DecodeAbort(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		// A present room that is not Success: recorded and failed.
		h.ready(1, 1)
		h.e.DecodeAbort(1, epA)
		h.e.SettleBootstrap()
		if r := h.want(1, kv.StatusFailed); r.Reason != kv.ReasonDecodeAbort {
			t.Fatalf("reason %v", r.Reason)
		}
		// A Success room: ignored.
		h.ready(2, 1)
		h.e.Init(2, 1, 0)
		h.e.Send(2, []int32{1}, nil)
		h.e.SettleWorkers()
		h.e.DecodeAbort(2, epA)
		h.e.SettleBootstrap()
		h.want(2, kv.StatusSuccess)
		// An unknown room.
		h.e.DecodeAbort(3, epA)
		h.e.SettleBootstrap()
		h.e.Open(3)
		if h.e.fixed {
			if r := h.want(3, kv.StatusFailed); r.Reason != kv.ReasonDecodeAbort {
				t.Fatalf("fixed: reason %v", r.Reason)
			}
			for _, id := range []uint64{1, 2, 3} {
				if h.n.Count(id, room.AbortAck) != 1 {
					t.Fatalf("fixed: room %d notices %+v, want one ABORT_ACK", id, h.n.Of(id))
				}
			}
			return
		}
		h.want(3, kv.StatusBootstrapping) // dropped, no tombstone (P2)
		for _, id := range []uint64{1, 2, 3} {
			if len(h.n.Of(id)) != 0 {
				t.Fatal("upstream told decode something")
			}
		}
	})
}
