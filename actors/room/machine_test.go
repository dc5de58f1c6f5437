package room

import (
	"slices"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

type step struct {
	msg  Msg
	want string // summary(Effects), see harness_test.go
}

// Gen numbers in Deadline messages are the machine's arm generations; each case
// below lists them as they are produced (a fresh room arms generation 1).
// transitionCase is one table case: the messages in order, the effects each
// must produce, and the status the room ends in.
type transitionCase struct {
	name  string
	steps []step
	final kv.Status
}

var transitionCases = []transitionCase{
	{
		name: "transfer info of a refused registration: fails with it, posts nothing, tells decode",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(9)}, "-"},
			{TransferInfo{Agent: "a", From: epA, DstPages: pages(5), Required: 1, Refused: kv.ReasonPeerRejected}, "pub=Failed/peer_rejected status->10.0.0.1:7001 arm=linger"},
			{Poll{}, "reply=Failed"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "happy path, one agent, one chunk",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(5, 6), 1), "pub=WaitingForInput arm=waiting"},
			{Poll{}, "reply=WaitingForInput"},
			{Init{NumPages: 2, AuxIndex: 4}, "-"},
			{Send{Pages: pages(1, 2)}, "post[a:0c0L] pub=Transferring arm=transfer"},
			{XferDone{Seq: 0}, "pub=Success done->10.0.0.1:7001 arm=linger"},
			{Poll{}, "reply=Success"},
			{Clear{}, "retire"},
			{Poll{}, "reply=Success"},
		},
		final: kv.StatusSuccess,
	},
	{
		name: "transfer info before the sender exists (decode faster than prefill)",
		steps: []step{
			{ti("a", epA, pages(5), 1), "pub=WaitingForInput arm=bootstrap"},
			{Open{}, "arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(9)}, "post[a:0c0L] pub=Transferring arm=transfer"},
			{XferDone{Seq: 0}, "pub=Success done->10.0.0.1:7001 arm=linger"},
		},
		final: kv.StatusSuccess,
	},
	{
		name: "fan-out to two agents, two chunks, pipelined",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1, 2, 3), 2), "-"},
			{Poll{}, "reply=Bootstrapping"},
			{ti("b", epB, pages(4, 5, 6), 2), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 3, AuxIndex: 1}, "-"},
			{Send{Pages: pages(7, 8)}, "post[a:0c0 b:1c0] pub=Transferring arm=transfer"},
			{Send{Pages: pages(9)}, "post[a:2c1L b:3c1L]"},
			{XferDone{Seq: 1}, "arm=transfer"},
			{XferDone{Seq: 0}, "arm=transfer"},
			{XferDone{Seq: 3}, "arm=transfer"},
			{XferDone{Seq: 1}, "ignored"},
			{XferDone{Seq: 2}, "pub=Success done->10.0.0.1:7001 done->10.0.0.2:7002 arm=linger"},
		},
		final: kv.StatusSuccess,
	},
	{
		name: "between chunks the room waits for the scheduler under the waiting deadline",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1, 2), 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 2}, "-"},
			{Send{Pages: pages(7)}, "post[a:0c0] pub=Transferring arm=transfer"},
			{XferDone{Seq: 0}, "arm=waiting"}, // gen 5: transfer re-armed (4) then waiting (5)
			{Deadline{Gen: 5}, "pub=Failed/waiting_timeout status->10.0.0.1:7001 arm=linger"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "dummy transfer info counts toward required but gets no writes",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{dummy("d", epB, 2), "-"},
			{ti("a", epA, pages(1), 2), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(3)}, "post[a:0c0L] pub=Transferring arm=transfer"},
			{XferDone{Seq: 0}, "pub=Success done->10.0.0.1:7001 arm=linger"},
		},
		final: kv.StatusSuccess,
	},
	{
		name: "only dummy infos: success without a write",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{dummy("d", epB, 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(3)}, "pub=Success arm=linger"},
		},
		final: kv.StatusSuccess,
	},
	{
		name: "full decode prefix hit: empty last chunk takes the aux_nokv path",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{TransferInfo{Agent: "a", From: epA, DstAux: 2, Required: 1, PrefixLen: 64}, "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 0, AuxIndex: 5}, "-"},
			{Send{}, "post[a:0c0Lnokv] pub=Transferring arm=transfer"},
			{XferDone{Seq: 0}, "pub=Success done->10.0.0.1:7001 arm=linger"},
		},
		final: kv.StatusSuccess,
	},
	{
		name: "optimistic prefill: sends before the transfer infos are held, then posted in order",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{Init{NumPages: 2}, "-"},
			{Send{Pages: pages(1)}, "-"},
			{Send{Pages: pages(2)}, "-"},
			{ti("a", epA, pages(8, 9), 1), "post[a:0c0 a:1c1L] pub=Transferring arm=transfer"},
			{XferDone{Seq: 0}, "arm=transfer"},
			{XferDone{Seq: 1}, "pub=Success done->10.0.0.1:7001 arm=linger"},
		},
		final: kv.StatusSuccess,
	},
	{
		name: "state is sent with the last chunk when decode asked for it",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{TransferInfo{Agent: "a", From: epA, DstPages: pages(1), Required: 1, DstState: [][]int32{{4}}}, "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(2), State: [][]int32{{7}}}, "post[a:0c0LS] pub=Transferring arm=transfer"},
		},
		final: kv.StatusTransferring,
	},
	{
		name: "decode expects state the scheduler did not give: invalid request, nothing posted",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{TransferInfo{Agent: "a", From: epA, DstPages: pages(1), Required: 1, DstState: [][]int32{{4}}}, "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(2)}, "pub=Failed/invalid_request status->10.0.0.1:7001 arm=linger"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "ABORT before the sender exists fails the sender when it is opened (race 1)",
		steps: []step{
			{DecodeAbort{From: epA}, "pub=Failed/decode_abort ack->10.0.0.1:7001 retire"},
			{Open{}, "arm=linger revive"},
			{Poll{}, "reply=Failed"},
			{Init{NumPages: 1}, "ignored"},
			{Send{Pages: pages(1)}, "ignored"},
			{Clear{}, "retire"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "client abort before the sender exists is remembered too",
		steps: []step{
			{Abort{}, "pub=Failed/client_abort retire"},
			{Open{}, "arm=linger revive"},
			{Poll{}, "reply=Failed"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "ABORT inside a non-last chunk's transfer window drains, then acks (race 2)",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1, 2), 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 2}, "-"},
			{Send{Pages: pages(5)}, "post[a:0c0] pub=Transferring arm=transfer"},
			{DecodeAbort{From: epA}, "pub=Failed/decode_abort arm=drain"},
			{Poll{}, "reply=Failed"},
			{Send{Pages: pages(6)}, "ignored"},
			{XferDone{Seq: 0}, "ack->10.0.0.1:7001 arm=linger"},
			{XferDone{Seq: 0}, "ignored"},
			{Clear{}, "retire"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "a transfer info that comes while draining is told the failure after the drain",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1), 2), "-"},
			{ti("b", epB, pages(1), 2), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(1)}, "post[a:0c0L b:1c0L] pub=Transferring arm=transfer"},
			{Abort{}, "pub=Failed/client_abort arm=drain"},
			{ti("c", epX, pages(1), 2), "ignored"},
			{XferDone{Seq: 0}, "-"},
			{XferDone{Seq: 1}, "status->10.0.0.1:7001 status->10.0.0.2:7002 status->10.0.0.9:7009 arm=linger"},
			{ti("d", epX, pages(1), 2), "status->10.0.0.9:7009 ignored"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "late updates after clear hit the tombstone (race 3)",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1), 1), "pub=WaitingForInput arm=waiting"},
			{Abort{}, "pub=Failed/client_abort status->10.0.0.1:7001 arm=linger"},
			{Clear{}, "retire"},
			{ti("a", epA, pages(1), 1), "status->10.0.0.1:7001 ignored"},
			{Send{Pages: pages(1)}, "ignored"},
			{XferDone{Seq: 0}, "ignored"},
			{Abort{}, "ignored"},
			{Deadline{Gen: 3}, "ignored"},
			{DecodeAbort{From: epA}, "ack->10.0.0.1:7001"},
			{Poll{}, "reply=Failed"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "clear while draining retires only once the writes drained",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1), 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(1)}, "post[a:0c0L] pub=Transferring arm=transfer"},
			{Abort{}, "pub=Failed/client_abort arm=drain"},
			{Clear{}, "-"},
			{XferDone{Seq: 0, Fail: kv.ReasonTransferError}, "status->10.0.0.1:7001 retire"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "a write that never completes: transfer deadline, then drain deadline",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1), 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(1)}, "post[a:0c0L] pub=Transferring arm=transfer"},
			{Deadline{Gen: 2}, "ignored"}, // stale: generation 3 is armed
			{Deadline{Gen: 3}, "pub=Failed/transfer_timeout arm=drain"},
			{DecodeAbort{From: epB}, "-"},
			{Deadline{Gen: 4}, "status->10.0.0.1:7001(expired) arm=linger"}, // no ACK: a write may still land
			{XferDone{Seq: 0}, "ignored"},
			{Deadline{Gen: 5}, "retire"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "bootstrap deadline when decode never sends its transfer info",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(1)}, "-"},
			{Deadline{Gen: 1}, "pub=Failed/bootstrap_timeout arm=linger"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "bootstrap deadline when the scheduler never opens the sender",
		steps: []step{
			{ti("a", epA, pages(1), 1), "pub=WaitingForInput arm=bootstrap"},
			{Deadline{Gen: 1}, "pub=Failed/bootstrap_timeout status->10.0.0.1:7001 retire"},
			{Open{}, "arm=linger revive"},
			{Poll{}, "reply=Failed"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "transfer error fails the room, other writes drain",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1), 2), "-"},
			{ti("b", epB, pages(2), 2), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(1)}, "post[a:0c0L b:1c0L] pub=Transferring arm=transfer"},
			{XferDone{Seq: 1, Fail: kv.ReasonPeerLost}, "pub=Failed/peer_lost arm=drain"},
			{XferDone{Seq: 0}, "status->10.0.0.1:7001 status->10.0.0.2:7002 arm=linger"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "peer lost fails rooms that use the agent, others ignore it",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1), 1), "pub=WaitingForInput arm=waiting"},
			{PeerLost{Agent: "zz"}, "ignored"},
			{PeerLost{Agent: "a"}, "pub=Failed/peer_lost status->10.0.0.1:7001 arm=linger"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "abort after success changes nothing; decode still gets its ack",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{dummy("d", epB, 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(1)}, "pub=Success arm=linger"},
			{Abort{}, "ignored"},
			{DecodeAbort{From: epX}, "ack->10.0.0.9:7009"},
			{Fail{Reason: kv.ReasonShutdown}, "ignored"},
			{Poll{}, "reply=Success"},
		},
		final: kv.StatusSuccess,
	},
	{
		name: "duplicate abort: one failure, two acks",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{DecodeAbort{From: epA}, "pub=Failed/decode_abort ack->10.0.0.1:7001 arm=linger"},
			{DecodeAbort{From: epA}, "ack->10.0.0.1:7001"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "scheduler misuse is an invalid request: send before init",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{Send{Pages: pages(1)}, "pub=Failed/invalid_request arm=linger"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "scheduler misuse: more pages than init announced",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(1, 2)}, "pub=Failed/invalid_request arm=linger"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "decode page list shorter than the chunk: invalid request, nothing posted",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1), 2), "-"},
			{ti("b", epB, pages(1, 2), 2), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 2}, "-"},
			{Send{Pages: pages(1, 2)}, "pub=Failed/invalid_request status->10.0.0.1:7001 status->10.0.0.2:7002 arm=linger"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "transfer infos that disagree on required_dst_info_num",
		steps: []step{
			{ti("a", epA, pages(1), 2), "arm=bootstrap"},
			{ti("b", epB, pages(1), 3), "pub=Failed/invalid_request status->10.0.0.1:7001 retire"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "empty non-last send is not a chunk",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{ti("a", epA, pages(1), 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{}, "ignored"},
			{Send{Pages: pages(4)}, "post[a:0c0L] pub=Transferring arm=transfer"},
		},
		final: kv.StatusTransferring,
	},
	{
		name: "clear before the room concluded is the scheduler giving up",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{Clear{}, "pub=Failed/client_abort retire"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "a concluded room nobody clears retires on the linger deadline; polls still answered",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{Fail{Reason: kv.ReasonShutdown}, "pub=Failed/shutdown arm=linger"},
			{Deadline{Gen: 2}, "retire"},
			{Poll{}, "reply=Failed"},
		},
		final: kv.StatusFailed,
	},
	{
		name: "an Open for a cleared, opened room starts a new incarnation",
		steps: []step{
			{Open{}, "arm=bootstrap"},
			{dummy("d", epB, 1), "pub=WaitingForInput arm=waiting"},
			{Init{NumPages: 1}, "-"},
			{Send{Pages: pages(1)}, "pub=Success arm=linger"},
			{Clear{}, "retire"},
			{Open{}, "pub=Bootstrapping arm=bootstrap revive"},
			{Poll{}, "reply=Bootstrapping"},
		},
		final: kv.StatusBootstrapping,
	},
}

func TestTransitions(t *testing.T) { runTransitions(t, &testCfg, transitionCases) }

func runTransitions(t *testing.T, cfg *Config, cases []transitionCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := New(cfg, 42)
			for i, s := range tc.steps {
				if got := summary(m.Step(s.msg)); got != s.want {
					t.Fatalf("step %d %s:\n got  %s\n want %s", i, msgName(s.msg), got, s.want)
				}
			}
			if st, _ := m.Status(); st != tc.final {
				t.Fatalf("final status %v, want %v", st, tc.final)
			}
		})
	}
}

