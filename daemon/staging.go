package daemon

import (
	"sync"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// StagingConfig is kvxferd's side of SGLang's staging path
// (SGLANG_DISAGG_STAGING_BUFFER=1; docs/sglang-compat.md, staging). Off (the
// default) kvxferd is SGLang's prefill with staging off: it sends no
// STAGING_REQ, drops STAGING_RSP and WATERMARK (counted), and writes head
// slices into the pages of every decode, a decode that announced a staging
// ring included.
//
// On, for each decode that announced a staging ring (registration frames
// [14]/[15]) and runs another attention TP size than this rank (MHA; the
// head-slice case SGLang stages), kvxferd:
//   - passes the ring into the peer geometry (sglang.PeerGeometry.StagingBase
//     and StagingSize), so the pool can plan staged writes;
//   - sends, when a transfer info of such a decode arrives, one STAGING_REQ
//     per staging-grid slot of the room's pages to decode's endpoint, as
//     SGLang's prefetch_staging_reqs does (never for a dummy info or one
//     without pages);
//   - routes decode's STAGING_RSP to the (agent, room, chunk_idx) it
//     requested and WATERMARK to the agent's ring (the newest kept, as
//     handle_watermark_msg). A reply nobody asked for, or for an agent that
//     is not a staging peer, is dropped and counted; it touches no other
//     room or peer;
//   - holds each chunk to such a decode (stage) until its slot's region is
//     answered and the watermark allows the write (re-checked on every
//     STAGING_RSP and WATERMARK of the agent), then posts it with the
//     region (kv.Transfer.Staged): the pool writes its KV into decode's
//     ring (sglang.Chunk.Staged, the "stg" notification up to 0.5.22) and,
//     for 0.5.23, kvxferd sends CHUNK_READY once the write is done.
//
// SGLang's scheduler, with SGLANG_DISAGG_STAGING_BUFFER=1, already sends
// one chunk per grid slot (compute_grid_segments in prefill.py), each its
// own chunk_id; a chunk that crosses a slot is refused (invalid_request),
// never split here.
type StagingConfig struct {
	Enabled bool
	// ChunkedPrefillSize is the scheduler's chunked_prefill_size, from which
	// the staging grid is derived (0: SGLang's 8192 tokens).
	ChunkedPrefillSize int
}

// Caps on what decodes' frames make kvxferd remember: regions per staging
// peer (oldest forgotten first) and staging peers (one per accepted agent,
// which the link cap bounds already).
const (
	maxStagingRegions = 1 << 14
	// maxStagingReqsPerInfo bounds the STAGING_REQs one transfer info can
	// make kvxferd send (its page count over the grid).
	maxStagingReqsPerInfo = 1 << 12
	// maxStagingHeld bounds the chunks held per staging peer for a region.
	maxStagingHeld = 1 << 12
)

// heldChunk is a transfer waiting for its staging region.
type heldChunk struct {
	t        kv.Transfer
	done     kv.DoneFunc
	post     func(kv.Transfer, kv.DoneFunc)
	chunkIdx int64
}

// stagingKey names one staging-grid slot of a room for one decode agent.
type stagingKey struct {
	room     uint64
	chunkIdx int64
}

// StagingRegion is decode's answer to a STAGING_REQ: where the slot goes in
// its ring, in which round, and where the region ends.
type StagingRegion struct {
	Offset, Round, End int64
	Known              bool // a STAGING_RSP came (else only requested)
}

// stagingPeer is one decode agent with a staging ring.
type stagingPeer struct {
	to             kv.Endpoint
	chunkReady     bool // 0.5.23: CHUNK_READY after the write, no notification on it
	held           []heldChunk
	base           uint64
	size           int64
	wmRound, wmTle int64
	hasWM          bool
	regions        map[stagingKey]*StagingRegion
	order          []stagingKey // request order, to forget the oldest past the cap
}

// StagingStats are the staging table's counters.
type StagingStats struct {
	Peers       int   // staging peers (accepted agents with a ring, another TP size)
	ReqsSent    int64 // STAGING_REQs sent
	ReqsFailed  int64 // STAGING_REQs the link did not take
	RspRouted   int64 // STAGING_RSPs that filled a requested region
	Oversized   int64 // of those, ALLOC_OVERSIZED (the slot can never fit)
	WMRouted    int64 // WATERMARKs kept (newer than the agent's last)
	Dropped     int64 // STAGING_RSP/WATERMARK dropped: staging off, unknown agent, not requested, malformed
	RegionsLost int64 // regions forgotten past maxStagingRegions
	Held        int64 // chunks that waited for their region
	Staged      int64 // chunks posted into a staging region
	Refused     int64 // chunks refused: across a grid slot, no region asked, too many held
	ChunkReady  int64 // CHUNK_READY sent (0.5.23)
	Withdrawn   int64 // held chunks of a room that failed, never written
	HeldNow     int   // chunks waiting now
}

// stagingTable is the per-agent staging state. The ingest goroutine writes it
// (transfer infos, STAGING_RSP, WATERMARK, registrations); it is read by
// whoever plans staged writes, hence the lock (daemon, not actors/).
type stagingTable struct {
	cfg      StagingConfig
	tpSize   int
	mla      bool
	pageSize int
	rank     int // _prefill_unique_rank, CHUNK_READY's prefill_rank
	send     func(to kv.Endpoint, frames [][]byte) error

	mu    sync.Mutex
	peers map[string]*stagingPeer

	reqsSent, reqsFailed, rspRouted, oversized, wmRouted, dropped, regionsLost atomic.Int64
	held, staged, refused, chunkReady, withdrawn                               atomic.Int64
}

func newStagingTable(cfg StagingConfig, tpSize int, mla bool, send func(kv.Endpoint, [][]byte) error) *stagingTable {
	return &stagingTable{cfg: cfg, tpSize: max(tpSize, 1), mla: mla, send: send, peers: map[string]*stagingPeer{}}
}

// stages says whether a registration makes its agent a staging peer: staging
// on, a ring announced, MHA, and another attention TP size (SGLang's
// needs_staging: decode_tp_size != attn_tp_size).
func (s *stagingTable) stages(r *wire.Registration) bool {
	if !s.cfg.Enabled || s.mla || (r.StagingBasePtr == 0 && r.StagingTotalSize == 0) {
		return false
	}
	return max(r.DecodeTPSize, 1) != s.tpSize
}

// geometry puts a staging peer's ring into its peer geometry; other peers
// keep none, so the pool never plans a staged write to them.
func (s *stagingTable) geometry(g *sglang.PeerGeometry, r *wire.Registration) {
	if s.stages(r) {
		g.StagingBase, g.StagingSize = r.StagingBasePtr, r.StagingTotalSize
	}
}

// add records an accepted agent (replacing what an earlier registration of
// it left): a staging peer starts with no regions and no watermark.
// chunkReady: its release reads CHUNK_READY, not notifications (0.5.23).
func (s *stagingTable) add(r *wire.Registration, chunkReady bool) {
	s.drop(r.AgentName)
	if !s.stages(r) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peers[r.AgentName] = &stagingPeer{to: kv.Endpoint{IP: r.DecodeIP, Port: r.DecodePort}, chunkReady: chunkReady,
		base: r.StagingBasePtr, size: r.StagingTotalSize, regions: map[stagingKey]*StagingRegion{}}
}

// drop forgets an agent (dropped, lost, replaced); the chunks it held fail
// peer_lost.
func (s *stagingTable) drop(agent string) {
	s.mu.Lock()
	var held []heldChunk
	if p := s.peers[agent]; p != nil {
		held = p.held
		delete(s.peers, agent)
	}
	s.mu.Unlock()
	for _, h := range held {
		h.done(kv.ReasonPeerLost, nil)
	}
}

// gridPages is the staging grid slot in pages.
func (s *stagingTable) gridPages(pageSize int) int {
	return sglang.StagingGridPages(s.cfg.ChunkedPrefillSize, pageSize)
}

// info sends the STAGING_REQs of a transfer info from a staging peer: one per
// grid slot of its pages (prefetch_staging_reqs), each slot requested once
// per (room, agent). It returns how many were sent.
func (s *stagingTable) info(t *wire.TransferInfo, pageSize int) int {
	if !s.cfg.Enabled || t.IsDummy() || len(t.DstKVIndices) == 0 {
		return 0
	}
	grid := s.gridPages(pageSize)
	total := len(t.DstKVIndices)
	n := min((total+grid-1)/grid, maxStagingReqsPerInfo)
	var reqs []*wire.StagingReq
	s.mu.Lock()
	p := s.peers[t.AgentName]
	if p == nil {
		s.mu.Unlock()
		return 0
	}
	to := p.to
	for c := range n {
		k := stagingKey{room: t.Room, chunkIdx: int64(c)}
		if _, ok := p.regions[k]; ok {
			continue
		}
		s.rememberLocked(p, k)
		reqs = append(reqs, &wire.StagingReq{Room: t.Room, ChunkIdx: c, ChunkPages: min(grid, total-c*grid), SessionID: t.AgentName})
	}
	s.mu.Unlock()
	for _, r := range reqs {
		if err := s.send(to, r.Encode()); err != nil {
			s.reqsFailed.Add(1)
			s.mu.Lock()
			if p := s.peers[t.AgentName]; p != nil {
				delete(p.regions, stagingKey{room: r.Room, chunkIdx: int64(r.ChunkIdx)})
			}
			s.mu.Unlock()
			continue
		}
		s.reqsSent.Add(1)
	}
	return len(reqs)
}

func (s *stagingTable) rememberLocked(p *stagingPeer, k stagingKey) {
	p.regions[k] = &StagingRegion{}
	p.order = append(p.order, k)
	for len(p.regions) > maxStagingRegions && len(p.order) > 0 {
		old := p.order[0]
		p.order = p.order[1:]
		if _, ok := p.regions[old]; ok {
			delete(p.regions, old)
			s.regionsLost.Add(1)
		}
	}
	if len(p.order) > 2*maxStagingRegions { // entries forgotten by forget
		live := p.order[:0]
		for _, k := range p.order {
			if _, ok := p.regions[k]; ok {
				live = append(live, k)
			}
		}
		p.order = live
	}
}

// frame routes a STAGING_RSP or WATERMARK (the ingest's Staging); false when
// it was dropped (staging off, malformed, unknown agent, not asked for).
func (s *stagingTable) frame(m wire.Inbound) bool {
	ok := false
	if s.cfg.Enabled {
		switch m := m.(type) {
		case *wire.StagingRsp:
			if ok = m.Err == nil && s.rsp(m); ok {
				s.wake(m.SessionID)
			}
		case *wire.Watermark:
			if ok = m.Err == nil && s.watermark(m); ok {
				s.wake(m.SessionID)
			}
		}
	}
	if !ok {
		s.dropped.Add(1)
	}
	return ok
}

// rsp fills the region a STAGING_RSP answers; false if nobody asked for it
// (unknown agent, room or slot) or it was already answered. Decode answers
// every prefill rank of the room; each takes its own copy.
func (s *stagingTable) rsp(m *wire.StagingRsp) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peers[m.SessionID]
	if p == nil {
		return false
	}
	r := p.regions[stagingKey{room: m.Room, chunkIdx: m.ChunkIdx}]
	if r == nil || r.Known {
		return false
	}
	if m.Offset != wire.AllocOversized && (m.Offset < 0 || m.End < m.Offset || m.End > p.size || m.Round < 0) {
		return false // a region outside the ring it announced
	}
	*r = StagingRegion{Offset: m.Offset, Round: m.Round, End: m.End, Known: true}
	s.rspRouted.Add(1)
	if m.Offset == wire.AllocOversized {
		s.oversized.Add(1)
	}
	return true
}

