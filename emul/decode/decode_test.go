package decode

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

func newDecode(t *testing.T, p *prefill, rel Release, mod func(*Config)) *Emulator {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Bootstrap = p.http.URL
	cfg.Shape = testShape()
	cfg.PageSize, cfg.KVCacheDtype = 16, "auto"
	cfg.Release = rel
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

// forEachRelease runs f as a subtest per SGLang release.
func forEachRelease(t *testing.T, f func(t *testing.T, rel Release)) {
	for _, rel := range Releases() {
		t.Run(rel.String(), func(t *testing.T) { f(t, rel) })
	}
}

// serveAll plays the prefill scheduler for plans [0, n): both sides derive
// each room from (seed, index). Rooms start in index order, as on decode: two
// bounded windows that both advance in index order always overlap, so
// neither side waits on a room the other has not started.
func serveAll(p *prefill, plan func(int) workload.Plan, n int) (wait func() map[uint64]kv.Reply) {
	var mu sync.Mutex
	out := map[uint64]kv.Reply{}
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
				pl := plan(i)
				rep := p.serve(pl)
				mu.Lock()
				out[pl.Room] = rep
				mu.Unlock()
			}()
		}
	}()
	return func() map[uint64]kv.Reply { wg.Wait(); return out }
}

// runPlans is Run over explicit plans (the same in-order window).
func runPlans(e *Emulator, plan func(int) workload.Plan, n int) *Summary {
	results := make([]Result, n)
	sem := make(chan struct{}, e.cfg.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i] = e.RunRoom(context.Background(), plan(i))
		}()
	}
	wg.Wait()
	return e.summarize(results, time.Since(start))
}

func printed(s *Summary) string {
	var b strings.Builder
	s.Print(&b)
	return b.String()
}

func checkClean(t *testing.T, s *Summary) {
	t.Helper()
	if err := s.Err(); err != nil {
		t.Fatalf("%v\n%s", err, printed(s))
	}
}

func wantCompletedBy(rel Release) string {
	if rel.Notifs() {
		return CompletedByNotifs
	}
	return CompletedByStatus
}

func TestWorkloadSucceedsWithBytesVerified(t *testing.T) {
	forEachRelease(t, func(t *testing.T, rel Release) {
		p := newPrefill(t, prefillOpts{})
		e := newDecode(t, p, rel, func(c *Config) {
			c.Workload.DummyShare, c.Workload.PrefixShare = 0.3, 0.3
			c.Rate = 4000 // paced: 40 rooms over ~10 ms
		})
		wait := serveAll(p, e.cfg.Workload.Plan, e.cfg.Rooms)
		s := e.Run(context.Background())
		reps := wait()
		checkClean(t, s)
		if s.Outcomes["success"] != e.cfg.Rooms || s.CompletedBy[wantCompletedBy(rel)] != e.cfg.Rooms {
			t.Fatalf("not every room succeeded by %s:\n%s", wantCompletedBy(rel), printed(s))
		}
		for id, r := range reps {
			if r.Status != kv.StatusSuccess {
				t.Errorf("prefill room %d ended %v/%v", id, r.Status, r.Reason)
			}
		}
		if s.BytesVerified == 0 || s.DummyNotifs != 0 || s.BadNotifs != 0 || s.UnreadNotifs != 0 || s.Queued != 0 || s.ForeignRanks != 0 {
			t.Errorf("summary:\n%s", printed(s))
		}
		// Registration once per decode rank (primary and dummy) and prefill rank.
		if got := p.regs.Load(); got != 2 {
			t.Errorf("prefill saw %d registrations, want 2", got)
		}
		if got := p.regFrames.Load(); got != int64(rel.RegistrationFrames()) {
			t.Errorf("registration has %d frames after the guard, want %d", got, rel.RegistrationFrames())
		}
	})
}

// plan builds a one-off plan for tests that script a single room.
func plan(id uint64, pages int, abort workload.AbortKind) workload.Plan {
	return workload.Plan{Room: id, Pages: pages, Chunks: []int{pages}, Abort: abort}
}