func TestTombstoneRoundTrip(t *testing.T) {
	m := New(&testCfg, 7)
	m.Step(DecodeAbort{From: epA})
	if !m.Retired() {
		t.Fatal("an abort for an unopened room should retire it at once")
	}
	ts := m.Tombstone()
	if ts != (Tombstone{Room: 7, Status: kv.StatusFailed, Reason: kv.ReasonDecodeAbort}) {
		t.Fatalf("tombstone %+v", ts)
	}
	r := FromTombstone(&testCfg, ts)
	if got := summary(r.Step(TransferInfo{Agent: "a", From: epB, Required: 1})); got != "status->10.0.0.2:7002 ignored" {
		t.Fatalf("late transfer info on tombstone: %s", got)
	}
	if got := summary(r.Step(Open{})); got != "arm=linger revive" {
		t.Fatalf("open on abort tombstone: %s", got)
	}
	if st, why := r.Status(); st != kv.StatusFailed || why != kv.ReasonDecodeAbort {
		t.Fatalf("revived status %v/%v", st, why)
	}
}

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Drain = 0
	if err := c.Validate(); err == nil {
		t.Fatal("a zero drain deadline was accepted")
	}
}

// TestTransferPageStart: each posted chunk names its first page in the
// room's page list (SGLang's index_slice.start, which staged writes carry),
// for every agent, and its decode pages start there; the room never sets
// Staged (the transport does).
func TestTransferPageStart(t *testing.T) {
	m := New(&testCfg, 7)
	m.Step(Open{})
	m.Step(ti("a", epA, pages(10, 11, 12, 13, 14, 15), 2))
	m.Step(ti("b", epB, pages(20, 21, 22, 23, 24, 25), 2))
	m.Step(Init{NumPages: 6, AuxIndex: 1})
	var got []int
	for _, chunk := range [][]int32{pages(1, 2), pages(3), pages(4, 5, 6)} {
		fx := m.Step(Send{Pages: chunk})
		if len(fx.Posts) != 2 {
			t.Fatalf("%d posts", len(fx.Posts))
		}
		for _, p := range fx.Posts {
			if p.Staged != nil {
				t.Fatal("the room set Staged")
			}
			base := int32(10)
			if p.Agent == "b" {
				base = 20
			}
			if p.DstPages[0] != base+int32(p.PageStart) {
				t.Fatalf("chunk %d for %s: PageStart %d, decode pages %v", p.Chunk, p.Agent, p.PageStart, p.DstPages)
			}
			got = append(got, p.PageStart)
		}
	}
	if want := []int{0, 0, 2, 2, 3, 3}; !slices.Equal(got, want) {
		t.Fatalf("page starts %v, want %v", got, want)
	}
}

