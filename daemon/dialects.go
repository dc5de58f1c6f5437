package daemon

import (
	"maps"
	"sort"

	"github.com/kvxfer/kvxfer/actors"
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
// address notices go to) and by agent name. It has one writer, its owner
// (actors.Owned): the peer actors record what their registration decided
// (accepted in a dialect, or rejected, and later dropped), the ingest records
// the registrations it rejects at the cap and the ABORTs that carry a
// generation. Each change publishes a new table whole; the readers (room
// actors notifying decode, the ingest, the links, /debug/peers) read the
// table published last without waiting for anyone.
type dialects struct {
	fixed  wire.Dialect // -decode-protocol pinned to one release (else auto)
	legacy wire.Dialect // the 23-frame default
	table  *actors.Owned[dialectTable, dialectHistory]
	// staging, when set, says whether a registration makes a staging peer
	// (stager.stages): recorded with it, so that the transfers read it
	// without asking the peer's actor.
	staging func(*wire.Registration) bool
}

// dialectTable is one published version of the table: never changed once
// published (an edit clones it), nor are the peerInfos it points to.
type dialectTable struct {
	byEndpoint map[kv.Endpoint]*peerInfo // the latest registration at each endpoint, while not dropped
	byAgent    map[string]*peerInfo
}

// dialectHistory is the owner's own: the order rejected and dropped agents
// are forgotten in, and the numbers that tell one record of an agent from
// its next.
type dialectHistory struct {
	rejected []dialectEntry // oldest first, to forget past maxRejectedEntries
	dropped  []dialectEntry // oldest first, to forget past maxDroppedEntries
	seq      uint64
}

// dialectEntry names one record of the history by its number (a record
// replaced by a changed copy keeps it).
type dialectEntry struct {
	agent string
	to    kv.Endpoint
	seq   uint64
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
	Stages   bool         `json:"staging,omitempty"` // its chunks go into its staging ring
	to       kv.Endpoint
	seq      uint64
}

func newDialects(fixed, legacy wire.Dialect) *dialects {
	if legacy == wire.DialectUnknown || legacy == wire.Dialect0523 {
		legacy = wire.Dialect0520
	}
	first := &dialectTable{byEndpoint: map[kv.Endpoint]*peerInfo{}, byAgent: map[string]*peerInfo{}}
	return &dialects{fixed: fixed, legacy: legacy, table: actors.NewOwned[dialectTable, dialectHistory](first)}
}

// close stops the owner (shutdown): the last table stays readable, later
// changes are not recorded.
func (t *dialects) close() { t.table.Close() }

// clone is the next version's start.
func (c *dialectTable) clone() *dialectTable {
	return &dialectTable{byEndpoint: maps.Clone(c.byEndpoint), byAgent: maps.Clone(c.byAgent)}
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
	p.Stages = err == nil && t.staging != nil && t.staging(r)
	t.table.Edit(func(cur *dialectTable, h *dialectHistory) *dialectTable {
		if len(cur.byAgent) >= maxDialectEntries {
			return nil
		}
		h.seq++
		p.seq = h.seq // p is not published yet: the owner may still set it
		next := cur.clone()
		if old, ok := next.byAgent[p.Agent]; ok && old.to != p.to && next.byEndpoint[old.to] == old {
			delete(next.byEndpoint, old.to)
		}
		next.byAgent[p.Agent] = p
		next.byEndpoint[p.to] = p
		if p.Rejected != "" {
			h.rejected = next.forget(append(h.rejected, dialectEntry{p.Agent, p.to, p.seq}), maxRejectedEntries)
		}
		return next
	})
	return d, err
}

// forget drops the oldest entries of list past n from the table (a version
// not published yet).
func (c *dialectTable) forget(list []dialectEntry, n int) []dialectEntry {
	for len(list) > n {
		e := list[0]
		list = list[1:]
		if p := c.byAgent[e.agent]; p != nil && p.seq == e.seq {
			delete(c.byAgent, e.agent)
		}
		if p := c.byEndpoint[e.to]; p != nil && p.seq == e.seq {
			delete(c.byEndpoint, e.to)
		}
	}
	return list
}

// known says whether a registered decode (accepted or rejected, not dropped)
// is at this endpoint: only such endpoints get a link.
func (t *dialects) known(to kv.Endpoint) bool {
	_, ok := t.table.Load().byEndpoint[to]
	return ok
}

// acceptedAt is the accepted, live agent registered last at an endpoint ("" if none).
func (t *dialects) acceptedAt(to kv.Endpoint) string {
	if p, ok := t.table.Load().byEndpoint[to]; ok && p.Rejected == "" && p.Dropped == "" {
		return p.Agent
	}
	return ""
}

// drop marks an agent dropped (kept for /debug/peers, bounded) and forgets
// its endpoint, so no link is dialled for it again; it returns the endpoint.
func (t *dialects) drop(agent, why string, lost bool) (kv.Endpoint, bool) {
	var to kv.Endpoint
	found := false
	t.table.Edit(func(cur *dialectTable, h *dialectHistory) *dialectTable {
		p, ok := cur.byAgent[agent]
		if !ok || p.Dropped != "" {
			return nil
		}
		q := *p
		q.Dropped, q.Lost = why, p.Lost || lost
		next := cur.clone()
		next.byAgent[agent] = &q
		if next.byEndpoint[p.to] == p {
			delete(next.byEndpoint, p.to)
		}
		h.dropped = next.forget(append(h.dropped, dialectEntry{agent, p.to, p.seq}), maxDroppedEntries)
		to, found = p.to, true
		return next
	})
	return to, found
}

// sawGeneration upgrades the decode at this endpoint to 0.5.22: only 0.5.22+
// put a generation on an ABORT. Every ABORT of such a decode carries one, so
// the table is asked first and changed only by the first.
func (t *dialects) sawGeneration(from kv.Endpoint) {
	if t.fixed != wire.DialectUnknown {
		return
	}
	older := func(p *peerInfo, ok bool) bool { return ok && p.Rejected == "" && p.Dialect < wire.Dialect0522 }
	if p, ok := t.table.Load().byEndpoint[from]; !older(p, ok) {
		return
	}
	t.table.Edit(func(cur *dialectTable, _ *dialectHistory) *dialectTable {
		p, ok := cur.byEndpoint[from]
		if !older(p, ok) {
			return nil
		}
		q := *p
		q.Dialect, q.Release, q.Detected = wire.Dialect0522, wire.Dialect0522.String(), "ABORT with a generation"
		next := cur.clone()
		next.byEndpoint[from] = &q
		if next.byAgent[p.Agent] == p {
			next.byAgent[p.Agent] = &q
		}
		return next
	})
}

// at is the dialect notices to this endpoint are written in.
func (t *dialects) at(to kv.Endpoint) wire.Dialect {
	if t.fixed != wire.DialectUnknown {
		return t.fixed
	}
	p, ok := t.table.Load().byEndpoint[to]
	if !ok || p.Dialect == wire.DialectUnknown {
		return t.legacy
	}
	return p.Dialect
}

// rejection says why the agent's registration was rejected ("" if it was not).
func (t *dialects) rejection(agent string) string {
	if p, ok := t.table.Load().byAgent[agent]; ok {
		return p.Rejected
	}
	return ""
}

// rejectionAt is rejection by endpoint.
func (t *dialects) rejectionAt(to kv.Endpoint) string {
	if p, ok := t.table.Load().byEndpoint[to]; ok {
		return p.Rejected
	}
	return ""
}

// dropped says whether the agent's last record is a drop.
func (t *dialects) dropped(agent string) bool {
	p, ok := t.table.Load().byAgent[agent]
	return ok && p.Dropped != ""
}

// list returns every peer, by agent name, for /debug/peers.
func (t *dialects) list() []peerInfo {
	cur := t.table.Load()
	out := make([]peerInfo, 0, len(cur.byAgent))
	for _, p := range cur.byAgent {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Agent < out[j].Agent })
	return out
}

// counts returns the number of accepted peers per dialect and of rejected ones.
func (t *dialects) counts() (map[wire.Dialect]int, int) {
	by, rejected := map[wire.Dialect]int{}, 0
	for _, p := range t.table.Load().byAgent {
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

// stages says whether agent is an accepted staging peer (not dropped): its
// chunks go to its actor to wait for their region.
func (t *dialects) stages(agent string) bool {
	p, ok := t.table.Load().byAgent[agent]
	return ok && p.Stages && p.Rejected == "" && p.Dropped == ""
}
