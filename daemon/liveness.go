package daemon

import (
	"context"
	"errors"
	"net"
	"os"
	"sort"
	"strconv"
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
// clock) by its agent's peer machine (actors/peer), which owns the watch:
// the probe runs off the actor (liveness.probe) and comes back as
// peer.Probed with its time. The outage is measured from the last probe that
// succeeded:
//
//   - a probe refused (nothing listens: decode's process is gone) drops the
//     decode's agent at once: its rooms fail peer_lost;
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

// liveness is the probes' configuration and what they run on. The state of
// each decode's watch (its outage, fence, held and confirmed writes) is its
// peer actor's (actors/peer.Machine); the probe itself, a TCP connect, runs
// off the actor and comes back as peer.Probed.
type liveness struct {
	cfg LivenessConfig
	clk clock.Clock
	// ctx ends the probes still out at shutdown.
	ctx    context.Context
	cancel context.CancelFunc
}

func newLiveness(cfg LivenessConfig, clk clock.Clock) *liveness {
	if cfg.Clock != nil {
		clk = cfg.Clock
	}
	if clk == nil {
		clk = clock.Real{}
	}
	cfg = cfg.withDefaults(os.Getenv)
	ctx, cancel := context.WithCancel(context.Background())
	return &liveness{cfg: cfg, clk: clk, ctx: ctx, cancel: cancel}
}

// rules are the peer machines' liveness parameters.
func (l *liveness) rules(r peer.Config) peer.Config {
	r.NoLiveness = l.cfg.Off
	r.Interval, r.SafeAfter, r.Budget, r.FenceHold = l.cfg.Interval, l.cfg.SafeAfter, l.cfg.Budget, l.cfg.FenceHold
	return r
}

// confirms says whether writes to a decode at this endpoint wait for a
// probe begun after them.
func (l *liveness) confirms(at kv.Endpoint) bool {
	return !l.cfg.Off && (l.cfg.ConfirmWrites || l.cfg.ConfirmRemote && !isLoopbackIP(at.IP))
}

// minProbeGap bounds how often one decode is probed back to back for
// confirmations (wall clock: a rate bound, not a decision): continuous
// writes cost a decode at most a thousand connects a second.
const minProbeGap = time.Millisecond

// probe runs one probe of a peer's endpoint off its actor and reports the
// result with the time it came back. A probe that follows the answer of the
// one before (back: writes came while it was out) starts at least
// minProbeGap after that one began (last); it returns when this one begins.
// It confirms every write the peer had stepped (stepped) when its connect
// began, those that came while it waited included.
func (l *liveness) probe(at kv.Endpoint, last time.Time, back bool, stepped *atomic.Uint64, report func(peer.Msg)) time.Time {
	now := time.Now()
	wait := time.Duration(0)
	if back && !last.IsZero() {
		wait = max(minProbeGap-now.Sub(last), 0)
	}
	go func() { // a connect may take up to the probe timeout: never on the actor
		if wait > 0 {
			time.Sleep(wait)
		}
		began := stepped.Load()
		res := l.cfg.Probe(l.ctx, at)
		if l.ctx.Err() != nil {
			return // shutting down: a probe cut short says nothing of the decode
		}
		report(peer.Probed{Result: peer.ProbeResult(res), At: l.clk.Now(), Began: began})
	}()
	return now.Add(wait)
}

// close ends the probes still out (shutdown).
func (l *liveness) close() {
	if l != nil {
		l.cancel()
	}
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

// livenessOf lists the watched endpoints (every loaded or fenced peer's), by
// endpoint, asking the peer actors.
func (d *Daemon) livenessOf(ctx context.Context) []EndpointLiveness {
	if d.liveness.cfg.Off {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second) // an actor that does not answer leaves its peer out
	defer cancel()
	peers, _ := d.peers.actors.List(ctx)
	now := d.liveness.clk.Now()
	out := make([]EndpointLiveness, 0, len(peers))
	for _, p := range peers {
		switch p.State {
		case peer.Ready.String(), peer.Suspect.String(), peer.Fenced.String():
		default:
			continue
		}
		v := EndpointLiveness{Endpoint: kv.Endpoint(p.Endpoint).String(), LastProbe: p.LastProbe,
			Fenced: p.State == peer.Fenced.String(), Held: p.Held}
		if p.Failing {
			v.UnreachableMs = now.Sub(p.LastOK).Milliseconds()
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Endpoint < out[j].Endpoint })
	return out
}

// heldWrite is a transfer handed to its peer's actor: posted or failed
// (peer_lost) when the machine says, exactly once.
type heldWrite struct{ post, fail func() }

// gateTransfer hands a write to its decode's actor while any peer's writes
// must go through it (peers.gated: a peer suspect, or one whose writes wait
// for a confirmation, LivenessConfig.ConfirmWrites): the machine holds it
// while its decode does not answer, posts it once a probe begun after it was
// answered, or fails it. No new write is posted toward a decode that may be
// behind a cut link, where it would land only when the link returns,
// possibly after decode gave the room up.
func (d *Daemon) gateTransfer(t kv.Transfer, epoch uint64, post, fail func()) bool {
	if d.liveness == nil || d.liveness.cfg.Off || d.peers.gated.Load() == 0 {
		return false
	}
	d.peers.actors.SendWrite(t.Agent, peer.Write{ID: d.peers.writes.Add(1), Inc: epoch, Payload: &heldWrite{post: post, fail: fail}})
	return true
}

// linkAllowed says whether a link may be dialled to an endpoint: a
// registered decode's (dialects.known) or one the state file names that was
// not dropped since (replayedAt). A fenced decode keeps the pinned link it
// had, so that a room failed by the fence still tells decode.
func (d *Daemon) linkAllowed(at kv.Endpoint) bool {
	return d.dialects.known(at) || d.replayedAt(at)
}

// linkLost runs when the link's monitor sees its TCP connection to decode's
// PULL socket close: each peer at the endpoint probes now (a dead process is
// refused at once), or, without liveness, is dropped at once.
func (d *Daemon) linkLost(at kv.Endpoint) {
	d.peers.actors.SendAt(peer.Endpoint(at), peer.LinkLost{})
}

// isLoopbackIP: a decode on this host (its link cannot be cut).
func isLoopbackIP(ip string) bool {
	a := net.ParseIP(ip)
	return a != nil && a.IsLoopback() || ip == "localhost"
}