// wantDeferred is how an armed abort or a failure releases the room's pages.
func wantDeferred(rel Release) ReleaseKind {
	if rel.Defers() {
		return ReleaseByAck
	}
	return ReleaseAtOnce
}

func TestDecodeAbortAfterInfo(t *testing.T) {
	forEachRelease(t, func(t *testing.T, rel Release) {
		p := newPrefill(t, prefillOpts{})
		e := newDecode(t, p, rel, nil)
		const id = 4242
		p.eng.Open(id)
		p.eng.Init(id, 3, 0)
		res := e.RunRoom(context.Background(), plan(id, 3, workload.AbortDecodeAfterInfo))
		if res.Outcome != OutcomeAborted || res.Release != wantDeferred(rel) {
			t.Fatalf("decode outcome %v (%s) release %v, want aborted / %v", res.Outcome, res.Reason, res.Release, wantDeferred(rel))
		}
		rep := p.waitTerminal(id, 10*time.Second)
		if rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonDecodeAbort {
			t.Fatalf("engine room %v/%v, want Failed/decode_abort", rep.Status, rep.Reason)
		}
		eventually(t, 5*time.Second, "the ABORT", func() bool { return p.abortsOf(id) == 1 })
		gen, hasGen := p.genOf(id)
		if hasGen != rel.Generations() || hasGen && (gen != 1 || res.Generation != 1) {
			t.Errorf("ABORT generation %d (present %v), result %d; want one from 0.5.22, the first being 1", gen, hasGen, res.Generation)
		}
		if pg, aux := e.Held(); pg != 0 || aux != 0 {
			t.Errorf("held %d pages %d aux", pg, aux)
		}
		if rel == Release0518 {
			// kvxferd takes a 23-frame decode for 0.5.20 and ACKs; 0.5.18
			// never reads it: it queues, counted and not acted on.
			eventually(t, 5*time.Second, "the queued ABORT_ACK", func() bool { return e.pullCount("ABORT_ACK 3 frames") == 1 })
		}
	})
}

func (e *Emulator) pullCount(kind string) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.c.pull[kind]
}

func TestDecodeAbortBeforeInfo(t *testing.T) {
	forEachRelease(t, func(t *testing.T, rel Release) {
		p := newPrefill(t, prefillOpts{})
		e := newDecode(t, p, rel, nil)
		const id = 777
		res := e.RunRoom(context.Background(), plan(id, 2, workload.AbortDecodeBeforeInfo))
		if res.Outcome != OutcomeAborted || res.Release != ReleaseNone {
			t.Fatalf("decode outcome %v release %v", res.Outcome, res.Release)
		}
		eventually(t, 5*time.Second, "the ABORT", func() bool { return p.abortsOf(id) == 1 })
		if _, hasGen := p.genOf(id); hasGen {
			t.Errorf("an unarmed ABORT carried a generation")
		}
		// The sender opened after the ABORT must fail at once.
		rep := p.serve(plan(id, 2, workload.AbortNone))
		if rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonDecodeAbort {
			t.Fatalf("engine room %v/%v, want Failed/decode_abort", rep.Status, rep.Reason)
		}
		if p.infos.Load() != 0 {
			t.Errorf("a transfer info was sent")
		}
	})
}

