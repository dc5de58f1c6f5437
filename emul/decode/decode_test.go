package decode

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/internal/clock"
)

func newDecode(t *testing.T, p *prefill, mod func(*Config)) *Emulator {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Bootstrap = p.http.URL
	cfg.Shape = testShape()
	cfg.PageSize, cfg.KVCacheDtype = 16, "auto"
	cfg.AckMode = p.ack
	cfg.Workload = workload.Default(11)
	cfg.Workload.AbortShare = 0
	cfg.Rooms, cfg.Concurrency = 40, 8
	cfg.TopologyRetry = 5 * time.Millisecond
	cfg.WaitingTimeout, cfg.ReleaseTimeout = 20*time.Second, 20*time.Second
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return e
}

// serveAll plays the prefill scheduler for rooms [0, n) of the same workload
// the decode emulator runs: both sides derive each room from (seed, index).
// Rooms start in index order, as on decode: two bounded windows that both
// advance in index order always overlap, so neither side waits on a room the
// other has not started.
func serveAll(p *prefill, wl workload.Config, n int) (wait func() map[uint64]room.Reply) {
	var mu sync.Mutex
	out := map[uint64]room.Reply{}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range n {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				pl := wl.Plan(i)
				rep := p.serve(pl)
				mu.Lock()
				out[pl.Room] = rep
				mu.Unlock()
			}()
		}
	}()
	return func() map[uint64]room.Reply { wg.Wait(); return out }
}

func checkClean(t *testing.T, s *Summary) {
	t.Helper()
	if err := s.Err(); err != nil {
		var b strings.Builder
		s.Print(&b)
		t.Fatalf("%v\n%s", err, b.String())
	}
}

func TestWorkloadSucceedsWithBytesVerified(t *testing.T) {
	for _, later := range []bool{false, true} {
		t.Run(map[bool]string{false: "baseline-frames", true: "later-frames"}[later], func(t *testing.T) {
			p := newPrefill(t, false)
			e := newDecode(t, p, func(c *Config) {
				c.LaterFrames = later
				c.Workload.DummyShare, c.Workload.PrefixShare = 0.3, 0.3
				if later {
					c.Rate = 4000 // paced: 40 rooms over ~10 ms
				}
			})
			wait := serveAll(p, e.cfg.Workload, e.cfg.Rooms)
			s := e.Run(context.Background())
			reps := wait()
			checkClean(t, s)
			if s.Outcomes["success"] != e.cfg.Rooms {
				var b strings.Builder
				s.Print(&b)
				t.Fatalf("not every room succeeded:\n%s", b.String())
			}
			for id, r := range reps {
				if r.Status != room.Success {
					t.Errorf("prefill room %d ended %v/%v", id, r.Status, r.Reason)
				}
			}
			if s.BytesVerified == 0 || s.DummyNotifs != 0 || s.BadNotifs != 0 || s.Unsolicited != 0 {
				t.Errorf("summary %+v", s)
			}
			// Registration once per decode rank (primary and dummy) and prefill rank.
			if got := p.regs.Load(); got != 2 {
				t.Errorf("prefill saw %d registrations, want 2", got)
			}
		})
	}
}

// plan builds a one-off plan for tests that script a single room.
func plan(id uint64, pages int, abort workload.AbortKind) workload.Plan {
	return workload.Plan{Room: id, Pages: pages, Chunks: []int{pages}, Abort: abort}
}

func TestDecodeAbortAfterInfo(t *testing.T) {
	for _, ack := range []bool{false, true} {
		t.Run(map[bool]string{false: "baseline", true: "ack"}[ack], func(t *testing.T) {
			p := newPrefill(t, ack)
			e := newDecode(t, p, nil)
			const id = 4242
			p.eng.Open(id)
			p.eng.Init(id, 3, 0)
			res := e.RunRoom(context.Background(), plan(id, 3, workload.AbortDecodeAfterInfo))
			want := OutcomeAborted
			if ack {
				want = OutcomeAbortedAcked
			}
			if res.Outcome != want {
				t.Fatalf("decode outcome %v (%s), want %v", res.Outcome, res.Reason, want)
			}
			rep := p.waitTerminal(id, 10*time.Second)
			if rep.Status != room.Failed || rep.Reason != room.ReasonDecodeAbort {
				t.Fatalf("engine room %v/%v, want Failed/decode_abort", rep.Status, rep.Reason)
			}
			if rep.Reason.String() != "decode_abort" {
				t.Errorf("reason string %q", rep.Reason.String())
			}
			eventually(t, 5*time.Second, "the ABORT", func() bool { return p.abortsOf(id) == 1 })
			if pg, aux := e.Held(); pg != 0 || aux != 0 {
				t.Errorf("held %d pages %d aux", pg, aux)
			}
		})
	}
}

