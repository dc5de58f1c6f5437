package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

func TestHeartbeatBudgetFromSGLangVariables(t *testing.T) {
	for _, c := range []struct {
		interval, failures string
		want               time.Duration
	}{
		{"", "", 10 * time.Second},            // SGLang's defaults: 5 s × 2
		{"3", "4", 12 * time.Second},          // both set
		{"1", "2", 4 * time.Second},           // interval floored at 2 s, as SGLang's max(v, 2.0)
		{"2.5", "0", 2500 * time.Millisecond}, // failures floored at 1
		{"x", "y", 10 * time.Second},          // unparsable: defaults
		{"NaN", "3", 15 * time.Second},        // NaN: default interval
	} {
		env := map[string]string{EnvHeartbeatInterval: c.interval, EnvHeartbeatMaxFailure: c.failures}
		iv, n := HeartbeatBudget(func(k string) string { return env[k] })
		if got := iv * time.Duration(n); got != c.want {
			t.Errorf("interval %q failures %q: budget %v, want %v", c.interval, c.failures, got, c.want)
		}
		cfg := LivenessConfig{}.withDefaults(func(k string) string { return env[k] })
		if cfg.Budget != c.want || cfg.FenceHold != sglangHeartbeatAttempt+iv {
			t.Errorf("interval %q failures %q: config %+v", c.interval, c.failures, cfg)
		}
	}
	env := map[string]string{EnvLossAfter: "3.5", EnvProbeInterval: "250ms", EnvProbeTimeout: "2s", EnvFenceHold: "7s"}
	cfg := LivenessConfig{}.withDefaults(func(k string) string { return env[k] })
	if cfg.Off || !(LivenessConfig{}.withDefaults(func(k string) string { return map[string]string{EnvLiveness: "off"}[k] })).Off {
		t.Error("KVXFER_PEER_LIVENESS=off")
	}
	if cfg.Budget != 3500*time.Millisecond || cfg.Interval != 250*time.Millisecond || cfg.Timeout != 250*time.Millisecond ||
		cfg.FenceHold != 7*time.Second {
		t.Errorf("KVXFER_PEER_* overrides: %+v", cfg)
	}
}

// livenessRig is a liveness alone on a fake clock with fake probes, recording
// what it reports.
type livenessRig struct {
	clk    *clock.Fake
	probes *fakeProbes
	l      *liveness
	mu     sync.Mutex
	events []string
}

func newLivenessRig(cfg LivenessConfig) *livenessRig {
	r := &livenessRig{clk: clock.NewFake(time.Unix(1000, 0)), probes: &fakeProbes{}}
	cfg.Clock, cfg.Probe = r.clk, r.probes.probe
	r.l = newLiveness(cfg, nil, func(at kv.Endpoint, why string, fence bool) {
		r.record("lost", fence, r.clk.Now())
	}, func(at kv.Endpoint, alive bool) {
		r.record("back", alive, r.clk.Now())
	})
	return r
}

func (r *livenessRig) record(kind string, flag bool, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, kind+map[bool]string{true: "+", false: "-"}[flag]+"@"+at.Sub(time.Unix(1000, 0)).String())
}

func (r *livenessRig) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func (r *livenessRig) step(n int) {
	for range n {
		r.clk.Advance(time.Second)
	}
}

