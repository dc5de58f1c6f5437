package actors

import (
	"reflect"
	"testing"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// batchOp is one decode-side call of the script below.
type batchOp struct {
	kind  byte // 't' transfer info, 'f' fail, 'a' decode abort
	room  uint64
	agent string
	req   int
	why   kv.Reason
}

// batchScript: more rooms than the cap, two agents (one over its share),
// rooms that need two infos (phase one: only infos, so no room retires while
// the caps decide, and admission depends on order alone); then fails before
// and after an info, and decode aborts, on those rooms (phase two creates no
// room: live ones, or tombstones of refused ones).
func batchScript() []batchOp {
	var ops []batchOp
	for i := range 40 {
		id := uint64(500 + i)
		agent := "a"
		if i%3 == 0 {
			agent = "b"
		}
		ops = append(ops, batchOp{kind: 't', room: id, agent: agent, req: 1 + i%2})
	}
	for i := range 40 {
		id := uint64(500 + i)
		switch i % 5 {
		case 0: // fail, then an info
			ops = append(ops, batchOp{kind: 'f', room: id, why: kv.ReasonTransferError}, batchOp{kind: 't', room: id, agent: "c", req: 2})
		case 1: // an info, then the fail
			ops = append(ops, batchOp{kind: 't', room: id, agent: "c", req: 2}, batchOp{kind: 'f', room: id, why: kv.ReasonPeerRejected})
		case 2: // decode's abort
			ops = append(ops, batchOp{kind: 'a', room: id})
		case 3: // the second info a two-info room waits for
			ops = append(ops, batchOp{kind: 't', room: id, agent: "c", req: 2})
		}
	}
	return ops
}

type batchOutcome struct {
	replies []kv.Reply
	notices map[uint64][]room.Notice
	stats   Stats
}

func runBatchScript(t *testing.T, batched bool, flushEvery int) batchOutcome {
	f := newFixture(t, &transfersDouble{}, func(c *Config) { c.Shards = 3; c.RoomCap = 24; c.PeerRoomCap = 9 })
	from := kv.Endpoint{IP: "127.0.0.1", Port: 9000}
	// Some rooms are the scheduler's before decode speaks.
	for i := 0; i < 40; i += 4 {
		f.eng.Open(uint64(500 + i))
	}
	b := f.eng.NewBatch()
	var ids []uint64
	for i, op := range batchScript() {
		ids = append(ids, op.room)
		switch {
		case op.kind == 't' && batched:
			b.TransferInfo(op.room, info(op.agent, 2, op.req))
		case op.kind == 't':
			f.eng.TransferInfo(op.room, info(op.agent, 2, op.req))
		case op.kind == 'f' && batched:
			b.Fail(op.room, op.why)
		case op.kind == 'f':
			f.eng.Fail(op.room, op.why)
		case op.kind == 'a' && batched:
			b.DecodeAbort(op.room, from)
		case op.kind == 'a':
			f.eng.DecodeAbort(op.room, from)
		}
		if batched && (i+1)%flushEvery == 0 {
			b.Flush()
			if b.Len() != 0 {
				t.Fatalf("Len after Flush = %d", b.Len())
			}
		}
	}
	b.Flush()
	f.settle(ids...)
	out := batchOutcome{replies: f.eng.PollSync(ids, nil), notices: map[uint64][]room.Notice{}, stats: f.eng.Stats()}
	for _, id := range ids {
		out.notices[id] = f.notices.Of(id)
	}
	return out
}

// A Batch does to every room exactly what the same calls one by one do, in
// the same order, caps and per-agent shares included, however it is flushed.
func TestBatchMatchesPerCall(t *testing.T) {
	want := runBatchScript(t, false, 0)
	if want.stats.RefusedRoomCap == 0 || want.stats.RefusedPeerShare == 0 {
		t.Fatalf("the script must hit both caps: %+v", want.stats)
	}
	for _, every := range []int{1, 7, 1000} {
		got := runBatchScript(t, true, every)
		if !reflect.DeepEqual(got.replies, want.replies) {
			t.Errorf("flush every %d: replies\n got %+v\nwant %+v", every, got.replies, want.replies)
		}
		if !reflect.DeepEqual(got.notices, want.notices) {
			t.Errorf("flush every %d: notices differ\n got %+v\nwant %+v", every, got.notices, want.notices)
		}
		if got.stats != want.stats {
			t.Errorf("flush every %d: stats %+v, want %+v", every, got.stats, want.stats)
		}
	}
}

// A batch's messages reach their rooms: Len counts them, each room ends as its
// messages say (order itself is checked by TestBatchMatchesPerCall, which
// fails when a shard routes a batch out of order).
func TestBatchKeepsPerRoomOrder(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, nil)
	b := f.eng.NewBatch()
	b.Fail(1, kv.ReasonTransferError)
	b.TransferInfo(1, info("d", 2, 1))
	b.TransferInfo(2, info("d", 2, 1))
	b.Fail(2, kv.ReasonPeerRejected)
	if b.Len() != 4 { // below batchPart: nothing sent yet
		t.Fatalf("Len = %d", b.Len())
	}
	b.Flush()
	rs := f.eng.PollSync([]uint64{1, 2}, nil)
	if rs[0].Status != kv.StatusFailed || rs[0].Reason != kv.ReasonTransferError {
		t.Fatalf("room 1: %+v", rs[0])
	}
	if rs[1].Status != kv.StatusFailed || rs[1].Reason != kv.ReasonPeerRejected {
		t.Fatalf("room 2: %+v", rs[1])
	}
	// Room 1 failed before its info: decode is told at once, on that info.
	if ns := f.notices.Of(1); len(ns) == 0 || ns[0].Kind != room.FailureStatus || ns[0].Reason != kv.ReasonTransferError {
		t.Fatalf("room 1 notices %+v", ns)
	}
}