// watermark keeps an agent's newest watermark.
func (s *stagingTable) watermark(m *wire.Watermark) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peers[m.SessionID]
	if p == nil {
		return false
	}
	if p.hasWM && !wire.WatermarkAfter(m.Round, m.Tail, p.wmRound, p.wmTle) {
		return true // an older one: accepted, nothing changes
	}
	p.wmRound, p.wmTle, p.hasWM = m.Round, m.Tail, true
	s.wmRouted.Add(1)
	return true
}

// region is the region of (room, chunkIdx) for agent and whether it may be
// written now: decode answered, the slot fits, and the agent's watermark
// allows it (wire.WatermarkReady; round 0 needs none).
func (s *stagingTable) region(agent string, roomID uint64, chunkIdx int64) (r StagingRegion, writable, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peers[agent]
	if p == nil {
		return StagingRegion{}, false, false
	}
	rp := p.regions[stagingKey{room: roomID, chunkIdx: chunkIdx}]
	if rp == nil {
		return StagingRegion{}, false, false
	}
	r = *rp
	if !r.Known || r.Offset == wire.AllocOversized {
		return r, false, true
	}
	wmR, wmT := int64(-1), int64(0)
	if p.hasWM {
		wmR, wmT = p.wmRound, p.wmTle
	}
	return r, wire.WatermarkReady(r.Round, r.End, wmR, wmT), true
}

