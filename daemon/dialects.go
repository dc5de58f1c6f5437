package daemon

import (
	"sort"
	"sync"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// maxDialectEntries caps the table: it grows with registrations, which come
// from outside. Past it, new peers are served with the configured default.
// Accepted agents are capped by the peers table (the link cap); rejected and
// dropped ones are kept, for /debug/peers, up to maxRejectedEntries and
// maxDroppedEntries, oldest forgotten first.
const (
	maxDialectEntries  = 1 << 14
	maxRejectedEntries = 1 << 10
	maxDroppedEntries  = 256
)

// dialects is what each decode peer speaks, keyed by its PULL endpoint (the
// address notices go to) and by agent name. The ingest goroutine writes it
// (registrations, ABORTs); room actors read it when they notify decode.
type dialects struct {
	fixed  wire.Dialect // -decode-protocol pinned to one release (else auto)
	legacy wire.Dialect // the 23-frame default

	mu         sync.RWMutex
	byEndpoint map[kv.Endpoint]*peerInfo // the latest registration at each endpoint, while not dropped
	byAgent    map[string]*peerInfo
	rejected   []*peerInfo // oldest first, to forget past maxRejectedEntries
	dropped    []*peerInfo // oldest first, to forget past maxDroppedEntries
}

// peerInfo is one decode agent as kvxferd sees it.
type peerInfo struct {
	Agent    string       `json:"agent"`
	Endpoint string       `json:"endpoint"`
	Dialect  wire.Dialect `json:"-"`
	Release  string       `json:"dialect"`
	Frames   int          `json:"registration_frames"`
	Detected string       `json:"detected_by"`
	Rejected string       `json:"rejected,omitempty"`
	Lost     bool         `json:"lost,omitempty"`
	Dropped  string       `json:"dropped,omitempty"` // why kvxferd forgot the peer
	to       kv.Endpoint
}

func newDialects(fixed, legacy wire.Dialect) *dialects {
	if legacy == wire.DialectUnknown || legacy == wire.Dialect0523 {
		legacy = wire.Dialect0520
	}
	return &dialects{fixed: fixed, legacy: legacy, byEndpoint: map[kv.Endpoint]*peerInfo{}, byAgent: map[string]*peerInfo{}}
}

// register records a registration's dialect, or why it was rejected.
func (t *dialects) register(r *wire.Registration) (wire.Dialect, error) {
	return t.registerOr(r, nil)
}

// of is the dialect a registration would be served in, recording nothing.
func (t *dialects) of(r *wire.Registration) wire.Dialect {
	if t.fixed != wire.DialectUnknown {
		return t.fixed
	}
	d, err := wire.DialectOf(r, t.legacy)
	if err != nil {
		return wire.DialectUnknown
	}
	return d
}

// reject records a registration rejected for why, whatever its frames say.
func (t *dialects) reject(r *wire.Registration, why error) {
	_, _ = t.registerOr(r, why)
}

func (t *dialects) registerOr(r *wire.Registration, why error) (wire.Dialect, error) {
	d, err := wire.DialectOf(r, t.legacy)
	if why != nil {
		err = why
	}
	p := &peerInfo{Agent: r.AgentName, to: kv.Endpoint{IP: r.DecodeIP, Port: r.DecodePort}, Frames: r.Frames, Detected: "registration"}
	p.Endpoint = p.to.String()
	switch {
	case err != nil:
		p.Rejected = err.Error()
	case t.fixed != wire.DialectUnknown:
		d, p.Detected = t.fixed, "pinned (-decode-protocol)"
	case d != wire.Dialect0523:
		p.Detected = "registration (23 frames: -decode-protocol-legacy)"
	}
	p.Dialect, p.Release = d, d.String()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.byAgent) >= maxDialectEntries {
		return d, err
	}
	if old, ok := t.byAgent[r.AgentName]; ok && old.to != p.to && t.byEndpoint[old.to] == old {
		delete(t.byEndpoint, old.to)
	}
	t.byAgent[r.AgentName] = p
	t.byEndpoint[p.to] = p
	if p.Rejected != "" {
		t.rejected = t.forgetLocked(append(t.rejected, p), maxRejectedEntries)
	}
	return d, err
}