// TestPrefillAbort: the scheduler aborts mid-transfer. 0.5.20+ learn it from
// KV_STATUS "0"; 0.5.21+ then ABORT (armed) and hold the pages until the ACK.
// 0.5.18 never reads the status (it queues) and ends on its waiting timeout.
func TestPrefillAbort(t *testing.T) {
	forEachRelease(t, func(t *testing.T, rel Release) {
		p := newPrefill(t, prefillOpts{})
		clk := clock.NewFake(time.Unix(0, 0))
		e := newDecode(t, p, rel, func(c *Config) { c.Clock = clk; c.WaitingTimeout = 3 * time.Second })
		pl := workload.Plan{Room: 99, Pages: 4, Chunks: []int{2, 2}, Abort: workload.AbortPrefillMidTransfer}
		done := make(chan Result, 1)
		go func() { done <- e.RunRoom(context.Background(), pl) }()
		eventually(t, 5*time.Second, "the transfer info", func() bool { return p.infos.Load() == 1 })
		rep := p.serve(pl)
		if rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonClientAbort {
			t.Fatalf("engine room %v/%v", rep.Status, rep.Reason)
		}
		if rel == Release0518 {
			eventually(t, 5*time.Second, "the queued KV_STATUS", func() bool { return e.pullCount("KV_STATUS 0") == 1 })
			select {
			case r := <-done:
				t.Fatalf("0.5.18 ended the room without its waiting timeout: %+v", r)
			default:
			}
			eventually(t, 5*time.Second, "the waiting timer", func() bool { return clk.Pending() >= 2 }) // heartbeat + waiting
			clk.Advance(3 * time.Second)
		}
		res := <-done
		want := OutcomeFailedStatus
		if rel == Release0518 {
			want = OutcomeWaitingTimeout
		}
		if res.Outcome != want || res.Release != wantDeferred(rel) {
			t.Fatalf("decode outcome %v (%q) release %v, want %v / %v", res.Outcome, res.Reason, res.Release, want, wantDeferred(rel))
		}
		if want == OutcomeFailedStatus && res.Reason != kv.ReasonClientAbort.String() {
			t.Errorf("reason %q", res.Reason)
		}
		// ABORTs: 0.5.18 on its waiting timeout; 0.5.21+ after the failure
		// (force_arm); 0.5.20 none.
		wantAborts := map[Release]int{Release0518: 1, Release0520: 0}[rel]
		if rel.Defers() {
			wantAborts = 1
		}
		if wantAborts > 0 {
			eventually(t, 5*time.Second, "the ABORT", func() bool { return p.abortsOf(pl.Room) == wantAborts })
		} else if n := p.abortsOf(pl.Room); n != 0 {
			t.Errorf("0.5.20 sent %d ABORTs after a failure", n)
		}
		if pg, _ := e.Held(); pg != 0 {
			t.Errorf("held %d pages", pg)
		}
	})
}

func TestWaitingTimeoutSendsAbort(t *testing.T) {
	forEachRelease(t, func(t *testing.T, rel Release) {
		p := newPrefill(t, prefillOpts{})
		clk := clock.NewFake(time.Unix(0, 0))
		e := newDecode(t, p, rel, func(c *Config) { c.Clock = clk; c.WaitingTimeout = 3 * time.Second })
		const id = 31337
		done := make(chan Result, 1)
		go func() { done <- e.RunRoom(context.Background(), plan(id, 2, workload.AbortNone)) }()
		eventually(t, 5*time.Second, "the transfer info", func() bool { return p.infos.Load() == 1 })
		eventually(t, 5*time.Second, "the waiting timer", func() bool { return clk.Pending() >= 2 }) // heartbeat + waiting
		clk.Advance(3 * time.Second)
		res := <-done
		if res.Outcome != OutcomeWaitingTimeout || res.Release != wantDeferred(rel) {
			t.Fatalf("outcome %v release %v", res.Outcome, res.Release)
		}
		eventually(t, 5*time.Second, "the ABORT", func() bool { return p.abortsOf(id) == 1 })
		if _, hasGen := p.genOf(id); hasGen != rel.Generations() {
			t.Errorf("generation present %v", hasGen)
		}
		if pg, aux := e.Held(); pg != 0 || aux != 0 {
			t.Errorf("held %d pages %d aux", pg, aux)
		}
	})
}

