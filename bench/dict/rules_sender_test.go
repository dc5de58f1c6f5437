package dict

import (
	"errors"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// Rules 7–13 of spec §7: the sender, the worker, poll and the scheduler
// contract, against both variants.

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
		h.want(1, kv.StatusSuccess)
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
				h.want(id, kv.StatusSuccess)
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
			h.g.Hold(func(t kv.Transfer) bool { return t.Agent == "a" && t.Chunk == 0 })
			var during kv.Status
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
			h.g.Release(1, kv.ReasonNone)
			h.e.SettleWorkers()
			if during != kv.StatusTransferring {
				t.Fatalf("status while chunk 0 was in flight: %v", during)
			}
			if n := len(h.g.Posts(1)); n != 4 {
				t.Fatalf("%d writes, want 2 chunks × 2 non-dummy agents", n)
			}
			h.want(1, kv.StatusSuccess)
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
			h.want(1, kv.StatusFailed)
		})
	})
	t.Run("transfer-error", func(t *testing.T) {
		both(t, func(t *testing.T, h *harness) {
			h.g.Outcome(func(kv.Transfer) kv.Reason { return kv.ReasonTransferError })
			h.ready(1, 1)
			h.e.Init(1, 1, 0)
			h.e.Send(1, []int32{1}, nil)
			h.e.SettleWorkers()
			if r := h.want(1, kv.StatusFailed); r.Reason != kv.ReasonTransferError {
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
			if r := h.want(1, kv.StatusFailed); r.Reason != kv.ReasonInternalError {
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
			if r.Status != kv.StatusFailed || r.Reason != kv.ReasonBootstrapTimeout {
				t.Fatalf("fixed after an hour: %+v", r)
			}
			return
		}
		if r.Status != kv.StatusBootstrapping {
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
		h.want(1, kv.StatusFailed)
	})
}

func TestRule10FailureException(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		h.ready(1, 1)
		h.e.Abort(1)
		err := h.e.FailureException(1)
		var te *TransferError
		if !errors.As(err, &te) || te.Msg != "Aborted by AbortReq." || te.Reason != kv.ReasonClientAbort {
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

// Fixed: a clear of a live room is the scheduler giving up on it.
func TestRule11FixedClearOfLiveRoom(t *testing.T) {
	h := newHarness(t, Fixed, nil)
	h.ready(1, 1)
	h.e.Clear(1)
	if l := h.leaks(); l.Total() != 0 {
		t.Fatalf("left %+v", l)
	}
	if r := h.poll(1); r.Status != kv.StatusFailed || r.Reason != kv.ReasonClientAbort {
		t.Fatalf("the cleared id polls %+v", r)
	}
	if h.n.Count(1, room.FailureStatus) != 1 {
		t.Fatalf("decode not told: %+v", h.n.Of(1))
	}
}

func TestRule12AbortDoesNotTellDecode(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		h.ready(1, 2)
		h.e.Init(1, 2, 0)
		h.g.Hold(nil)
		h.g.Hold(func(kv.Transfer) bool { return true })
		h.e.Send(1, []int32{1}, nil)
		if err := h.g.WaitHeld(1, 1); err != nil {
			t.Fatal(err)
		}
		h.e.Abort(1)
		if r := h.want(1, kv.StatusFailed); r.Reason != kv.ReasonClientAbort {
			t.Fatalf("reason %v", r.Reason)
		}
		if len(h.n.Of(1)) != 0 {
			t.Fatal("decode told while a write is in flight")
		}
		h.g.Release(1, kv.ReasonNone)
		h.e.SettleWorkers()
		got := h.n.Of(1)
		if !h.e.fixed {
			if len(got) != 0 {
				t.Fatalf("upstream told decode: %+v", got)
			}
			return
		}
		if len(got) != 1 || got[0].Kind != room.FailureStatus || got[0].To != epA || got[0].Reason != kv.ReasonClientAbort {
			t.Fatalf("fixed: after the drain decode gets %+v", got)
		}
	})
}

func TestRule13SchedulerContract(t *testing.T) {
	both(t, func(t *testing.T, h *harness) {
		// Failed is the smallest status: a MIN all-reduce fails every rank.
		if kv.StatusFailed >= kv.StatusBootstrapping || kv.StatusBootstrapping >= kv.StatusWaitingForInput ||
			kv.StatusWaitingForInput >= kv.StatusTransferring || kv.StatusTransferring >= kv.StatusSuccess {
			t.Fatal("KVPoll order broken")
		}
		// Polls over a room's life never go back, and the terminal answer stays.
		var seen []kv.Status
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
		if seen[len(seen)-1] != kv.StatusSuccess {
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