// forgetLocked drops the oldest entries of list past n from the table.
func (t *dialects) forgetLocked(list []*peerInfo, n int) []*peerInfo {
	for len(list) > n {
		p := list[0]
		list[0] = nil
		list = list[1:]
		if t.byAgent[p.Agent] == p {
			delete(t.byAgent, p.Agent)
		}
		if t.byEndpoint[p.to] == p {
			delete(t.byEndpoint, p.to)
		}
	}
	return list
}

// known says whether a registered decode (accepted or rejected, not dropped)
// is at this endpoint: only such endpoints get a link.
func (t *dialects) known(to kv.Endpoint) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, ok := t.byEndpoint[to]
	return ok
}

// acceptedAt is the accepted, live agent registered last at an endpoint ("" if none).
func (t *dialects) acceptedAt(to kv.Endpoint) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if p, ok := t.byEndpoint[to]; ok && p.Rejected == "" && p.Dropped == "" {
		return p.Agent
	}
	return ""
}

// drop marks an agent dropped (kept for /debug/peers, bounded) and forgets
// its endpoint, so no link is dialled for it again; it returns the endpoint.
func (t *dialects) drop(agent, why string, lost bool) (kv.Endpoint, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.byAgent[agent]
	if !ok || p.Dropped != "" {
		return kv.Endpoint{}, false
	}
	p.Dropped, p.Lost = why, p.Lost || lost
	if t.byEndpoint[p.to] == p {
		delete(t.byEndpoint, p.to)
	}
	t.dropped = t.forgetLocked(append(t.dropped, p), maxDroppedEntries)
	return p.to, true
}

// sawGeneration upgrades the decode at this endpoint to 0.5.22: only 0.5.22+
// put a generation on an ABORT.
func (t *dialects) sawGeneration(from kv.Endpoint) {
	if t.fixed != wire.DialectUnknown {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.byEndpoint[from]; ok && p.Rejected == "" && p.Dialect < wire.Dialect0522 {
		p.Dialect, p.Release, p.Detected = wire.Dialect0522, wire.Dialect0522.String(), "ABORT with a generation"
	}
}

// at is the dialect notices to this endpoint are written in.
func (t *dialects) at(to kv.Endpoint) wire.Dialect {
	if t.fixed != wire.DialectUnknown {
		return t.fixed
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	p, ok := t.byEndpoint[to]
	if !ok || p.Dialect == wire.DialectUnknown {
		return t.legacy
	}
	return p.Dialect
}

// rejection says why the agent's registration was rejected ("" if it was not).
func (t *dialects) rejection(agent string) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if p, ok := t.byAgent[agent]; ok {
		return p.Rejected
	}
	return ""
}

// rejectionAt is rejection by endpoint.
func (t *dialects) rejectionAt(to kv.Endpoint) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if p, ok := t.byEndpoint[to]; ok {
		return p.Rejected
	}
	return ""
}

// list returns every peer, by agent name, for /debug/peers.
func (t *dialects) list() []peerInfo {
	t.mu.RLock()
	out := make([]peerInfo, 0, len(t.byAgent))
	for _, p := range t.byAgent {
		out = append(out, *p)
	}
	t.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Agent < out[j].Agent })
	return out
}

// counts returns the number of accepted peers per dialect and of rejected ones.
func (t *dialects) counts() (map[wire.Dialect]int, int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	by, rejected := map[wire.Dialect]int{}, 0
	for _, p := range t.byAgent {
		switch {
		case p.Rejected != "":
			rejected++
		case p.Dropped == "":
			by[p.Dialect]++
		}
	}
	return by, rejected
}

// DecodePeers counts decode agents by dialect, rejected ones under
// "rejected" (telemetry.Source: the kvxfer_decode_peers gauge).
func (d *Daemon) DecodePeers() map[string]int64 {
	by, rejected := d.dialects.counts()
	out := map[string]int64{"rejected": int64(rejected)}
	for _, dl := range wire.Dialects() {
		out[dl.String()] = int64(by[dl])
	}
	return out
}

// dialectSetting describes -decode-protocol for logs.
func (d *Daemon) dialectSetting() string {
	if d.cfg.Dialect != wire.DialectUnknown {
		return "pinned " + d.cfg.Dialect.String()
	}
	return "auto (23 frames: " + d.dialects.legacy.String() + ")"
}
