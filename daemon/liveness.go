package daemon

import (
	"context"
	"errors"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvxfer/kvxfer/actors/peer"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// Decode liveness.
//
// SGLang's decode watches its prefill: every HEARTBEAT_INTERVAL it GETs the
// bootstrap server's /health, and after HEARTBEAT_MAX_FAILURE failures in a
// row it fails every room it tracked there and clears its connection to that
// prefill (the next room registers again). Prefill has no such watch
// upstream, so a decode behind a cut link keeps its rooms alive here while
// decode has given them up.
//
// kvxferd mirrors decode's rule from its side. Every registered decode's PULL
// endpoint is probed with a TCP connect every Interval (on the injected
// clock). The outage is measured from the last probe that succeeded:
//
//   - a probe refused (nothing listens: decode's process is gone) drops the
//     decode's agents at once: their rooms fail peer_lost;
//   - once the outage reaches decode's own heartbeat budget (Budget:
//     SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL × _MAX_FAILURE, read from the
//     same variables with SGLang's defaults and minimums, 5 s × 2), the
//     agents are fenced and dropped: their rooms fail peer_lost, which is
//     what decode concluded;
//   - a fenced agent's transfer infos fail their room before the room sees
//     them (no write can follow), until the agent registers again (decode
//     cleared its connection, so everything after is new) or its endpoint
//     has answered every probe for FenceHold (decode kept its rooms: its
//     heartbeat succeeded again; any heartbeat in flight when the link came
//     back has ended by then).
//
// A ZMQ socket monitor on the link to decode (links.go) reports a lost TCP
// connection at once; it triggers a probe now instead of at the next tick,
// so a decode killed with SIGKILL is dropped within milliseconds.
type LivenessConfig struct {
	// Off disables probing (KVXFER_PEER_LIVENESS=off): a lost link
	// connection drops the decode at once (the behaviour before liveness),
	// no outage is measured, no write is held.
	Off bool
	// Interval between probes of one decode (0: KVXFER_PEER_PROBE_INTERVAL,
	// else 1 s). Timeout bounds one probe (0: KVXFER_PEER_PROBE_TIMEOUT, else
	// half the interval; at most Interval).
	Interval, Timeout time.Duration
	// Budget is the outage after which a decode's rooms fail peer_lost (0:
	// KVXFER_PEER_LOSS_AFTER, else decode's heartbeat budget from SGLang's
	// variables).
	Budget time.Duration
	// SafeAfter is the shortest outage after which decode may have failed its
	// rooms: its heartbeat needs max_failure failures one interval apart, so
	// (max_failure-1) × interval, at least one probe Interval (0:
	// KVXFER_PEER_SAFE_AFTER, else that). An outage that ends before Budget
	// but lasted SafeAfter fences and drops the decode when it answers again,
	// before any held transfer is released.
	SafeAfter time.Duration
	// FenceHold is how long a fenced decode's endpoint must answer every
	// probe before its agents are unfenced without registering again (0:
	// KVXFER_PEER_FENCE_HOLD, else SGLang's longest heartbeat attempt, 2 s
	// connect + 3 s read, plus one heartbeat interval).
	FenceHold time.Duration
	// IngestKeepAlive is the TCP keepalive window of decode connections on the
	// ZMQ PULL socket: the kernel closes one silent this long, so what decode
	// sent before an outage can never be read after it (0:
	// KVXFER_INGEST_KEEPALIVE, else half of SafeAfter, at least 2 s;
	// negative: off).
	IngestKeepAlive time.Duration
	// ConfirmWrites posts a write only once a probe begun after it was
	// answered: no write is posted toward a decode behind a link cut before
	// the cut was seen, at the cost of one TCP connect round trip per batch
	// of writes to a decode. ConfirmWrites applies it to every decode
	// (KVXFER_PEER_CONFIRM_WRITES=all or 1); ConfirmRemote only to decodes
	// whose address is not loopback (=remote, the default: a link between
	// hosts can be cut, one inside a host cannot). =off turns both off.
	ConfirmWrites bool
	ConfirmRemote bool
	// NoConfirm keeps both off whatever the environment says (tests).
	NoConfirm bool
	// Probe replaces the TCP connect (tests).
	Probe func(ctx context.Context, to kv.Endpoint) ProbeResult
	// Clock replaces the engine's clock (tests).
	Clock clock.Clock
}

// ProbeResult is what one probe of a decode endpoint found.
type ProbeResult uint8

const (
	ProbeOK          ProbeResult = iota // something accepted the connection
	ProbeRefused                        // the host answered and nothing listens: decode's process is gone
	ProbeUnreachable                    // no answer in time, or no route: the link or the host is down
)

func (r ProbeResult) String() string {
	return [...]string{"ok", "refused", "unreachable"}[r]
}

// SGLang's decode heartbeat (spec §3, §5.4): interval max(v, 2.0) s, default
// 5.0; failures max(v, 1), default 2.
const (
	EnvHeartbeatInterval   = "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"
	EnvHeartbeatMaxFailure = "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"
	EnvProbeInterval       = "KVXFER_PEER_PROBE_INTERVAL"
	EnvProbeTimeout        = "KVXFER_PEER_PROBE_TIMEOUT"
	EnvLossAfter           = "KVXFER_PEER_LOSS_AFTER"
	EnvFenceHold           = "KVXFER_PEER_FENCE_HOLD"
	EnvSafeAfter           = "KVXFER_PEER_SAFE_AFTER"
	EnvIngestKeepAlive     = "KVXFER_INGEST_KEEPALIVE"
	EnvConfirmWrites       = "KVXFER_PEER_CONFIRM_WRITES"
	EnvLiveness            = "KVXFER_PEER_LIVENESS"
	// sglangHeartbeatAttempt is the longest one heartbeat GET takes before it
	// counts as failed: requests' timeout=(2, 3).
	sglangHeartbeatAttempt = 5 * time.Second
)

// HeartbeatBudget is decode's heartbeat budget as SGLang computes it from
// getenv: max(interval, 2 s) × max(failures, 1), defaults 5 s and 2.
func HeartbeatBudget(getenv func(string) string) (interval time.Duration, failures int) {
	iv := 5.0
	if v, err := strconv.ParseFloat(getenv(EnvHeartbeatInterval), 64); err == nil && v == v {
		iv = v
	}
	n := 2
	if v, err := strconv.Atoi(getenv(EnvHeartbeatMaxFailure)); err == nil {
		n = v
	}
	return time.Duration(max(iv, 2.0) * float64(time.Second)), max(n, 1)
}

// envDuration reads a duration from getenv: Go syntax ("1.5s") or seconds.
func envDuration(getenv func(string) string, name string) time.Duration {
	v := getenv(name)
	if v == "" {
		return 0
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && f > 0 && f < 1e6 {
		return time.Duration(f * float64(time.Second))
	}
	return 0
}

// withDefaults fills what is zero from getenv and SGLang's defaults. Nothing
// below 1 ms: Go timers fire late below it.
func (c LivenessConfig) withDefaults(getenv func(string) string) LivenessConfig {
	hbInterval, hbFailures := HeartbeatBudget(getenv)
	if getenv(EnvLiveness) == "off" {
		c.Off = true
	}
	if c.Interval <= 0 {
		c.Interval = envDuration(getenv, EnvProbeInterval)
	}
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = envDuration(getenv, EnvProbeTimeout)
	}
	if c.Timeout <= 0 {
		c.Timeout = c.Interval / 2
	}
	if c.Budget <= 0 {
		c.Budget = envDuration(getenv, EnvLossAfter)
	}
	if c.Budget <= 0 {
		c.Budget = hbInterval * time.Duration(hbFailures)
	}
	if c.SafeAfter <= 0 {
		c.SafeAfter = envDuration(getenv, EnvSafeAfter)
	}
	if c.SafeAfter <= 0 {
		c.SafeAfter = hbInterval * time.Duration(hbFailures-1)
	}
	if c.FenceHold <= 0 {
		c.FenceHold = envDuration(getenv, EnvFenceHold)
	}
	if c.FenceHold <= 0 {
		c.FenceHold = sglangHeartbeatAttempt + hbInterval
	}
	c.Interval = max(c.Interval, time.Millisecond)
	c.Timeout = min(max(c.Timeout, time.Millisecond), c.Interval)
	c.SafeAfter = min(max(c.SafeAfter, c.Interval), c.Budget)
	switch getenv(EnvConfirmWrites) {
	case "1", "true", "all":
		c.ConfirmWrites = true
	case "0", "false", "off":
		c.NoConfirm = true
	default: // "", "remote"
		c.ConfirmRemote = true
	}
	if c.NoConfirm {
		c.ConfirmWrites, c.ConfirmRemote = false, false
	}
	if c.IngestKeepAlive == 0 {
		if v := getenv(EnvIngestKeepAlive); v == "0" || v == "off" {
			c.IngestKeepAlive = -1
		} else {
			c.IngestKeepAlive = envDuration(getenv, EnvIngestKeepAlive)
		}
	}
	if c.IngestKeepAlive == 0 {
		c.IngestKeepAlive = max(c.SafeAfter/2, 2*time.Second)
	}
	if c.Probe == nil {
		c.Probe = tcpProbe(c.Timeout)
	}
	return c
}

// ingestKeepAlive is the PULL socket's TCP keepalive: probes after a second
// of silence, as many as fit the window, a second apart, or further apart
// past Linux's 127 probes (nil: off). A value the kernel refuses would make
// libzmq drop every connection it accepts.
func (l *liveness) ingestKeepAlive() *zmqio.KeepAlive {
	if l == nil || l.cfg.Off || l.cfg.IngestKeepAlive < 0 {
		return nil
	}
	rest := max(int(l.cfg.IngestKeepAlive/time.Second)-1, 1) // seconds after the idle one
	const maxProbes = 127
	every := (rest + maxProbes - 1) / maxProbes
	return &zmqio.KeepAlive{Idle: time.Second, Interval: time.Duration(every) * time.Second, Count: max(rest/every, 1)}
}

// tcpProbe connects to decode's PULL endpoint and closes at once (libzmq
// drops a connection that closes before its greeting, and nothing reaches
// the socket's reader). The close is a reset, so probes leave no TIME_WAIT
// sockets behind however often they run.
func tcpProbe(timeout time.Duration) func(context.Context, kv.Endpoint) ProbeResult {
	return func(ctx context.Context, to kv.Endpoint) ProbeResult {
		dl := net.Dialer{Timeout: timeout}
		c, err := dl.DialContext(ctx, "tcp", net.JoinHostPort(to.IP, strconv.Itoa(to.Port)))
		if err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // closed with a reset: no TIME_WAIT left per probe
			}
			_ = c.Close()
			return ProbeOK
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return ProbeRefused
		}
		return ProbeUnreachable
	}
}