// TestFailWithdraws: a room that fails with transfers in flight asks the
// transport to withdraw the ones it has not started (Effects.Withdraw), once,
// in the failing step; a room failing with nothing in flight, a success, and
// a second failure ask nothing. The room still drains: each withdrawn
// transfer's XferDone comes back, and the failure reaches decode after the last.
func TestFailWithdraws(t *testing.T) {
	m := New(&testCfg, 7)
	m.Step(Open{})
	m.Step(ti("a", epA, pages(10, 11), 1))
	m.Step(Init{NumPages: 2, AuxIndex: 1})
	if fx := m.Step(Send{Pages: pages(1)}); len(fx.Posts) != 1 || fx.Withdraw {
		t.Fatalf("send: %+v", fx)
	}
	fx := m.Step(Abort{})
	if !fx.Withdraw || fx.Status != kv.StatusFailed {
		t.Fatalf("abort with a write in flight: withdraw %v status %v", fx.Withdraw, fx.Status)
	}
	if fx := m.Step(Fail{Reason: kv.ReasonShutdown}); fx.Withdraw {
		t.Fatal("a second failure withdrew again")
	}
	if fx := m.Step(XferDone{Seq: 0, Fail: kv.ReasonTransferError}); fx.Withdraw || len(fx.Notices) != 1 || fx.Notices[0].Kind != FailureStatus {
		t.Fatalf("the withdrawn write's done: %+v", fx)
	}

	idle := New(&testCfg, 8)
	idle.Step(Open{})
	idle.Step(ti("a", epA, pages(10), 1))
	if fx := idle.Step(Abort{}); fx.Withdraw || fx.Status != kv.StatusFailed {
		t.Fatalf("abort with nothing in flight: withdraw %v status %v", fx.Withdraw, fx.Status)
	}

	ok := New(&testCfg, 9)
	ok.Step(Open{})
	ok.Step(ti("a", epA, pages(10), 1))
	ok.Step(Init{NumPages: 1})
	ok.Step(Send{Pages: pages(1)})
	if fx := ok.Step(XferDone{Seq: 0}); fx.Withdraw || fx.Status != kv.StatusSuccess {
		t.Fatalf("success: withdraw %v status %v", fx.Withdraw, fx.Status)
	}
}

