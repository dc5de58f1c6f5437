package dict

import (
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
)

// One test per rule of spec §7, each against both variants, so the comparison
// with the actor engine is against upstream as it is (and against its best
// repair), not against a straw man.

func TestRule01UpdateStatus(t *testing.T) {
	type step struct {
		s    room.Status
		w    writer
		want room.Status
		ok   bool // present after the step
	}
	cases := []struct {
		name     string
		v        Variant
		nonstick bool
		steps    []step
	}{
		{"upstream/absent-Failed-is-a-no-op", Upstream, false, []step{{room.Failed, byBootstrap, 0, false}}},
		{"upstream/absent-inserts-from-any-writer", Upstream, false, []step{{room.Transferring, byWorker, room.Transferring, true}}},
		{"upstream/max-merge", Upstream, false, []step{
			{room.WaitingForInput, byBootstrap, room.WaitingForInput, true},
			{room.Bootstrapping, bySender, room.WaitingForInput, true},
			{room.Transferring, byWorker, room.Transferring, true}}},
		{"upstream/Failed-sticky", Upstream, false, []step{
			{room.Transferring, byWorker, room.Transferring, true},
			{room.Failed, bySender, room.Failed, true},
			{room.Success, byWorker, room.Failed, true}}},
		{"upstream/Success-then-Failed-fails", Upstream, false, []step{
			{room.Success, byWorker, room.Success, true},
			{room.Failed, bySender, room.Failed, true}}},
		{"upstream/pre-30352-Failed-resurrects", Upstream, true, []step{
			{room.Transferring, byWorker, room.Transferring, true},
			{room.Failed, bySender, room.Failed, true},
			{room.Transferring, byWorker, room.Transferring, true}}},
		{"fixed/only-the-sender-inserts", Fixed, false, []step{
			{room.WaitingForInput, byBootstrap, 0, false},
			{room.Success, byWorker, 0, false},
			{room.Bootstrapping, bySender, room.Bootstrapping, true}}},
		{"fixed/Success-sticky", Fixed, false, []step{
			{room.Bootstrapping, bySender, room.Bootstrapping, true},
			{room.Success, byWorker, room.Success, true},
			{room.Failed, bySender, room.Success, true}}},
		{"fixed/Failed-sticky", Fixed, false, []step{
			{room.Bootstrapping, bySender, room.Bootstrapping, true},
			{room.Failed, byBootstrap, room.Failed, true},
			{room.Transferring, byWorker, room.Failed, true}}},
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
			if r.Status != room.Failed || r.Reason != room.ReasonInvalidRequest {
				t.Fatalf("fixed: unknown room polls %+v, want Failed/invalid_request", r)
			}
			return
		}
		if r.Status != room.WaitingForInput || h.e.check(42) != room.WaitingForInput {
			t.Fatalf("upstream: unknown room polls %+v, want the WaitingForInput default", r)
		}
	})
}

func TestRule03SenderCreate(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		h.e.Open(1)
		h.want(1, room.Bootstrapping)
		// Decode faster than prefill: every info before the sender.
		h.e.TransferInfo(2, ti("a", epA, 1, 1))
		h.e.SettleBootstrap()
		st, ok := h.e.status.get(2)
		if h.e.fixed == ok {
			t.Fatalf("before the sender: status %v present=%v (upstream inserts, fixed does not)", st, ok)
		}
		h.e.Open(2)
		h.want(2, room.WaitingForInput) // upstream: max(WFI, Bootstrapping); fixed: Open promotes
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
			h.want(1, room.Success)
			if r := h.want(2, room.Failed); r.Reason != room.ReasonInvalidRequest {
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
		h.want(1, room.Bootstrapping)
		h.e.TransferInfo(1, b)
		h.e.SettleBootstrap()
		if r := h.want(1, room.WaitingForInput); r.PrefixLen != 16 {
			t.Fatalf("prefix length %d, want the first info's 16", r.PrefixLen)
		}
		h.e.Init(1, 1, 0)
		h.e.Send(1, []int32{5}, nil)
		h.e.SettleWorkers()
		h.want(1, room.Success)
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
		if l.RequestStatus != 1 || l.TransferInfos != 1 || l.PrefixLen != 1 || h.e.check(1) != room.WaitingForInput {
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
		if r := h.want(1, room.Failed); r.Reason != room.ReasonDecodeAbort {
			t.Fatalf("reason %v", r.Reason)
		}
		// A Success room: ignored.
		h.ready(2, 1)
		h.e.Init(2, 1, 0)
		h.e.Send(2, []int32{1}, nil)
		h.e.SettleWorkers()
		h.e.DecodeAbort(2, epA)
		h.e.SettleBootstrap()
		h.want(2, room.Success)
		// An unknown room.
		h.e.DecodeAbort(3, epA)
		h.e.SettleBootstrap()
		h.e.Open(3)
		if h.e.fixed {
			if r := h.want(3, room.Failed); r.Reason != room.ReasonDecodeAbort {
				t.Fatalf("fixed: reason %v", r.Reason)
			}
			for _, id := range []uint64{1, 2, 3} {
				if h.n.Count(id, room.AbortAck) != 1 {
					t.Fatalf("fixed: room %d notices %+v, want one ABORT_ACK", id, h.n.Of(id))
				}
			}
			return
		}
		h.want(3, room.Bootstrapping) // dropped, no tombstone (P2)
		for _, id := range []uint64{1, 2, 3} {
			if len(h.n.Of(id)) != 0 {
				t.Fatal("upstream told decode something")
			}
		}
	})
}