func sameEvents(a, b []string) bool {
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

// The outage counts from the last probe that was answered; the decode is lost
// (fenced) when it reaches the budget, once; the fence ends only after the
// endpoint has answered every probe for FenceHold.
func TestLivenessOutageFromTheLastAnswerAndFenceHold(t *testing.T) {
	r := newLivenessRig(LivenessConfig{Interval: time.Second, Budget: 10 * time.Second, FenceHold: 7 * time.Second})
	defer r.l.close()
	at := kv.Endpoint{IP: "192.0.2.2", Port: 5000}
	r.l.watch(at)
	r.step(3) // answered at 1, 2, 3 s
	r.probes.set(at, ProbeUnreachable)
	r.step(9) // 4..12 s: 9 s since the last answer
	if ev := r.got(); len(ev) != 0 {
		t.Fatalf("lost before the budget: %v", ev)
	}
	if out, ok := r.l.outage(at); !ok || out != 9*time.Second {
		t.Fatalf("outage %v %v", out, ok)
	}
	r.step(1) // 13 s: 10 s since the last answer
	if ev := r.got(); !sameEvents(ev, []string{"lost+@13s"}) {
		t.Fatalf("events %v", ev)
	}
	r.step(5) // still unreachable: lost once
	r.probes.set(at, ProbeOK)
	r.step(3) // answering from 21 s
	r.probes.set(at, ProbeUnreachable)
	r.step(1) // a failure restarts the hold
	r.probes.set(at, ProbeOK)
	r.step(7) // 23..29 s: 6 s of answers since 23 s
	if ev := r.got(); !sameEvents(ev, []string{"lost+@13s"}) {
		t.Fatalf("fence ended early: %v", ev)
	}
	r.step(1) // 30 s: answered for 7 s
	if ev := r.got(); !sameEvents(ev, []string{"lost+@13s", "back+@30s"}) {
		t.Fatalf("events %v", ev)
	}
	if _, ok := r.l.outage(at); ok {
		t.Fatal("still watched after the fence ended")
	}
	if r.clk.Pending() != 0 {
		t.Fatalf("%d timers left", r.clk.Pending())
	}
}

// A refused probe (nothing listens: the process is gone) is a loss at once,
// without waiting for the budget and without a fence; kick probes now.
func TestLivenessRefusedIsLostAtOnce(t *testing.T) {
	r := newLivenessRig(LivenessConfig{Interval: time.Second, Budget: 10 * time.Second})
	defer r.l.close()
	at := kv.Endpoint{IP: "192.0.2.2", Port: 5001}
	if r.l.kick(at) {
		t.Fatal("kick of an endpoint not watched")
	}
	r.l.watch(at)
	r.probes.set(at, ProbeRefused)
	if !r.l.kick(at) {
		t.Fatal("kick of a watched endpoint")
	}
	if ev := r.got(); !sameEvents(ev, []string{"lost-@0s"}) {
		t.Fatalf("events %v", ev)
	}
	r.step(20)
	if ev := r.got(); len(ev) != 1 || r.probes.n.Load() != 1 {
		t.Fatalf("events %v after the endpoint was forgotten (%d probes)", ev, r.probes.n.Load())
	}
}

// A new registration at a fenced endpoint ends the fence: the fenced agents
// are past (forgotten, not loaded again), and the endpoint is watched afresh.
func TestLivenessRegistrationAtAFencedEndpoint(t *testing.T) {
	r := newLivenessRig(LivenessConfig{Interval: time.Second, Budget: 2 * time.Second})
	defer r.l.close()
	at := kv.Endpoint{IP: "192.0.2.2", Port: 5002}
	r.l.watch(at)
	r.probes.set(at, ProbeUnreachable)
	r.step(2)
	r.l.watch(at)
	r.step(1)
	if ev := r.got(); !sameEvents(ev, []string{"lost+@2s", "back-@2s"}) {
		t.Fatalf("events %v", ev)
	}
	if out, ok := r.l.outage(at); !ok || out != time.Second {
		t.Fatalf("watched afresh: outage %v %v", out, ok)
	}
}

// livenessDaemon is a daemon whose decode probes are fake and whose outage
// clock is a fake one (the engine keeps the wall clock).
func livenessDaemon(t *testing.T, cfg LivenessConfig) (*Daemon, *scheduler, *clock.Fake, *fakeProbes) {
	clk, probes := clock.NewFake(time.Unix(0, 0)), &fakeProbes{}
	cfg.Clock, cfg.Probe = clk, probes.probe
	d := startDaemonWith(t, func(c *Config) { c.Liveness = cfg })
	return d, newScheduler(t, d), clk, probes
}

func waitWatched(t *testing.T, d *Daemon, at kv.Endpoint) {
	t.Helper()
	waitFor(t, "decode watched", func() bool { _, ok := d.liveness.outage(at); return ok })
}

func endpointOf(r *decodeRank) kv.Endpoint {
	return kv.Endpoint{IP: "127.0.0.1", Port: r.pull.Port()}
}

func advance(clk *clock.Fake, n int) {
	for range n {
		clk.Advance(time.Second)
	}
}

// A decode unreachable for its heartbeat budget has its rooms failed
// peer_lost, including a room with nothing in flight; a transfer info
// it sent before giving the room up, arriving after, fails its room without
// a byte written (decode is told); once the decode registers again (it
// cleared its connection), its new rooms are served.
func TestDecodeUnreachablePastItsBudget(t *testing.T) {
	d, s, clk, probes := livenessDaemon(t, LivenessConfig{Interval: time.Second, Budget: 10 * time.Second})
	dec := newDecode(t, d)
	at := endpointOf(dec)
	waitWatched(t, d, at)
	const idle, late, after = 501, 502, 503
	dec.send(t, dec.info(idle, seqPages(0, 1), 0, 1))
	s.cli.Open(idle, "")
	waitRoomStatus(t, s, idle, kv.StatusWaitingForInput)

	probes.set(at, ProbeUnreachable)
	advance(clk, 9)
	if reps, _ := s.cli.Poll([]uint64{idle}, nil); reps[0].Status != kv.StatusWaitingForInput {
		t.Fatalf("room failed before the budget: %v", reps[0].Status)
	}
	advance(clk, 1)
	if rep := s.waitTerminal(t, idle); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("idle room of the unreachable decode: %v/%v", rep.Status, rep.Reason)
	}
	if c := d.Counters(); c["peers_fenced"] != 1 || c["peers_lost"] != 1 {
		t.Fatalf("counters %v", c)
	}
	if l := debugLiveness(t, d); len(l) != 1 || !l[0].Fenced || l[0].UnreachableMs != 10000 || l[0].LastProbe != "unreachable" {
		t.Fatalf("/debug/peers liveness %+v", l)
	}

	// The late transfer info: sent before decode gave the room up.
	lateDst := seqPages(10, 2)
	dec.node.ZeroPages(lateDst)
	probes.set(at, ProbeOK) // the link is back
	dec.send(t, dec.info(late, lateDst, 1, 1))
	s.start(t, roomSpec{id: late, src: seqPages(3, 2), chunks: []int{2}, aux: 1})
	if rep := s.waitTerminal(t, late); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("room of a late transfer info: %v/%v", rep.Status, rep.Reason)
	}
	if st := dec.waitFrame(t, isStatus(late)).(*wire.KVStatus); st.Status != kv.StatusFailed {
		t.Fatalf("decode told %+v", st)
	}
	if !dec.node.PagesZero(lateDst) || d.PoolStats().Posted != 0 {
		t.Fatalf("a write for the late transfer info (posted %d)", d.PoolStats().Posted)
	}
	if c := d.Counters(); c["fenced_transfer_infos"] != 1 {
		t.Fatalf("counters %v", c)
	}

	// Decode comes back: it registers again before any new room.
	dec.send(t, dec.reg.Encode())
	waitFor(t, "registered again", func() bool { return d.Counters()["registrations"] == 2 })
	dec.checker.Expect(after, 1, false)
	dec.send(t, dec.info(after, seqPages(20, 1), 2, 1))
	s.start(t, roomSpec{id: after, src: seqPages(6, 1), chunks: []int{1}, aux: 2})
	if rep := s.waitTerminal(t, after); rep.Status != kv.StatusSuccess {
		t.Fatalf("room after the decode came back: %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, after, seqPages(20, 1), 2)
}

// A fenced decode that kept its rooms (its heartbeat recovered, so it never
// registers again) is loaded again once its endpoint has answered for
// FenceHold; until then its transfer infos are fenced.
func TestFencedDecodeThatKeptItsRoomsIsLoadedAgain(t *testing.T) {
	d, s, clk, probes := livenessDaemon(t, LivenessConfig{Interval: time.Second, Budget: 4 * time.Second, FenceHold: 6 * time.Second})
	dec := newDecode(t, d)
	at := endpointOf(dec)
	waitWatched(t, d, at)
	probes.set(at, ProbeUnreachable)
	advance(clk, 4)
	waitFor(t, "fenced", func() bool { return d.Counters()["peers_fenced"] == 1 })
	probes.set(at, ProbeOK)
	advance(clk, 5) // answered at 5..9 s
	const fenced, served = 601, 602
	dec.send(t, dec.info(fenced, seqPages(0, 1), 0, 1))
	s.start(t, roomSpec{id: fenced, src: seqPages(0, 1), chunks: []int{1}, aux: 0})
	if rep := s.waitTerminal(t, fenced); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("room inside the fence hold: %v/%v", rep.Status, rep.Reason)
	}
	advance(clk, 2) // answered since 5 s: 6 s at 11 s
	waitFor(t, "loaded again", func() bool {
		c := d.Counters()
		return c["registrations"] == 2 && c["peers_returned"] == 1
	})
	dec.checker.Expect(served, 1, false)
	dec.send(t, dec.info(served, seqPages(4, 1), 1, 1))
	s.start(t, roomSpec{id: served, src: seqPages(2, 1), chunks: []int{1}, aux: 1})
	if rep := s.waitTerminal(t, served); rep.Status != kv.StatusSuccess {
		t.Fatalf("room after the fence: %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, served, seqPages(4, 1), 1)
}

// A probe refused (decode's process is gone) drops the decode at the next
// probe, long before the budget, without a fence.
func TestDecodeGoneIsDroppedAtTheNextProbe(t *testing.T) {
	d, s, clk, probes := livenessDaemon(t, LivenessConfig{Interval: time.Second, Budget: time.Hour})
	dec := newDecode(t, d)
	at := endpointOf(dec)
	waitWatched(t, d, at)
	const id = 701
	dec.send(t, dec.info(id, seqPages(0, 1), 0, 1))
	s.cli.Open(id, "")
	waitRoomStatus(t, s, id, kv.StatusWaitingForInput)
	probes.set(at, ProbeRefused)
	advance(clk, 1)
	if rep := s.waitTerminal(t, id); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("room of the gone decode: %v/%v", rep.Status, rep.Reason)
	}
	if c := d.Counters(); c["peers_fenced"] != 0 || c["peers_lost"] != 1 {
		t.Fatalf("counters %v", c)
	}
}

func (l *liveness) heldCount(at kv.Endpoint) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.eps[at]; ok {
		return len(e.held)
	}
	return 0
}

