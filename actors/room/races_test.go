package room

import (
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// Named regressions for the three races that pin rooms in SGLang's dict-based
// NIXL prefill (spec §6.3). Each replays the upstream interleaving through the
// checker, so every invariant is checked at every step, and then asserts the
// outcome upstream gets wrong.

func replay(t *testing.T, c *checker, m *Machine, msgs ...Msg) {
	t.Helper()
	for _, msg := range msgs {
		if err := c.step(m, msg); err != nil {
			t.Fatalf("%s: %v", msgName(msg), err)
		}
	}
}

// P2: decode's ABORT arrives before the prefill scheduler created the sender.
// Upstream drops it (no room in request_status) and the sender then sits in
// Bootstrapping forever.
func TestRaceAbortBeforeSender(t *testing.T) {
	m, c := New(&testCfg, 9), &checker{}
	replay(t, c, m, DecodeAbort{From: epA}, Open{}, Poll{})
	if st, why := m.Status(); st != kv.StatusFailed || why != kv.ReasonDecodeAbort {
		t.Fatalf("sender opened after an ABORT polls %v/%v, want Failed/decode_abort", st, why)
	}
	replay(t, c, m, Clear{})
	if !m.Retired() {
		t.Fatal("room not retired after clear")
	}
}

// P5/P7: ABORT while a non-last chunk's write is in flight. Upstream keeps
// posting: before #30352 the worker's later Transferring/Success write
// resurrected the Failed status (max() with Failed = 0); at the baseline Failed
// is sticky, but the write still lands after the ABORT, decode is never told,
// and decode frees pages that the late write may land in (spec §6.3). Here the
// room fails at once, posts nothing more, and tells decode only after the
// write drained.
func TestRaceAbortInNonLastChunkWindow(t *testing.T) {
	m, c := New(&testCfg, 9), &checker{realAgents: []string{"a"}, chunks: 2}
	replay(t, c, m, Open{}, ti("a", epA, pages(1, 2), 1), Init{NumPages: 2}, Send{Pages: pages(5)})
	replay(t, c, m, DecodeAbort{From: epA})
	if fx := c.lastFx; fx.Status != kv.StatusFailed || len(fx.Notices) != 0 {
		t.Fatalf("abort in the window: %s; want Failed now and no ACK before the drain", summary(fx))
	}
	replay(t, c, m, Send{Pages: pages(6)}) // the last chunk: must not be posted
	replay(t, c, m, XferDone{Seq: 0})      // the late completion of chunk 0
	fx := c.lastFx
	if st, _ := m.Status(); st != kv.StatusFailed {
		t.Fatalf("late completion resurrected the room: %v", st)
	}
	if len(fx.Notices) != 1 || fx.Notices[0].Kind != AbortAck {
		t.Fatalf("after the drain the aborting decode must get its ACK (and no status: it knows), got %s", summary(fx))
	}
}

// P6: after the scheduler cleared a failed room, a late transfer info, a late
// completion and a late chunk must neither recreate state nor report success.
func TestRaceLateUpdatesAfterClear(t *testing.T) {
	m, c := New(&testCfg, 9), &checker{}
	replay(t, c, m, Open{}, ti("a", epA, pages(1), 1), Abort{}, Clear{})
	replay(t, c, m, ti("a", epA, pages(1), 1), XferDone{Seq: 0}, Send{Pages: pages(1)}, Init{NumPages: 1}, Poll{})
	if st, _ := m.Status(); st != kv.StatusFailed || !m.Retired() || m.Inflight() != 0 || len(m.Agents()) != 0 {
		t.Fatalf("late updates changed a cleared room: status %v retired %v agents %v", st, m.Retired(), m.Agents())
	}
}