// liveness probes the endpoints of registered decodes and reports losses.
type liveness struct {
	cfg LivenessConfig
	clk clock.Clock
	// lost drops the agents at an endpoint: fence says the drop is for an
	// outage (the agents are fenced first).
	lost func(at kv.Endpoint, why string, fence bool)
	// back ends the fence of the agents at an endpoint: alive says the
	// endpoint has answered every probe for FenceHold (the agents are loaded
	// again); otherwise they are forgotten (refused, or another registration
	// took the endpoint).
	back func(at kv.Endpoint, alive bool)

	ctx    context.Context
	cancel context.CancelFunc

	// suspects counts the endpoints whose last probe failed: only then does
	// a transfer's post look its decode up (gateTransfer).
	suspects atomic.Int64

	mu     sync.Mutex
	eps    map[kv.Endpoint]*endpointLive
	closed bool
}

// heldXfer is a transfer held while its decode does not answer.
type heldXfer struct{ post, fail func() }

type endpointLive struct {
	lastOK    time.Time // the last probe that succeeded (or when watching began)
	failing   bool
	fenced    bool      // lost to an outage; probed until it has been back FenceHold
	upSince   time.Time // fenced: since when every probe succeeded (zero: not now)
	timer     clock.Timer
	probing   bool
	lastProbe ProbeResult
	held      []heldXfer // posts held while failing, in the order they came
	confirm   []heldXfer // posts waiting for a probe begun after them (ConfirmWrites)
	// confirming: a confirmRounds goroutine is at work for the endpoint.
	confirming bool
}

