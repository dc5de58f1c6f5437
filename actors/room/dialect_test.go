package room

import (
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// Cases for what SGLang's later releases read: ABORT generations, held
// completion notifications, and the poisoned room that gets no ACK. They run
// under holdCfg (kvxferd's setting).
var holdCases = []transitionCase{
	{
		name: "held notifications ride on the completion, sent in the step that publishes Success",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1, 2), 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 2}, "-"},
			{Send{Pages: pages(7)}, "post[a:0c0] pub=Transferring arm=transfer"},
			{Send{Pages: pages(8)}, "post[a:1c1Lh]"},
			{XferDone{Seq: 0}, "arm=transfer"},
			{XferDone{Seq: 1, Signal: [][]byte{[]byte("9_kv_1_1_0"), []byte("9_aux")}}, "pub=Success done->10.0.0.1:7001(signal=2) arm=linger"},
		},
		final: kv.StatusSuccess,
	},
	{
		name: "abort after the last chunk was posted: decode is never told it succeeded",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1), 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(7)}, "post[a:0c0Lh] pub=Transferring arm=transfer"},
			{Abort{}, "pub=Failed/client_abort arm=drain"},
			{XferDone{Seq: 0, Signal: [][]byte{[]byte("1_aux")}}, "status->10.0.0.1:7001 arm=linger"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "ABORT_ACK echoes the generation; the latest ABORT per endpoint wins",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1), 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(7)}, "post[a:0c0Lh] pub=Transferring arm=transfer"},
			{DecodeAbort{From: epA, Gen: 3, HasGen: true}, "pub=Failed/decode_abort arm=drain"},
			{DecodeAbort{From: epA, Gen: 4, HasGen: true}, "-"},
			{DecodeAbort{From: epB}, "-"},
			{XferDone{Seq: 0}, "ack->10.0.0.1:7001(gen=4) ack->10.0.0.2:7002 arm=linger"}, // the aborting decode knows: no status
			{DecodeAbort{From: epA, Gen: 5, HasGen: true}, "ack->10.0.0.1:7001(gen=5)"},
			{Clear{}, "retire"},
			{DecodeAbort{From: epB, Gen: 6, HasGen: true}, "ack->10.0.0.2:7002(gen=6)"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "abort before the sender exists is acked with its generation",
		steps: []step{
			{DecodeAbort{From: epA, Gen: 1, HasGen: true}, "pub=Failed/decode_abort ack->10.0.0.1:7001(gen=1) retire"},
			{Open{}, "arm=linger revive"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "expired drain poisons the room: no ACK, then or later",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1), 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(7)}, "post[a:0c0Lh] pub=Transferring arm=transfer"},
			{DecodeAbort{From: epA, Gen: 2, HasGen: true}, "pub=Failed/decode_abort arm=drain"},
			{Deadline{Gen: 4}, "arm=linger"}, // the aborting decode knows, and may not be acked
			{DecodeAbort{From: epA, Gen: 3, HasGen: true}, "ignored"},
			{Clear{}, "retire"},
			{DecodeAbort{From: epA, Gen: 4, HasGen: true}, "ignored"},
		},
		final: kv.StatusFailed,
	},
}

func TestHoldAndGenerations(t *testing.T) { runTransitions(t, &holdCfg, holdCases) }

func TestPoisonSurvivesTheTombstone(t *testing.T) {
	m := New(&holdCfg, 3)
	for _, msg := range []Msg{Open{}, ti("a", epA, pages(1), 1), Init{NumPages: 1}, Send{Pages: pages(7)}, Abort{}} {
		m.Step(msg)
	}
	_, gen := m.Armed()
	m.Step(Deadline{Gen: gen}) // the drain expires
	m.Step(Clear{})
	r := FromTombstone(&holdCfg, m.Tombstone())
	if got := summary(r.Step(DecodeAbort{From: epA, Gen: 1, HasGen: true})); got != "ignored" {
		t.Fatalf("ABORT on a poisoned tombstone: %s, want no ACK", got)
	}
	ok := FromTombstone(&holdCfg, Tombstone{Room: 4, Status: kv.StatusFailed, Reason: kv.ReasonClientAbort, Opened: true})
	if got := summary(ok.Step(DecodeAbort{From: epA, Gen: 2, HasGen: true})); got != "ack->10.0.0.1:7001(gen=2)" {
		t.Fatalf("ABORT on a drained tombstone: %s", got)
	}
}