// Transfers toward a decode whose last probe failed are held; a short outage
// posts them in the order they came, with no loss.
func TestLivenessShortOutageReleasesHeldTransfersInOrder(t *testing.T) {
	r := newLivenessRig(LivenessConfig{Interval: time.Second, Budget: 10 * time.Second, SafeAfter: 5 * time.Second})
	defer r.l.close()
	at := kv.Endpoint{IP: "192.0.2.2", Port: 5003}
	r.l.watch(at)
	var order []int
	post := func(i int) func() { return func() { order = append(order, i) } }
	fail := func() { t.Fatal("a held transfer failed after a short outage") }
	if r.l.hold(at, post(0), fail) {
		t.Fatal("held while answering")
	}
	r.probes.set(at, ProbeUnreachable)
	r.step(3)
	if r.l.suspects.Load() != 1 {
		t.Fatalf("suspects %d", r.l.suspects.Load())
	}
	for i := 1; i <= 3; i++ {
		if !r.l.hold(at, post(i), fail) {
			t.Fatal("not held while failing")
		}
	}
	r.probes.set(at, ProbeOK)
	r.step(1) // 4 s since the last answer: under SafeAfter
	if len(order) != 3 || order[0] != 1 || order[1] != 2 || order[2] != 3 || len(r.got()) != 0 {
		t.Fatalf("posted %v, events %v", order, r.got())
	}
	if r.l.suspects.Load() != 0 {
		t.Fatalf("suspects %d", r.l.suspects.Load())
	}
}