// setFailingLocked flips the failing flag and the suspects count.
func (l *liveness) setFailingLocked(e *endpointLive, failing bool) {
	if e.failing == failing {
		return
	}
	e.failing = failing
	if failing {
		l.suspects.Add(1)
	} else {
		l.suspects.Add(-1)
	}
}

// takeHeldLocked empties an endpoint's held transfers (and those waiting
// for a confirmation) and returns the call that fails them (run it
// unlocked, after the decode is dropped).
func takeHeldLocked(e *endpointLive) func() {
	held := append(e.held, e.confirm...)
	e.held, e.confirm = nil, nil
	return func() {
		for _, h := range held {
			h.fail()
		}
	}
}

// hold keeps a transfer to an endpoint whose last probe failed (and which is
// not fenced: a fenced decode's agents are dropped already): it is posted
// when the endpoint answers again, or failed peer_lost when the decode is
// lost. It reports whether it took the transfer.
func (l *liveness) hold(at kv.Endpoint, post, fail func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.eps[at]
	if !ok || !e.failing || e.fenced || l.closed {
		return false
	}
	e.held = append(e.held, heldXfer{post: post, fail: fail})
	return true
}

func newLiveness(cfg LivenessConfig, clk clock.Clock, lost func(kv.Endpoint, string, bool), back func(kv.Endpoint, bool)) *liveness {
	if cfg.Clock != nil {
		clk = cfg.Clock
	}
	if clk == nil {
		clk = clock.Real{}
	}
	cfg = cfg.withDefaults(os.Getenv)
	ctx, cancel := context.WithCancel(context.Background())
	return &liveness{cfg: cfg, clk: clk, lost: lost, back: back, ctx: ctx, cancel: cancel, eps: map[kv.Endpoint]*endpointLive{}}
}