func TestRule07InitSendEnqueue(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		var seen []Event
		h.hooks.On(WorkerDequeued, func(ev Event) { seen = append(seen, ev) }) // one worker per room: no race
		h.ready(1, 4)
		h.e.Init(1, 3, 0)
		h.e.Send(1, []int32{10}, nil)
		h.e.Send(1, nil, nil) // empty and not last: should_send_kv_chunk is false
		h.e.Send(1, []int32{11, 12}, [][]int32{{9}})
		h.e.SettleWorkers()
		h.want(1, room.Success)
		if len(seen) != 2 || seen[0].Chunk != 0 || seen[0].Last || seen[1].Chunk != 1 || !seen[1].Last {
			t.Fatalf("chunks %+v, want ids 0 then 1 (last)", seen)
		}
		ps := h.g.Posts(1)
		if len(ps) != 2 || !equal(ps[1].T.DstPages, []int32{101, 102}) || ps[1].T.SrcAux != 0 || len(ps[1].T.SrcState) != 1 {
			t.Fatalf("second chunk's write %+v: want index_slice [1,3) and aux and state", ps[1].T)
		}
		// A failed room: upstream enqueues (the worker skips), fixed refuses.
		h.ready(2, 1)
		h.e.Init(2, 1, 0)
		h.e.Abort(2)
		seen = nil
		h.e.Send(2, []int32{1}, nil)
		h.e.SettleWorkers()
		if h.e.fixed != (len(seen) == 0) || len(h.g.Posts(2)) != 0 {
			t.Fatalf("send to a failed room: %d dequeued, %d posted", len(seen), len(h.g.Posts(2)))
		}
	})
}

// The queue is room % N: a room blocked in its worker holds back the rooms of
// its queue, not the others.
func TestRule07QueueIsRoomModN(t *testing.T) {
	for _, v := range []Variant{Upstream, Fixed} {
		t.Run(v.String(), func(t *testing.T) {
			h := newHarness(t, v, func(c *Config) { c.Workers = 2 })
			for _, id := range []uint64{1, 2, 3} {
				h.ready(id, 1)
				h.e.Init(id, 1, 0)
			}
			p := Pause(h.hooks, WorkerDequeued, ForRoom(1))
			defer p.Release()
			h.e.Send(1, []int32{1}, nil)
			<-p.Reached
			h.e.Send(3, []int32{1}, nil) // queue 1, behind room 1
			h.e.Send(2, []int32{1}, nil) // queue 0
			if err := h.g.WaitPosts(2, 1); err != nil {
				t.Fatal(err)
			}
			if n := len(h.g.Posts(3)); n != 0 {
				t.Fatalf("room 3 overtook room 1 in queue 1: %d posts", n)
			}
			p.Release()
			h.e.SettleWorkers()
			for _, id := range []uint64{1, 2, 3} {
				h.want(id, room.Success)
			}
		})
	}
}