func TestDecodeAbortBeforeInfo(t *testing.T) {
	p := newPrefill(t, true)
	e := newDecode(t, p, nil)
	const id = 777
	res := e.RunRoom(context.Background(), plan(id, 2, workload.AbortDecodeBeforeInfo))
	if res.Outcome != OutcomeAbortedAcked || res.ReleaseTimedOut {
		t.Fatalf("decode outcome %v timedOut=%v", res.Outcome, res.ReleaseTimedOut)
	}
	// The sender opened after the ABORT must fail at once.
	rep := p.serve(plan(id, 2, workload.AbortNone))
	if rep.Status != room.Failed || rep.Reason != room.ReasonDecodeAbort {
		t.Fatalf("engine room %v/%v, want Failed/decode_abort", rep.Status, rep.Reason)
	}
	if p.infos.Load() != 0 {
		t.Errorf("a transfer info was sent")
	}
}

func TestPrefillAbortFailsRoomInAckMode(t *testing.T) {
	p := newPrefill(t, true)
	e := newDecode(t, p, nil)
	pl := workload.Plan{Room: 99, Pages: 4, Chunks: []int{2, 2}, Abort: workload.AbortPrefillMidTransfer}
	done := make(chan Result, 1)
	go func() { done <- e.RunRoom(context.Background(), pl) }()
	eventually(t, 5*time.Second, "the transfer info", func() bool { return p.infos.Load() == 1 })
	rep := p.serve(pl)
	if rep.Status != room.Failed || rep.Reason != room.ReasonClientAbort {
		t.Fatalf("engine room %v/%v", rep.Status, rep.Reason)
	}
	res := <-done
	if res.Outcome != OutcomeFailedStatus || res.Reason != room.ReasonClientAbort.String() {
		t.Fatalf("decode outcome %v reason %q", res.Outcome, res.Reason)
	}
	if pg, _ := e.Held(); pg != 0 {
		t.Errorf("held %d pages", pg)
	}
}

func TestWaitingTimeoutSendsAbort(t *testing.T) {
	p := newPrefill(t, false)
	clk := clock.NewFake(time.Unix(0, 0))
	e := newDecode(t, p, func(c *Config) { c.Clock = clk; c.WaitingTimeout = 3 * time.Second })
	const id = 31337
	done := make(chan Result, 1)
	go func() { done <- e.RunRoom(context.Background(), plan(id, 2, workload.AbortNone)) }()
	eventually(t, 5*time.Second, "the transfer info", func() bool { return p.infos.Load() == 1 })
	eventually(t, 5*time.Second, "the waiting timer", func() bool { return clk.Pending() >= 2 }) // heartbeat + waiting
	clk.Advance(3 * time.Second)
	res := <-done
	if res.Outcome != OutcomeWaitingTimeout {
		t.Fatalf("outcome %v", res.Outcome)
	}
	eventually(t, 5*time.Second, "the ABORT", func() bool { return p.abortsOf(id) == 1 })
	if pg, aux := e.Held(); pg != 0 || aux != 0 {
		t.Errorf("held %d pages %d aux", pg, aux)
	}
}

func TestHeartbeatLossFailsRoomsAndReregisters(t *testing.T) {
	p := newPrefill(t, false)
	clk := clock.NewFake(time.Unix(0, 0))
	e := newDecode(t, p, func(c *Config) { c.Clock = clk; c.HeartbeatInterval = 5 * time.Second })
	const id = 555
	done := make(chan Result, 1)
	go func() { done <- e.RunRoom(context.Background(), plan(id, 2, workload.AbortNone)) }()
	eventually(t, 5*time.Second, "the transfer info", func() bool { return p.infos.Load() == 1 })
	if got := p.regs.Load(); got != 1 {
		t.Fatalf("%d registrations before the loss", got)
	}
	p.healthDown.Store(true)
	clk.Advance(5 * time.Second) // one failure: nothing yet
	select {
	case r := <-done:
		t.Fatalf("room ended after one heartbeat failure: %v", r.Outcome)
	default:
	}
	clk.Advance(5 * time.Second) // second consecutive failure: prefill lost
	res := <-done
	if res.Outcome != OutcomeLostConnection {
		t.Fatalf("outcome %v", res.Outcome)
	}
	if pg, aux := e.Held(); pg != 0 || aux != 0 {
		t.Errorf("held %d pages %d aux", pg, aux)
	}
	p.healthDown.Store(false)
	clk.Advance(5 * time.Second)
	// The next room looks the prefill up again and registers again.
	const id2 = 556
	go func() { done <- e.RunRoom(context.Background(), plan(id2, 2, workload.AbortNone)) }()
	rep := p.serve(plan(id2, 2, workload.AbortNone))
	if rep.Status != room.Success {
		t.Fatalf("engine room %v/%v", rep.Status, rep.Reason)
	}
	if res := <-done; res.Outcome != OutcomeSuccess || res.WrongBytes != 0 || res.AuxError != "" {
		t.Fatalf("second room %+v", res)
	}
	if got := p.regs.Load(); got != 2 {
		t.Fatalf("%d registrations, want 2 (re-registered after the loss)", got)
	}
	if e.c.heartbeatLosses.Load() != 1 {
		t.Errorf("heartbeat losses %d", e.c.heartbeatLosses.Load())
	}
}