// watch starts probing an endpoint (a decode registered there). Watching an
// endpoint already watched changes nothing; one that was fenced is watched
// afresh (a decode registered there again).
func (l *liveness) watch(at kv.Endpoint) {
	if l == nil || l.cfg.Off {
		return
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	if e, ok := l.eps[at]; ok {
		wasFenced := e.fenced
		if !wasFenced {
			l.mu.Unlock()
			return
		}
		e.fenced, e.upSince, e.lastOK = false, time.Time{}, l.clk.Now()
		l.setFailingLocked(e, false)
		l.mu.Unlock()
		l.back(at, false) // a registration from there: the fenced agents are past
		return
	}
	defer l.mu.Unlock()
	e := &endpointLive{lastOK: l.clk.Now()}
	l.eps[at] = e
	e.timer = l.clk.AfterFunc(l.cfg.Interval, func() { l.tick(at, e) })
}

// unwatch stops probing an endpoint whose decode was dropped, unless it is
// fenced (then probing goes on until it is unfenced).
func (l *liveness) unwatch(at kv.Endpoint) {
	if l == nil {
		return
	}
	l.mu.Lock()
	e, ok := l.eps[at]
	if !ok || e.fenced {
		l.mu.Unlock()
		return
	}
	e.timer.Stop()
	delete(l.eps, at)
	l.setFailingLocked(e, false)
	fail := takeHeldLocked(e)
	l.mu.Unlock()
	fail()
}

// kick probes an endpoint now (its link's connection was lost). It reports
// whether the endpoint is watched.
func (l *liveness) kick(at kv.Endpoint) bool {
	if l == nil || l.cfg.Off {
		return false
	}
	l.mu.Lock()
	e, ok := l.eps[at]
	l.mu.Unlock()
	if ok {
		l.probe(at, e)
	}
	return ok
}

// tick probes at a fixed rate: the next tick is armed before this probe,
// so a probe that waits for its timeout does not stretch the period (a tick
// that finds the last probe still out skips).
func (l *liveness) tick(at kv.Endpoint, e *endpointLive) {
	l.mu.Lock()
	if l.closed || l.eps[at] != e {
		l.mu.Unlock()
		return
	}
	e.timer = l.clk.AfterFunc(l.cfg.Interval, func() { l.tick(at, e) })
	l.mu.Unlock()
	l.probe(at, e)
}

// probe probes once (no lock held while it dials) and acts on the result.
func (l *liveness) probe(at kv.Endpoint, e *endpointLive) {
	l.mu.Lock()
	if l.closed || l.eps[at] != e || e.probing {
		l.mu.Unlock()
		return
	}
	e.probing = true
	l.mu.Unlock()
	res := l.cfg.Probe(l.ctx, at)
	l.mu.Lock()
	e.probing = false
	act, after := l.resultLocked(at, e, res, 0)
	l.mu.Unlock()
	if act != nil {
		act()
	}
	if after != nil {
		after()
	}
}

// resultLocked acts on one probe's result; confirmed is how many transfers
// of the confirm queue the probe answers for (those queued before it began).
// It returns what to run unlocked: the report, then the failing of held
// transfers.
func (l *liveness) resultLocked(at kv.Endpoint, e *endpointLive, res ProbeResult, confirmed int) (act, after func()) {
	now := l.clk.Now()
	e.lastProbe = res
	if l.closed || l.eps[at] != e {
		return nil, nil
	}
	if res != ProbeOK {
		// Not confirmed: whatever waited for a confirmation waits for the
		// decode to answer again, behind nothing (held is empty while the
		// last probe answered).
		e.held = append(e.held, e.confirm...)
		e.confirm = nil
	}
	switch res {
	case ProbeOK:
		if out := now.Sub(e.lastOK); e.failing && !e.fenced && out >= l.cfg.SafeAfter {
			// Back before the budget, but after an outage decode's heartbeat
			// may have counted as its end: its rooms may be failed there.
			e.fenced = true
			why := "unreachable for " + out.Round(time.Millisecond).String() + " (decode gives up after " +
				l.cfg.SafeAfter.String() + " at the earliest): decode may have failed its rooms"
			act, after = func() { l.lost(at, why, true) }, takeHeldLocked(e)
		}
		for _, h := range e.held { // posted in order, before a later post can pass them
			h.post()
		}
		e.held = nil
		if !e.fenced {
			for _, h := range e.confirm[:confirmed] {
				h.post()
			}
			e.confirm = e.confirm[confirmed:]
		}
		e.lastOK = now
		l.setFailingLocked(e, false)
		if e.fenced {
			if e.upSince.IsZero() {
				e.upSince = now
			}
			if now.Sub(e.upSince) >= l.cfg.FenceHold {
				e.timer.Stop()
				delete(l.eps, at)
				act = func() { l.back(at, true) }
			}
		}
	case ProbeRefused:
		e.timer.Stop()
		delete(l.eps, at)
		l.setFailingLocked(e, false)
		after = takeHeldLocked(e)
		if !e.fenced {
			act = func() { l.lost(at, "nothing listens at decode's endpoint: its process is gone", false) }
		} else {
			act = func() { l.back(at, false) } // the fenced decode is gone: nothing more can come from it
		}
	default:
		l.setFailingLocked(e, true)
		e.upSince = time.Time{}
		if out := now.Sub(e.lastOK); !e.fenced && out >= l.cfg.Budget {
			e.fenced = true
			why := "unreachable for " + out.Round(time.Millisecond).String() + ", past decode's heartbeat budget of " +
				l.cfg.Budget.String() + ": decode has failed its rooms"
			act, after = func() { l.lost(at, why, true) }, takeHeldLocked(e)
		}
	}
	return act, after
}

// confirm holds a transfer until a probe that began after it is answered
// (LivenessConfig.ConfirmWrites): a write is posted only toward a decode
// known to be reachable after the write was ready. It reports whether it
// took the transfer (not for an endpoint not watched, or fenced).
func (l *liveness) confirm(at kv.Endpoint, post, fail func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.eps[at]
	if !ok || e.fenced || l.closed {
		return false
	}
	if e.failing {
		e.held = append(e.held, heldXfer{post: post, fail: fail})
		return true
	}
	e.confirm = append(e.confirm, heldXfer{post: post, fail: fail})
	if !e.confirming {
		e.confirming = true
		go l.confirmRounds(at, e)
	}
	return true
}

// confirmRounds probes until the confirm queue is empty, each probe
// answering for the transfers queued before it began. Rounds start at least
// a millisecond apart (wall clock: a rate bound, not a decision), so
// continuous writes cost a decode at most a thousand connects a second.
func (l *liveness) confirmRounds(at kv.Endpoint, e *endpointLive) {
	var last time.Time
	for {
		if !last.IsZero() && time.Since(last) < time.Millisecond {
			time.Sleep(time.Millisecond)
		}
		last = time.Now()
		l.mu.Lock()
		n := len(e.confirm)
		if n == 0 || l.closed || l.eps[at] != e {
			e.confirming = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		res := l.cfg.Probe(l.ctx, at)
		l.mu.Lock()
		act, after := l.resultLocked(at, e, res, n)
		l.mu.Unlock()
		if act != nil {
			act()
		}
		if after != nil {
			after()
		}
	}
}

// outage reports how long an endpoint has gone unanswered (0: answering, or
// not watched), for /debug/peers and tests.
func (l *liveness) outage(at kv.Endpoint) (time.Duration, bool) {
	if l == nil {
		return 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.eps[at]
	if !ok || !e.failing {
		return 0, ok
	}
	return l.clk.Now().Sub(e.lastOK), true
}

// fenced says whether an endpoint is watched as fenced (its agents lost to
// an outage, probed until they come back).
func (l *liveness) fenced(at kv.Endpoint) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.eps[at]
	return ok && e.fenced
}

// EndpointLiveness is one watched decode endpoint in /debug/peers.
type EndpointLiveness struct {
	Endpoint string `json:"endpoint"`
	// UnreachableMs is the outage so far (0: the last probe was answered).
	UnreachableMs int64  `json:"unreachable_ms"`
	LastProbe     string `json:"last_probe"`
	Fenced        bool   `json:"fenced,omitempty"`
	Held          int    `json:"held_transfers,omitempty"`
}

// snapshot lists the watched endpoints, by endpoint.
func (l *liveness) snapshot() []EndpointLiveness {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	out := make([]EndpointLiveness, 0, len(l.eps))
	for at, e := range l.eps {
		v := EndpointLiveness{Endpoint: at.String(), LastProbe: e.lastProbe.String(), Fenced: e.fenced,
			Held: len(e.held) + len(e.confirm)}
		if e.failing {
			v.UnreachableMs = now.Sub(e.lastOK).Milliseconds()
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Endpoint < out[j].Endpoint })
	return out
}

// close stops every probe (shutdown).
func (l *liveness) close() {
	if l == nil {
		return
	}
	l.cancel()
	l.mu.Lock()
	l.closed = true
	var fails []func()
	for at, e := range l.eps {
		e.timer.Stop()
		delete(l.eps, at)
		l.setFailingLocked(e, false)
		fails = append(fails, takeHeldLocked(e))
	}
	l.mu.Unlock()
	for _, f := range fails { // held transfers fail (the engine is closing)
		f()
	}
}

// decodeLost drops every accepted agent at an endpoint: their rooms fail
// peer_lost now, including rooms with nothing in flight, which no transfer
// error would ever fail. fence (an outage past decode's heartbeat budget)
// fences the agents first, so that no transfer info of theirs can lead to a
// write until they register again (see liveness above).
func (d *Daemon) decodeLost(at kv.Endpoint, why string, fence bool) {
	agents := d.dialects.lost(at) // peers_lost and peers_fenced: counted as each actor steps it
	for _, a := range agents {
		d.peers.actors.Send(a, peer.Lost{Why: why, Fence: fence})
	}
	if len(agents) > 0 {
		if ok, suppressed := d.lostLogs.allow(); ok {
			d.log.Warn("decode lost; its rooms fail peer_lost", "endpoint", at.String(), "agents", agents, "why", why,
				"fenced", fence, "suppressed", suppressed)
		}
	}
}

// decodeBack ends the fences at an endpoint: alive (answering for
// FenceHold) loads the agents again, else they are forgotten.
func (d *Daemon) decodeBack(at kv.Endpoint, alive bool) {
	// Each agent's actor decides: only a fenced one at this endpoint acts.
	d.peers.actors.SendAt(peer.Endpoint(at), peer.Back{Alive: alive, Epoch: d.peers.epoch.Add(1)})
	if alive {
		d.log.Info("decode endpoint answering again past the fence hold; its agents are loaded again", "endpoint", at.String())
	}
}

// gateTransfer holds a transfer whose decode's last probe failed (see
// liveness.hold): no new write is posted toward a decode that may be behind
// a cut link, where it would land only when the link returns, possibly after
// decode gave the room up.
func (d *Daemon) gateTransfer(t kv.Transfer, post, fail func()) bool {
	l := d.liveness
	if l == nil || l.cfg.Off || !l.cfg.ConfirmWrites && !l.cfg.ConfirmRemote && l.suspects.Load() == 0 {
		return false
	}
	at, ok := d.dialects.acceptedEndpoint(t.Agent)
	if !ok {
		return false
	}
	if l.cfg.ConfirmWrites || l.cfg.ConfirmRemote && !isLoopbackIP(at.IP) {
		return l.confirm(at, post, fail)
	}
	if l.suspects.Load() == 0 {
		return false
	}
	return l.hold(at, post, fail)
}

// linkAllowed says whether a link may be dialled to an endpoint: a
// registered decode's (dialects.known), or a fenced one's, so that a room
// failed by the fence still tells decode.
func (d *Daemon) linkAllowed(at kv.Endpoint) bool {
	return d.dialects.known(at) || d.liveness.fenced(at)
}

// linkLost runs when the link's monitor sees its TCP connection to decode's
// PULL socket close: probe now (a dead process is refused at once); without
// liveness, or for an endpoint not watched, drop at once as before.
func (d *Daemon) linkLost(at kv.Endpoint) {
	if d.liveness.kick(at) {
		return
	}
	d.decodeLost(at, "connection lost", false)
}

// isLoopbackIP: a decode on this host (its link cannot be cut).
func isLoopbackIP(ip string) bool {
	a := net.ParseIP(ip)
	return a != nil && a.IsLoopback() || ip == "localhost"
}