// TestZeroFiveTwentyThreeCompletesOnlyOnKVStatus: notifications do not
// complete a 0.5.23 room (it never reads them), KV_STATUS "4" does, and only
// from N distinct prefill_rank values (N = 2: decode TP 1, prefill TP 2, MHA).
func TestZeroFiveTwentyThreeCompletesOnlyOnKVStatus(t *testing.T) {
	o := prefillOpts{notifsToAll: true, noSuccessStatus: true}
	p0 := newPrefillRank(t, o, 2, 0, nil)
	p1 := newPrefillRank(t, o, 2, 1, p0)
	e := newDecode(t, p0, Release0523, nil)
	if _, m := e.Info(); m.RequiredPrefillResponses != 2 {
		t.Fatalf("mapping %+v", m)
	}
	pl := workload.Plan{Room: 5023, Pages: 3, Chunks: []int{2, 1}}
	done := make(chan Result, 1)
	go func() { done <- e.RunRoom(context.Background(), pl) }()
	reps := make(chan kv.Reply, 2)
	for _, p := range []*prefill{p0, p1} {
		go func() { reps <- p.serve(pl) }()
	}
	for range 2 {
		if r := <-reps; r.Status != kv.StatusSuccess {
			t.Fatalf("prefill room %v/%v", r.Status, r.Reason)
		}
	}
	// Every byte has landed and the notifications were posted; decode saw
	// them and did not act.
	eventually(t, 5*time.Second, "the unread notifications", func() bool { return e.c.unreadNotifs.Load() > 0 })
	status := func(rank int) {
		p0.sendTo(kv.Endpoint{IP: "127.0.0.1", Port: e.Port()},
			(&wire.KVStatus{Room: pl.Room, Status: kv.StatusSuccess, PrefillRank: rank}).Encode())
	}
	status(0)
	status(0) // the same rank twice is still one
	eventually(t, 5*time.Second, "two KV_STATUS", func() bool { return e.pullCount("KV_STATUS 4") == 2 })
	select {
	case r := <-done:
		t.Fatalf("room ended before N distinct prefill ranks reported success: %+v", r)
	default:
	}
	status(1)
	res := <-done
	if res.Outcome != OutcomeSuccess || res.CompletedBy != CompletedByStatus || res.WrongBytes != 0 || res.AuxError != "" || res.BytesVerified == 0 {
		t.Fatalf("decode %+v", res)
	}
}

// TestKVStatusCompletesLegacyReleases: 0.5.20-0.5.22 also complete on
// KV_STATUS "4" alone; 0.5.18 does not read it.
func TestKVStatusCompletesLegacyReleases(t *testing.T) {
	for _, rel := range []Release{Release0520, Release0521, Release0522} {
		t.Run(rel.String(), func(t *testing.T) {
			p := newPrefill(t, prefillOpts{statusOnly: true})
			e := newDecode(t, p, rel, nil)
			pl := plan(6001, 2, workload.AbortNone)
			done := make(chan Result, 1)
			go func() { done <- e.RunRoom(context.Background(), pl) }()
			if r := p.serve(pl); r.Status != kv.StatusSuccess {
				t.Fatalf("prefill room %v/%v", r.Status, r.Reason)
			}
			res := <-done
			if res.Outcome != OutcomeSuccess || res.CompletedBy != CompletedByStatus || res.WrongBytes != 0 {
				t.Fatalf("decode %+v", res)
			}
		})
	}
}

// TestGenerationlessAcksIgnored: against a prefill that answers ABORT with
// 3-frame ACKs (no generation), 0.5.21 releases on them; 0.5.22+ ignore them
// and stale generations too, and hold the pages until the release timeout.
func TestGenerationlessAcksIgnored(t *testing.T) {
	for _, rel := range []Release{Release0521, Release0522, Release0523} {
		t.Run(rel.String(), func(t *testing.T) {
			p := newPrefill(t, prefillOpts{stripGen: true})
			clk := clock.NewFake(time.Unix(0, 0))
			e := newDecode(t, p, rel, func(c *Config) { c.Clock = clk; c.ReleaseTimeout = 30 * time.Second })
			const id = 5022
			p.eng.Open(id)
			p.eng.Init(id, 2, 0)
			done := make(chan Result, 1)
			go func() { done <- e.RunRoom(context.Background(), plan(id, 2, workload.AbortDecodeAfterInfo)) }()
			eventually(t, 5*time.Second, "the ABORT_ACK", func() bool { return e.pullCount("ABORT_ACK 3 frames") == 1 })
			if !rel.Generations() {
				if res := <-done; res.Release != ReleaseByAck || e.c.acksCounted.Load() != 1 {
					t.Fatalf("0.5.21 did not release on the 3-frame ACK: %+v", res)
				}
				return
			}
			// A 4-frame ACK with another generation is ignored too.
			p.sendTo(kv.Endpoint{IP: "127.0.0.1", Port: e.Port()},
				(&wire.AbortAck{Room: id, PrefillRank: 0, Generation: 99, HasGen: true}).Encode())
			eventually(t, 5*time.Second, "the stale ACK", func() bool { return e.c.acksStale.Load() == 1 })
			if n := e.c.acksNoGen.Load(); n != 1 {
				t.Fatalf("generation-less ACKs ignored: %d", n)
			}
			select {
			case r := <-done:
				t.Fatalf("released on an ignored ACK: %+v", r)
			default:
			}
			if pg, _ := e.Held(); pg != 2 {
				t.Fatalf("%d pages held during the hold, want 2", pg)
			}
			eventually(t, 5*time.Second, "the release timer", func() bool { return clk.Pending() >= 3 }) // heartbeat + waiting + release
			clk.Advance(30 * time.Second)
			res := <-done
			if res.Outcome != OutcomeAborted || res.Release != ReleaseByTimeout || res.Generation != 1 {
				t.Fatalf("decode %+v", res)
			}
			s := e.summarize([]Result{res}, time.Second)
			if s.PagesByTimeout != 2 || s.AcksNoGen != 1 || s.AcksStale != 1 || s.AcksCounted != 0 {
				t.Fatalf("summary:\n%s", printed(s))
			}
		})
	}
}