func TestRule08Worker(t *testing.T) {
	t.Run("fan-out-wait-and-finish", func(t *testing.T) {
		both(t, func(t *testing.T, h *harness) {
			h.e.Open(1)
			dummy := room.TransferInfo{Agent: "d", From: epB, Required: 3, Dummy: true}
			h.e.TransferInfo(1, ti("a", epA, 2, 3))
			h.e.TransferInfo(1, ti("b", epB, 2, 3))
			h.e.TransferInfo(1, dummy)
			h.e.SettleBootstrap()
			h.e.Init(1, 2, 0)
			h.g.Hold(func(t room.Transfer) bool { return t.Agent == "a" && t.Chunk == 0 })
			var during room.Status
			h.hooks.On(WorkerPosted, func(ev Event) {
				if ev.Chunk == 0 {
					during = h.poll(1).Status
				}
			})
			next := Watch(h.hooks, WorkerDequeued, ForChunk(1, 1))
			h.e.Send(1, []int32{1}, nil)
			h.e.Send(1, []int32{2}, nil)
			if err := h.g.WaitHeld(1, 1); err != nil {
				t.Fatal(err)
			}
			select {
			case <-next:
				t.Fatal("the worker took the next chunk before every write of this one completed")
			default:
			}
			h.g.Release(1, room.ReasonNone)
			h.e.SettleWorkers()
			if during != room.Transferring {
				t.Fatalf("status while chunk 0 was in flight: %v", during)
			}
			if n := len(h.g.Posts(1)); n != 4 {
				t.Fatalf("%d writes, want 2 chunks × 2 non-dummy agents", n)
			}
			h.want(1, room.Success)
			if l := h.leaks(); l.TransferInfos != 0 || l.PrefixLen != 0 || l.RequestStatus != 1 {
				t.Fatalf("after the last chunk: %+v (infos and prefix popped, status kept)", l)
			}
		})
	})
	t.Run("skip-when-Failed", func(t *testing.T) {
		both(t, func(t *testing.T, h *harness) {
			h.ready(1, 1)
			h.e.Init(1, 1, 0)
			p := Pause(h.hooks, WorkerDequeued, ForRoom(1))
			h.e.Send(1, []int32{1}, nil)
			<-p.Reached
			h.e.Abort(1)
			p.Release()
			h.e.SettleWorkers()
			if len(h.g.Posts(1)) != 0 {
				t.Fatal("posted for a failed room")
			}
			h.want(1, room.Failed)
		})
	})
	t.Run("transfer-error", func(t *testing.T) {
		both(t, func(t *testing.T, h *harness) {
			h.g.Outcome(func(room.Transfer) room.Reason { return room.ReasonTransferError })
			h.ready(1, 1)
			h.e.Init(1, 1, 0)
			h.e.Send(1, []int32{1}, nil)
			h.e.SettleWorkers()
			if r := h.want(1, room.Failed); r.Reason != room.ReasonTransferError {
				t.Fatalf("reason %v", r.Reason)
			}
			if l := h.leaks(); l.Exceptions != 1 || l.FailureRecords != 1 {
				t.Fatalf("the except block should store the exception and the record: %+v", l)
			}
			var te *stepError
			if err := h.e.FailureException(1); !errors.As(err, &te) {
				t.Fatalf("failure_exception raised %v, want the stored exception", err)
			}
		})
	})
	t.Run("no-transfer-infos", func(t *testing.T) {
		both(t, func(t *testing.T, h *harness) {
			h.e.Open(1)
			h.e.Init(1, 1, 0)
			h.e.Send(1, []int32{1}, nil) // the scheduler sent before decode's info (assert fails)
			h.e.SettleWorkers()
			if r := h.want(1, room.Failed); r.Reason != room.ReasonInternalError {
				t.Fatalf("reason %v", r.Reason)
			}
		})
	})
}

func TestRule09PollWithoutBootstrapTimeout(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		h.e.Open(1)
		h.clk.Advance(time.Hour)
		r := h.poll(1)
		if h.e.fixed {
			if r.Status != room.Failed || r.Reason != room.ReasonBootstrapTimeout {
				t.Fatalf("fixed after an hour: %+v", r)
			}
			return
		}
		if r.Status != room.Bootstrapping {
			t.Fatalf("upstream after an hour: %+v; it has no bootstrap timeout (P1)", r)
		}
	})
}