// forget drops a room's regions for agent (its slots are written or the room
// is over).
func (s *stagingTable) forget(agent string, roomID uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peers[agent]
	if p == nil {
		return
	}
	for k := range p.regions {
		if k.room == roomID {
			delete(p.regions, k)
		}
	}
}

func (s *stagingTable) stats() StagingStats {
	s.mu.Lock()
	n, h := len(s.peers), 0
	for _, p := range s.peers {
		h += len(p.held)
	}
	s.mu.Unlock()
	return StagingStats{Peers: n, ReqsSent: s.reqsSent.Load(), ReqsFailed: s.reqsFailed.Load(),
		RspRouted: s.rspRouted.Load(), Oversized: s.oversized.Load(), WMRouted: s.wmRouted.Load(),
		Dropped: s.dropped.Load(), RegionsLost: s.regionsLost.Load(), Held: s.held.Load(), Staged: s.staged.Load(),
		Refused: s.refused.Load(), ChunkReady: s.chunkReady.Load(), Withdrawn: s.withdrawn.Load(), HeldNow: h}
}

// writableLocked: may the chunk of slot k be posted now (its region answered
// and the watermark past it, or ALLOC_OVERSIZED, which the plan refuses with
// SGLang's reason)?
func (s *stagingTable) writableLocked(p *stagingPeer, r *StagingRegion) bool {
	if !r.Known {
		return false
	}
	if r.Offset == wire.AllocOversized {
		return true
	}
	wmR, wmT := int64(-1), int64(0)
	if p.hasWM {
		wmR, wmT = p.wmRound, p.wmTle
	}
	return wire.WatermarkReady(r.Round, r.End, wmR, wmT)
}