func TestHeartbeatLossFailsRoomsAndReregisters(t *testing.T) {
	for _, rel := range []Release{Release0518, Release0523} {
		t.Run(rel.String(), func(t *testing.T) {
			p := newPrefill(t, prefillOpts{})
			clk := clock.NewFake(time.Unix(0, 0))
			e := newDecode(t, p, rel, func(c *Config) { c.Clock = clk; c.HeartbeatInterval = 5 * time.Second })
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
			if rep.Status != kv.StatusSuccess {
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
		})
	}
}

// TestMixedWorkload runs every abort kind of the shared rule against the
// engine, per release: nothing may be wrong or held, and each planned abort
// must end the way its kind implies. 0.5.18 learns of a prefill-side abort
// only from its waiting timeout (TestPrefillAbort covers it on a fake clock),
// so its run leaves those out: both sides play them as plain rooms.
func TestMixedWorkload(t *testing.T) {
	forEachRelease(t, func(t *testing.T, rel Release) {
		p := newPrefill(t, prefillOpts{})
		e := newDecode(t, p, rel, func(c *Config) {
			c.Workload.AbortShare, c.Workload.DummyShare, c.Workload.PrefixShare = 0.5, 0.2, 0.2
			c.Rooms = 80
		})
		planOf := e.cfg.Workload.Plan
		if rel == Release0518 {
			planOf = func(i int) workload.Plan {
				pl := e.cfg.Workload.Plan(i)
				if pl.Abort.ByPrefill() {
					pl.Abort = workload.AbortNone
				}
				return pl
			}
		}
		wait := serveAll(p, planOf, e.cfg.Rooms)
		s := runPlans(e, planOf, e.cfg.Rooms)
		wait()
		checkClean(t, s)
		if s.Unexpected != 0 || s.ReleaseTimeouts != 0 || s.Outcomes["error"] != 0 || s.Outcomes["waiting_timeout"] != 0 {
			t.Fatalf("unexpected outcomes:\n%s", printed(s))
		}
		for kind, m := range s.ByPlan {
			for o := range m {
				ok := map[string][]string{
					"none":                 {"success"},
					"decode-before-info":   {"aborted"},
					"decode-after-info":    {"aborted", "success"},
					"prefill-client":       {"failed_kv_status"},
					"prefill-mid-transfer": {"failed_kv_status"},
				}[kind]
				if !contains(ok, o) {
					t.Errorf("plan %s ended %s\n%s", kind, o, printed(s))
				}
			}
		}
		if rel.Defers() && s.Releases["by_ack"] == 0 || !rel.Defers() && s.Releases["by_ack"] != 0 {
			t.Errorf("releases by ACK:\n%s", printed(s))
		}
		// Generation-less ACKs may answer unarmed ABORTs (decode-before-info)
		// while the prefill still takes this 23-frame decode for 0.5.20; an
		// ACK with a wrong generation would be a bug.
		if rel.Generations() && s.AcksStale != 0 {
			t.Errorf("kvxfer echoed a wrong generation:\n%s", printed(s))
		}
		t.Log(printed(s))
	})
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
// real and decode needs a response from each (distinct sender ids, or
// distinct prefill_rank values for KV_STATUS). MLA: rank 1 gets a dummy
// transfer info and decode needs rank 0 only.
func TestTwoPrefillRanks(t *testing.T) {
	forEachRelease(t, func(t *testing.T, rel Release) {
		for _, mla := range []bool{false, true} {
			t.Run(map[bool]string{false: "mha", true: "mla"}[mla], func(t *testing.T) {
				p0 := newPrefillRank(t, prefillOpts{}, 2, 0, nil)
				p1 := newPrefillRank(t, prefillOpts{}, 2, 1, p0)
				e := newDecode(t, p0, rel, func(c *Config) { c.MLA = mla })
				_, m := e.Info()
				if want := map[bool]int{false: 2, true: 1}[mla]; m.RequiredPrefillResponses != want || len(m.TPRanks) != 2 {
					t.Fatalf("mapping %+v", m)
				}
				pl := workload.Plan{Room: 1001, Pages: 3, Chunks: []int{2, 1}}
				done := make(chan Result, 1)
				go func() { done <- e.RunRoom(context.Background(), pl) }()
				reps := make(chan kv.Reply, 2)
				for _, p := range []*prefill{p0, p1} {
					go func() { reps <- p.serve(pl) }()
				}
				for range 2 {
					if r := <-reps; r.Status != kv.StatusSuccess {
						t.Fatalf("prefill room %v/%v", r.Status, r.Reason)
					}
				}
				res := <-done
				if res.Outcome != OutcomeSuccess || res.CompletedBy != wantCompletedBy(rel) || res.WrongBytes != 0 || res.AuxError != "" || res.BytesVerified == 0 {
					t.Fatalf("decode %+v", res)
				}
				if p0.regs.Load() != 1 || p1.regs.Load() != 1 {
					t.Errorf("registrations %d, %d", p0.regs.Load(), p1.regs.Load())
				}
			})
		}
	})
}

// TestStateIndices: a hybrid-model room carries state indices; decode expects
// the state notification (or kvxferd's success status) before it calls the
// room done. Without state from the scheduler, kvxfer fails the room as an
// invalid request and says so.
func TestStateIndices(t *testing.T) {
	for _, rel := range []Release{Release0520, Release0523} {
		t.Run(rel.String(), func(t *testing.T) {
			for _, send := range []bool{true, false} {
				p := newPrefill(t, prefillOpts{})
				p.sendState = send
				e := newDecode(t, p, rel, func(c *Config) { c.State = true })
				pl := workload.Plan{Room: 2002, Pages: 2, Chunks: []int{1, 1}}
				done := make(chan Result, 1)
				go func() { done <- e.RunRoom(context.Background(), pl) }()
				eventually(t, 5*time.Second, "the transfer info", func() bool { return p.infos.Load() == 1 })
				p.serve(pl)
				res := <-done
				if send && (res.Outcome != OutcomeSuccess || res.WrongBytes != 0 || res.AuxError != "") {
					t.Fatalf("with state: %+v", res)
				}
				if !send && (res.Outcome != OutcomeFailedStatus || res.Reason != kv.ReasonInvalidRequest.String()) {
					t.Fatalf("without state: %+v", res)
				}
			}
		})
	}
}

func TestParseRelease(t *testing.T) {
	for _, rel := range Releases() {
		got, err := ParseRelease(rel.String())
		if err != nil || got != rel {
			t.Errorf("%s: %v %v", rel, got, err)
		}
	}
	if got, _ := ParseRelease("v0.5.21"); got != Release0521 || got.Dialect() != wire.Dialect0520 {
		t.Errorf("v0.5.21: %v", got)
	}
	for _, bad := range []string{"", "0.5.19", "auto", "baseline"} {
		if _, err := ParseRelease(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