func TestRule09PollLatchedFailure(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		h.ready(1, 1)
		h.e.Abort(1)
		_ = h.e.FailureException(1) // clears every map, latches the sender
		if l := h.leaks(); l.Total() != 1 || l.Senders != 1 {
			t.Fatalf("after failure_exception: %+v (only the sender object is left)", l)
		}
		h.want(1, room.Failed)
	})
}

func TestRule10FailureException(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		h.ready(1, 1)
		h.e.Abort(1)
		err := h.e.FailureException(1)
		var te *TransferError
		if !errors.As(err, &te) || te.Msg != "Aborted by AbortReq." || te.Reason != room.ReasonClientAbort {
			t.Fatalf("first call raised %v", err)
		}
		err = h.e.FailureException(1)
		if !errors.As(err, &te) || !te.FromAnotherRank {
			t.Fatalf("second call raised %v, want the generic exception (records popped)", err)
		}
	})
}

func TestRule11Clear(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		h.ready(1, 2)
		h.e.Init(1, 2, 0)
		h.e.Send(1, []int32{1}, nil) // not last: infos and prefix stay
		h.e.SettleWorkers()
		h.e.clear(1)
		if l := h.leaks(); l.RequestStatus+l.TransferInfos+l.PrefixLen != 0 {
			t.Fatalf("clear left %+v", l)
		}
	})
}

func TestRule12AbortDoesNotTellDecode(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		h.ready(1, 2)
		h.e.Init(1, 2, 0)
		h.g.Hold(nil)
		h.g.Hold(func(room.Transfer) bool { return true })
		h.e.Send(1, []int32{1}, nil)
		if err := h.g.WaitHeld(1, 1); err != nil {
			t.Fatal(err)
		}
		h.e.Abort(1)
		if r := h.want(1, room.Failed); r.Reason != room.ReasonClientAbort {
			t.Fatalf("reason %v", r.Reason)
		}
		if len(h.n.Of(1)) != 0 {
			t.Fatal("decode told while a write is in flight")
		}
		h.g.Release(1, room.ReasonNone)
		h.e.SettleWorkers()
		got := h.n.Of(1)
		if !h.e.fixed {
			if len(got) != 0 {
				t.Fatalf("upstream told decode: %+v", got)
			}
			return
		}
		if len(got) != 1 || got[0].Kind != room.FailureStatus || got[0].To != epA || got[0].Reason != room.ReasonClientAbort {
			t.Fatalf("fixed: after the drain decode gets %+v", got)
		}
	})
}

func TestRule13SchedulerContract(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		// Failed is the smallest status: a MIN all-reduce fails every rank.
		if room.Failed >= room.Bootstrapping || room.Bootstrapping >= room.WaitingForInput ||
			room.WaitingForInput >= room.Transferring || room.Transferring >= room.Success {
			t.Fatal("KVPoll order broken")
		}
		// Polls over a room's life never go back, and the terminal answer stays.
		var seen []room.Status
		h.hooks.On(WorkerBeforeFinish, func(ev Event) { seen = append(seen, h.poll(1).Status) })
		h.e.Open(1)
		seen = append(seen, h.poll(1).Status)
		h.e.TransferInfo(1, ti("a", epA, 2, 1))
		h.e.SettleBootstrap()
		seen = append(seen, h.poll(1).Status)
		h.e.Init(1, 2, 0)
		h.e.Send(1, []int32{1}, nil)
		h.e.Send(1, []int32{2}, nil)
		h.e.SettleWorkers()
		seen = append(seen, h.poll(1).Status, h.poll(1).Status)
		for i := 1; i < len(seen); i++ {
			if seen[i] < seen[i-1] {
				t.Fatalf("polls went back: %v", seen)
			}
		}
		if seen[len(seen)-1] != room.Success {
			t.Fatalf("polls %v", seen)
		}
		// The scheduler clears a terminal room once; nothing is left.
		h.e.Clear(1)
		if l := h.leaks(); l.Total() != 0 {
			t.Fatalf("after clear: %+v", l)
		}
		// A failed room cleared through failure_exception leaves nothing either.
		h.ready(2, 1)
		h.e.Abort(2)
		h.e.Clear(2)
		if l := h.leaks(); l.Total() != 0 {
			t.Fatalf("after a failed room's clear: %+v", l)
		}
	})
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