// stage takes a transfer to a staging peer (the transfers' hook; false: not
// staged, post it as usual). A chunk with pages goes to its grid slot's
// region: posted at once when writable, else held until a STAGING_RSP or
// WATERMARK of the agent makes it so (wake). A chunk across two slots, for a
// slot kvxferd never asked for, or past maxStagingHeld fails
// invalid_request / transfer_error. post is the transfers' own path.
func (s *stagingTable) stage(t kv.Transfer, done kv.DoneFunc, post func(kv.Transfer, kv.DoneFunc)) bool {
	if !s.cfg.Enabled || t.Staged != nil {
		return false
	}
	n := min(len(t.SrcPages), len(t.DstPages))
	if n == 0 {
		return false // a last chunk without pages: aux only, as SGLang
	}
	grid := s.gridPages(s.pageSize)
	ci := t.PageStart / grid
	s.mu.Lock()
	p := s.peers[t.Agent]
	if p == nil {
		s.mu.Unlock()
		return false
	}
	h := heldChunk{t: t, done: done, post: post, chunkIdx: int64(ci)}
	r := p.regions[stagingKey{room: t.Room, chunkIdx: h.chunkIdx}]
	switch {
	case (t.PageStart+n-1)/grid != ci, r == nil:
		s.mu.Unlock()
		s.refused.Add(1)
		done(kv.ReasonInvalidRequest, nil)
		return true
	case s.writableLocked(p, r):
		rg := *r
		s.mu.Unlock()
		s.postStaged(h, rg, p.to, p.chunkReady)
		return true
	case len(p.held) >= maxStagingHeld:
		s.mu.Unlock()
		s.refused.Add(1)
		done(kv.ReasonTransferError, nil)
		return true
	}
	p.held = append(p.held, h)
	s.mu.Unlock()
	s.held.Add(1)
	return true
}

