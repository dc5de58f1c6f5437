package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/internal/testrig"
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

func livenessDaemon(t *testing.T, cfg LivenessConfig) (*Daemon, *scheduler, *clock.Fake, *fakeProbes) {
	clk, probes := clock.NewFake(time.Unix(0, 0)), &fakeProbes{}
	cfg.Clock, cfg.Probe = clk, probes.probe
	d := startDaemonWith(t, func(c *Config) { c.Liveness = cfg })
	return d, newScheduler(t, d), clk, probes
}

// waitWatched waits until the peer at an endpoint is loaded (its probes
// armed).
func waitWatched(t *testing.T, d *Daemon, at kv.Endpoint) {
	t.Helper()
	waitFor(t, "decode watched", func() bool { p, ok := peerAt(t, d, at); return ok && p.State == "ready" })
}

// peerAt is the peer whose current incarnation registered at an endpoint.
func peerAt(t testing.TB, d *Daemon, at kv.Endpoint) (actors.PeerState, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	all, err := d.peers.actors.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range all {
		if kv.Endpoint(p.Endpoint) == at && p.State != "gone" {
			return p, true
		}
	}
	return actors.PeerState{}, false
}

// heldCount is how many writes the peer at an endpoint holds.
func heldCount(t testing.TB, d *Daemon, at kv.Endpoint) int {
	p, _ := peerAt(t, d, at)
	return p.Held
}

func endpointOf(r *decodeRank) kv.Endpoint {
	return kv.Endpoint{IP: "127.0.0.1", Port: r.pull.Port()}
}

// advance moves the clock a second at a time; after each, every probe the
// peers' ticks started is answered and stepped before the next second (the
// ticks are timers of the peer actors: a second must not pass while one
// is still being stepped).
func advance(t testing.TB, d *Daemon, clk *clock.Fake, n int) {
	t.Helper()
	for range n {
		clk.Advance(time.Second)
		settleProbes(t, d)
	}
}

// settleProbes waits until no peer has a probe out.
func settleProbes(t testing.TB, d *Daemon) {
	t.Helper()
	testrig.Eventually(t, 10*time.Second, "probes answered", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		all, err := d.peers.actors.List(ctx)
		if err != nil {
			return false
		}
		for _, p := range all {
			if p.Probing {
				return false
			}
		}
		return true
	})
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
	advance(t, d, clk, 9)
	if reps, _ := s.cli.Poll([]uint64{idle}, nil); reps[0].Status != kv.StatusWaitingForInput {
		t.Fatalf("room failed before the budget: %v", reps[0].Status)
	}
	advance(t, d, clk, 1)
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
	advance(t, d, clk, 4)
	waitFor(t, "fenced", func() bool { return d.Counters()["peers_fenced"] == 1 })
	probes.set(at, ProbeOK)
	advance(t, d, clk, 5) // answered at 5..9 s
	const fenced, served = 601, 602
	dec.send(t, dec.info(fenced, seqPages(0, 1), 0, 1))
	s.start(t, roomSpec{id: fenced, src: seqPages(0, 1), chunks: []int{1}, aux: 0})
	if rep := s.waitTerminal(t, fenced); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("room inside the fence hold: %v/%v", rep.Status, rep.Reason)
	}
	advance(t, d, clk, 2) // answered since 5 s: 6 s at 11 s
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
	advance(t, d, clk, 1)
	if rep := s.waitTerminal(t, id); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("room of the gone decode: %v/%v", rep.Status, rep.Reason)
	}
	if c := d.Counters(); c["peers_fenced"] != 0 || c["peers_lost"] != 1 {
		t.Fatalf("counters %v", c)
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
	advance(t, d, clk, 1)
	s.start(t, roomSpec{id: short, src: seqPages(10, 2), chunks: []int{1, 1}, aux: 2})
	waitFor(t, "chunks held", func() bool { return heldCount(t, d, at) == 2 })
	if n := d.PoolStats().Posted; n != 0 {
		t.Fatalf("%d transfers posted toward a decode that does not answer", n)
	}
	probes.set(at, ProbeOK)
	advance(t, d, clk, 1) // 2 s since the last answer: under SafeAfter
	if rep := s.waitTerminal(t, short); rep.Status != kv.StatusSuccess {
		t.Fatalf("room after a short outage: %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, short, seqPages(0, 2), 0)
	posted := d.PoolStats().Posted

	dst := seqPages(4, 2)
	dec.node.ZeroPages(dst)
	probes.set(at, ProbeUnreachable)
	advance(t, d, clk, 1)
	s.start(t, roomSpec{id: long, src: seqPages(12, 2), chunks: []int{2}, aux: 3})
	waitFor(t, "chunk held", func() bool { return heldCount(t, d, at) == 1 })
	advance(t, d, clk, 5) // 6 s since the last answer: the budget
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
	waitFor(t, "chunk held", func() bool { return heldCount(t, d, at) == 1 })
	advance(t, d, clk, 4)
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

// Another agent registering at a fenced agent's endpoint (its decode
// restarted) ends the fence: the fenced agent goes for good (its endpoint
// answering for the fence hold restores nothing), the new one is served,
// and one link is left.
func TestRegistrationAtAFencedEndpointEndsTheFence(t *testing.T) {
	d, _, clk, probes := livenessDaemon(t, LivenessConfig{Interval: time.Second, Budget: 4 * time.Second, FenceHold: 6 * time.Second})
	dec := newDecode(t, d)
	at := endpointOf(dec)
	waitWatched(t, d, at)
	probes.set(at, ProbeUnreachable)
	advance(t, d, clk, 4)
	waitFor(t, "fenced", func() bool { return peerState(t, d, dec.reg.AgentName).State == "fenced" })
	probes.set(at, ProbeOK)

	next := newDecodeWith(t, decodeShape(false), func(r *wire.Registration) { r.DecodePort = at.Port }, d)
	waitFor(t, "the new agent loaded, the fenced one gone", func() bool {
		return peerState(t, d, next.reg.AgentName).State == "ready" && peerState(t, d, dec.reg.AgentName).State == "gone"
	})
	advance(t, d, clk, 7) // past the fence hold, answering all along
	if st := peerState(t, d, dec.reg.AgentName).State; st != "gone" {
		t.Fatalf("the fenced agent came back: %s", st)
	}
	if c := d.Counters(); c["peers_returned"] != 0 || c["registrations"] != 2 {
		t.Fatalf("counters %v", c)
	}
	if n := d.links.len(); n != 1 {
		t.Fatalf("%d links to one endpoint", n)
	}
}