// An outage that ends before the budget but lasted SafeAfter (decode may have
// given up) ends in a loss with a fence when the decode answers again, and
// the held transfers fail instead of being posted.
func TestLivenessOutagePastSafeAfterEndsInLoss(t *testing.T) {
	r := newLivenessRig(LivenessConfig{Interval: time.Second, Budget: 10 * time.Second, SafeAfter: 5 * time.Second})
	defer r.l.close()
	at := kv.Endpoint{IP: "192.0.2.2", Port: 5004}
	r.l.watch(at)
	r.probes.set(at, ProbeUnreachable)
	r.step(4)
	failed := 0
	if !r.l.hold(at, func() { t.Fatal("posted after a long outage") }, func() { failed++ }) {
		t.Fatal("not held")
	}
	r.probes.set(at, ProbeOK)
	r.step(1) // 5 s since the last answer
	if ev := r.got(); !sameEvents(ev, []string{"lost+@5s"}) || failed != 1 {
		t.Fatalf("events %v, failed %d", ev, failed)
	}
}

// At the daemon, a chunk the scheduler sends while decode does not answer is
// not posted: after a short outage it is, and the room succeeds;
// after an outage past the budget the room fails peer_lost with nothing
// posted and decode's pages untouched.
func TestTransfersHeldWhileDecodeDoesNotAnswer(t *testing.T) {
	d, s, clk, probes := livenessDaemon(t, LivenessConfig{Interval: time.Second, Budget: 6 * time.Second, SafeAfter: 3 * time.Second})
	dec := newDecode(t, d)
	at := endpointOf(dec)
	waitWatched(t, d, at)
	const short, long = 801, 802
	dec.checker.Expect(short, 1, false)
	dec.send(t, dec.info(short, seqPages(0, 2), 0, 1))
	dec.send(t, dec.info(long, seqPages(4, 2), 1, 1))
	s.cli.Open(short, "")
	s.cli.Open(long, "")
	waitRoomStatus(t, s, short, kv.StatusWaitingForInput)
	waitRoomStatus(t, s, long, kv.StatusWaitingForInput)

	probes.set(at, ProbeUnreachable)
	advance(clk, 1)
	s.start(t, roomSpec{id: short, src: seqPages(10, 2), chunks: []int{1, 1}, aux: 2})
	waitFor(t, "chunks held", func() bool { return d.liveness.heldCount(at) == 2 })
	if n := d.PoolStats().Posted; n != 0 {
		t.Fatalf("%d transfers posted toward a decode that does not answer", n)
	}
	probes.set(at, ProbeOK)
	advance(clk, 1) // 2 s since the last answer: under SafeAfter
	if rep := s.waitTerminal(t, short); rep.Status != kv.StatusSuccess {
		t.Fatalf("room after a short outage: %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, short, seqPages(0, 2), 0)
	posted := d.PoolStats().Posted

	dst := seqPages(4, 2)
	dec.node.ZeroPages(dst)
	probes.set(at, ProbeUnreachable)
	advance(clk, 1)
	s.start(t, roomSpec{id: long, src: seqPages(12, 2), chunks: []int{2}, aux: 3})
	waitFor(t, "chunk held", func() bool { return d.liveness.heldCount(at) == 1 })
	advance(clk, 5) // 6 s since the last answer: the budget
	if rep := s.waitTerminal(t, long); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("room after a long outage: %v/%v", rep.Status, rep.Reason)
	}
	if n := d.PoolStats().Posted; n != posted || !dec.node.PagesZero(dst) {
		t.Fatalf("posted %d (was %d), pages zero %v", n, posted, dec.node.PagesZero(dst))
	}
}

// The PULL socket's keepalive window follows SafeAfter (half, at least 2 s),
// KVXFER_INGEST_KEEPALIVE overrides it, and "0" turns it off.
func TestIngestKeepAliveWindow(t *testing.T) {
	for _, c := range []struct {
		env   map[string]string
		count int // probes after 1 s idle, 1 s apart; 0: off
	}{
		{map[string]string{}, 1},                             // SafeAfter 5 s: 2 s
		{map[string]string{EnvHeartbeatMaxFailure: "5"}, 9},  // SafeAfter 20 s: 10 s
		{map[string]string{EnvIngestKeepAlive: "6"}, 5},      // 6 s
		{map[string]string{EnvIngestKeepAlive: "0"}, 0},      // off
		{map[string]string{EnvHeartbeatMaxFailure: "1"}, 1},  // SafeAfter one probe: 2 s
		{map[string]string{EnvIngestKeepAlive: "1000"}, 124}, // past 127 probes: 8 s apart
	} {
		cfg := LivenessConfig{}.withDefaults(func(k string) string { return c.env[k] })
		k := (&liveness{cfg: cfg}).ingestKeepAlive()
		every := time.Second
		if c.count > 100 {
			every = 8 * time.Second
		}
		switch {
		case c.count == 0 && k != nil, c.count != 0 && (k == nil || k.Count != c.count || k.Idle != time.Second || k.Interval != every):
			t.Errorf("env %v: keepalive %+v, want count %d", c.env, k, c.count)
		}
	}
}

// gatedProbes answers each probe when the test says so.
type gatedProbes struct{ calls chan chan ProbeResult }

func (g *gatedProbes) probe(_ context.Context, _ kv.Endpoint) ProbeResult {
	reply := make(chan ProbeResult)
	g.calls <- reply
	return <-reply
}

// With ConfirmWrites a write is posted only once a probe begun after it was
// answered: one queued while a probe is out waits for the next; one whose
// probe is not answered waits for the decode to answer again.
func TestConfirmWritesWaitForAProbeBegunAfterThem(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	g := &gatedProbes{calls: make(chan chan ProbeResult)}
	var mu sync.Mutex
	var posted []int
	l := newLiveness(LivenessConfig{Interval: time.Second, Budget: 10 * time.Second, SafeAfter: 5 * time.Second,
		ConfirmWrites: true, Clock: clk, Probe: g.probe}, nil,
		func(kv.Endpoint, string, bool) { t.Error("lost") }, func(kv.Endpoint, bool) {})
	defer l.close()
	at := kv.Endpoint{IP: "192.0.2.2", Port: 5005}
	post := func(i int) func() {
		return func() { mu.Lock(); posted = append(posted, i); mu.Unlock() }
	}
	got := func() []int { mu.Lock(); defer mu.Unlock(); return append([]int(nil), posted...) }
	fail := func() { t.Error("failed") }
	if l.confirm(at, post(0), fail) {
		t.Fatal("confirmed an endpoint not watched")
	}
	l.watch(at)
	if !l.confirm(at, post(1), fail) {
		t.Fatal("not taken")
	}
	first := <-g.calls // probe 1 is out
	if !l.confirm(at, post(2), fail) {
		t.Fatal("not taken")
	}
	if p := got(); len(p) != 0 {
		t.Fatalf("posted %v before any answer", p)
	}
	first <- ProbeOK
	second := <-g.calls // 2 waits for a probe begun after it
	if p := got(); len(p) != 1 || p[0] != 1 {
		t.Fatalf("after probe 1: posted %v", p)
	}
	second <- ProbeUnreachable // 2 is held: the decode stopped answering
	waitFor(t, "probe 2 handled", func() bool { return l.suspects.Load() == 1 })
	if p := got(); len(p) != 1 {
		t.Fatalf("posted %v toward a decode that did not answer", p)
	}
	go clk.Advance(time.Second) // the regular probe: answered (a short outage)
	(<-g.calls) <- ProbeOK
	waitFor(t, "held write posted", func() bool { return len(got()) == 2 })
	if p := got(); p[1] != 2 {
		t.Fatalf("posted %v", p)
	}
}

// With ConfirmWrites a chunk sent toward a decode behind a cut is never
// posted, even before any periodic probe failed; a reachable decode's rooms
// move as before.
func TestConfirmWritesNothingPostedTowardACutDecode(t *testing.T) {
	d, s, clk, probes := livenessDaemon(t, LivenessConfig{Interval: time.Second, Budget: 4 * time.Second,
		SafeAfter: 2 * time.Second, ConfirmWrites: true})
	dec := newDecode(t, d)
	at := endpointOf(dec)
	waitWatched(t, d, at)
	const ok, cut = 901, 902
	dec.checker.Expect(ok, 1, false)
	dec.send(t, dec.info(ok, seqPages(0, 2), 0, 1))
	s.start(t, roomSpec{id: ok, src: seqPages(10, 2), chunks: []int{1, 1}, aux: 0})
	if rep := s.waitTerminal(t, ok); rep.Status != kv.StatusSuccess {
		t.Fatalf("room toward a reachable decode: %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, ok, seqPages(0, 2), 0)
	posted := d.PoolStats().Posted

	dst := seqPages(20, 2)
	dec.node.ZeroPages(dst)
	dec.send(t, dec.info(cut, dst, 1, 1))
	s.cli.Open(cut, "")
	waitRoomStatus(t, s, cut, kv.StatusWaitingForInput)
	probes.set(at, ProbeUnreachable) // the cut, before any periodic probe saw it
	s.start(t, roomSpec{id: cut, src: seqPages(12, 2), chunks: []int{2}, aux: 1})
	waitFor(t, "chunk held", func() bool { return d.liveness.heldCount(at) == 1 })
	advance(clk, 4)
	if rep := s.waitTerminal(t, cut); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("room toward a cut decode: %v/%v", rep.Status, rep.Reason)
	}
	if n := d.PoolStats().Posted; n != posted || !dec.node.PagesZero(dst) {
		t.Fatalf("posted %d (was %d), pages zero %v", n, posted, dec.node.PagesZero(dst))
	}
}

func debugLiveness(t *testing.T, d *Daemon) []EndpointLiveness {
	t.Helper()
	resp, err := http.Get("http://" + d.DebugAddr() + "/debug/peers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Liveness []EndpointLiveness `json:"liveness"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v.Liveness
}

// The link's socket monitor triggers a probe at once (no tick: the fake clock
// never moves): a decode whose endpoint still answers is kept; one refused
// is dropped.
func TestLinkLossProbesAtOnce(t *testing.T) {
	d, s, _, probes := livenessDaemon(t, LivenessConfig{Interval: time.Hour, Budget: time.Hour})
	kept, gone := newDecode(t, d), newDecode(t, d)
	// (An hour-long interval makes a keepalive window past Linux's 127
	// probes: a refused value would drop every decode connection.)
	waitWatched(t, d, endpointOf(kept))
	waitWatched(t, d, endpointOf(gone))
	waitFor(t, "links connected", func() bool { return d.links.len() == 2 })
	const keptRoom, goneRoom = 1001, 1002
	kept.send(t, kept.info(keptRoom, seqPages(0, 1), 0, 1))
	gone.send(t, gone.info(goneRoom, seqPages(0, 1), 0, 1))
	s.cli.Open(keptRoom, "")
	s.cli.Open(goneRoom, "")
	waitRoomStatus(t, s, keptRoom, kv.StatusWaitingForInput)
	waitRoomStatus(t, s, goneRoom, kv.StatusWaitingForInput)

	// Both PULL sockets close; only gone's endpoint is refused.
	probes.set(endpointOf(gone), ProbeRefused)
	n := probes.n.Load()
	kept.pull.Stop()
	gone.pull.Stop()
	if rep := s.waitTerminal(t, goneRoom); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("room of the refused decode: %v/%v", rep.Status, rep.Reason)
	}
	waitFor(t, "both probed", func() bool { return probes.n.Load() >= n+2 })
	if reps, _ := s.cli.Poll([]uint64{keptRoom}, nil); reps[0].Status != kv.StatusWaitingForInput {
		t.Fatalf("room of the decode that still answers: %v", reps[0].Status)
	}
	if c := d.Counters(); c["peers_lost"] != 1 {
		t.Fatalf("counters %v", c)
	}
}