// withdraw ends the held chunks of a failed room (room.Effects.Withdraw)
// without writing them: decode may free or reuse the room's regions once it
// failed, so a late write could land in another room's region. Their room
// is draining; it hears transfer_error for each.
func (s *stagingTable) withdraw(roomID uint64) {
	var out []heldChunk
	s.mu.Lock()
	for _, p := range s.peers {
		keep := p.held[:0]
		for _, h := range p.held {
			if h.t.Room == roomID {
				out = append(out, h)
				continue
			}
			keep = append(keep, h)
		}
		clear(p.held[len(keep):])
		p.held = keep
	}
	s.mu.Unlock()
	for _, h := range out {
		s.withdrawn.Add(1)
		h.done(kv.ReasonTransferError, nil)
	}
}

// wake posts, in order, the held chunks of agent that became writable.
func (s *stagingTable) wake(agent string) {
	type ready struct {
		h  heldChunk
		rg StagingRegion
	}
	var out []ready
	s.mu.Lock()
	p := s.peers[agent]
	if p == nil {
		s.mu.Unlock()
		return
	}
	keep := p.held[:0]
	for _, h := range p.held {
		if r := p.regions[stagingKey{room: h.t.Room, chunkIdx: h.chunkIdx}]; r != nil && s.writableLocked(p, r) {
			out = append(out, ready{h, *r})
			continue
		} else if r == nil { // forgotten past the cap: it can never be answered
			out = append(out, ready{h: h})
			continue
		}
		keep = append(keep, h)
	}
	clear(p.held[len(keep):])
	p.held = keep
	to, cr := p.to, p.chunkReady
	s.mu.Unlock()
	for _, x := range out {
		if !x.rg.Known {
			s.refused.Add(1)
			x.h.done(kv.ReasonInvalidRequest, nil)
			continue
		}
		s.postStaged(x.h, x.rg, to, cr)
	}
}

// postStaged posts a chunk into its region; once its writes are done the
// slot is forgotten (decode frees it) and, for a CHUNK_READY release, the
// signal goes to decode first.
func (s *stagingTable) postStaged(h heldChunk, rg StagingRegion, to kv.Endpoint, chunkReady bool) {
	t := h.t
	t.Staged = &kv.StagedRegion{ChunkIdx: int(h.chunkIdx), Offset: rg.Offset}
	inner := h.done
	s.staged.Add(1)
	h.post(t, func(fail kv.Reason, signal [][]byte) {
		s.mu.Lock()
		if p := s.peers[t.Agent]; p != nil {
			delete(p.regions, stagingKey{room: t.Room, chunkIdx: h.chunkIdx})
		}
		s.mu.Unlock()
		if fail == kv.ReasonNone && chunkReady {
			n := min(len(t.SrcPages), len(t.DstPages))
			m := &wire.ChunkReady{Room: t.Room, ChunkIdx: int(h.chunkIdx), PageStart: t.PageStart, NumPages: n,
				WriterID: t.Agent, PrefillRank: s.rank}
			if err := s.send(to, m.Encode()); err != nil {
				fail = kv.ReasonTransferError // decode would wait for it forever
			} else {
				s.chunkReady.Add(1)
			}
		}
		inner(fail, signal)
	})
}

// StagingStats returns the staging counters (zero with -staging off, but for
// Dropped).
func (d *Daemon) StagingStats() StagingStats { return d.peers.staging().stats() }

// staging is the peers' staging table.
func (p *peers) staging() *stagingTable {
	p.stgOnce.Do(func() {
		d := p.d
		p.stg = newStagingTable(d.cfg.Staging, d.cfg.Rank.TPSize, d.cfg.MLA, func(to kv.Endpoint, f [][]byte) error {
			return d.links.send(to, f)
		})
		p.stg.pageSize, p.stg.rank = d.cfg.PageSize, d.cfg.Rank.Unique()
	})
	return p.stg
}