// Each step's effects carry what the outside sees of it: the poll answer
// after the step, the transfer info or completion a live room received, and
// the tombstone of a retiring room; a retired room reports no info or
// completion of its own.
func TestEffectsCarryWhatTheOutsideSees(t *testing.T) {
	m := New(&Config{}, 7)
	if fx := m.Step(Open{}); fx.View != (kv.Reply{Status: kv.StatusBootstrapping}) || fx.Info.Seen || fx.Done.Seen {
		t.Fatalf("open: %+v", fx)
	}
	fx := m.Step(TransferInfo{Agent: "a", From: epA, DstPages: pages(5), Required: 1, PrefixLen: 3})
	if want := (InfoSeen{Seen: true, Agent: "a", Required: 1}); fx.Info != want {
		t.Fatalf("info seen %+v, want %+v", fx.Info, want)
	}
	if want := (kv.Reply{Status: kv.StatusWaitingForInput, PrefixLen: 3}); fx.View != want {
		t.Fatalf("view %+v after the info, want %+v", fx.View, want)
	}
	m.Step(Init{NumPages: 1})
	m.Step(Send{Pages: pages(9)})
	fx = m.Step(XferDone{Seq: 0})
	if want := (DoneSeen{Seen: true, Seq: 0}); fx.Done != want || fx.View.Status != kv.StatusSuccess {
		t.Fatalf("completion: done %+v view %+v", fx.Done, fx.View)
	}
	if fx = m.Step(XferDone{Seq: 9, Fail: kv.ReasonTransferError}); !fx.Done.Seen || fx.Done.Fail != kv.ReasonTransferError || !fx.Ignored {
		t.Fatalf("an unknown completion: %+v", fx)
	}
	fx = m.Step(Clear{})
	if want := m.Tombstone(); !fx.Retire || fx.Tomb != want || want.Status != kv.StatusSuccess {
		t.Fatalf("retire: %+v, tombstone %+v", fx, want)
	}
	if fx = m.Step(XferDone{Seq: 0}); fx.Done.Seen || fx.View.Status != kv.StatusSuccess {
		t.Fatalf("a retired room's step: %+v", fx)
	}
	tomb := FromTombstone(&Config{}, m.Tombstone())
	if fx = tomb.Step(TransferInfo{Agent: "a", From: epA}); fx.Info.Seen {
		t.Fatalf("a tombstone's step reports the info: %+v", fx)
	}
}