// TestMixedWorkloadAckMode runs every abort kind of the shared rule against the
// engine in ack mode: nothing may be wrong or held, and each planned abort must
// end the way its kind implies.
func TestMixedWorkloadAckMode(t *testing.T) {
	p := newPrefill(t, true)
	e := newDecode(t, p, func(c *Config) {
		c.Workload.AbortShare, c.Workload.DummyShare, c.Workload.PrefixShare = 0.5, 0.2, 0.2
		c.Rooms = 80
	})
	wait := serveAll(p, e.cfg.Workload, e.cfg.Rooms)
	s := e.Run(context.Background())
	wait()
	checkClean(t, s)
	var b strings.Builder
	s.Print(&b)
	if s.Unexpected != 0 || s.ReleaseTimeouts != 0 || s.Outcomes["error"] != 0 || s.Outcomes["waiting_timeout"] != 0 {
		t.Fatalf("unexpected outcomes:\n%s", b.String())
	}
	for kind, m := range s.ByPlan {
		for o := range m {
			ok := map[string][]string{
				"none":                 {"success"},
				"decode-before-info":   {"aborted_acked"},
				"decode-after-info":    {"aborted_acked", "success"},
				"prefill-client":       {"failed_kv_status"},
				"prefill-mid-transfer": {"failed_kv_status"},
			}[kind]
			if !contains(ok, o) {
				t.Errorf("plan %s ended %s\n%s", kind, o, b.String())
			}
		}
	}
	t.Log(b.String())
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// TestTwoPrefillRanks: decode TP 1 against prefill TP 2. MHA: both ranks are
// real and decode needs a response from each (distinct sender ids). MLA: rank 1
// gets a dummy transfer info and decode needs rank 0 only.
func TestTwoPrefillRanks(t *testing.T) {
	for _, mla := range []bool{false, true} {
		t.Run(map[bool]string{false: "mha", true: "mla"}[mla], func(t *testing.T) {
			p0 := newPrefillRank(t, false, 2, 0, nil)
			p1 := newPrefillRank(t, false, 2, 1, p0)
			e := newDecode(t, p0, func(c *Config) { c.MLA = mla; c.LaterFrames = true })
			_, m := e.Info()
			if want := map[bool]int{false: 2, true: 1}[mla]; m.RequiredPrefillResponses != want || len(m.TPRanks) != 2 {
				t.Fatalf("mapping %+v", m)
			}
			pl := workload.Plan{Room: 1001, Pages: 3, Chunks: []int{2, 1}}
			done := make(chan Result, 1)
			go func() { done <- e.RunRoom(context.Background(), pl) }()
			reps := make(chan room.Reply, 2)
			for _, p := range []*prefill{p0, p1} {
				go func() { reps <- p.serve(pl) }()
			}
			for range 2 {
				if r := <-reps; r.Status != room.Success {
					t.Fatalf("prefill room %v/%v", r.Status, r.Reason)
				}
			}
			res := <-done
			if res.Outcome != OutcomeSuccess || res.WrongBytes != 0 || res.AuxError != "" || res.BytesVerified == 0 {
				t.Fatalf("decode %+v", res)
			}
			if p0.regs.Load() != 1 || p1.regs.Load() != 1 {
				t.Errorf("registrations %d, %d", p0.regs.Load(), p1.regs.Load())
			}
		})
	}
}

// TestStateIndices: a hybrid-model room carries state indices; decode expects
// the state notification before it calls the room done.
func TestStateIndices(t *testing.T) {
	for _, send := range []bool{true, false} {
		p := newPrefill(t, true)
		p.sendState = send
		e := newDecode(t, p, func(c *Config) { c.State = true; c.WaitingTimeout = 300 * time.Millisecond })
		pl := workload.Plan{Room: 2002, Pages: 2, Chunks: []int{1, 1}}
		done := make(chan Result, 1)
		go func() { done <- e.RunRoom(context.Background(), pl) }()
		eventually(t, 5*time.Second, "the transfer info", func() bool { return p.infos.Load() == 1 })
		p.serve(pl)
		res := <-done
		if send && (res.Outcome != OutcomeSuccess || res.WrongBytes != 0 || res.AuxError != "") {
			t.Fatalf("with state: %+v", res)
		}
		// Without state the completion rule could never hold; kvxfer fails the
		// room as an invalid request and says so (ack mode).
		if !send && (res.Outcome != OutcomeFailedStatus || res.Reason != room.ReasonInvalidRequest.String()) {
			t.Fatalf("without state: %+v", res)
		}
	}
}
