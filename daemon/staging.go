package daemon

import (
	"slices"
	"sync/atomic"

	"github.com/kvxfer/kvxfer/actors/peer"

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
//   - holds each chunk to such a decode (at its actor) until its slot's region is
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
// peer (oldest forgotten first); staging peers are one per accepted agent,
// which the link cap bounds already.
const (
	maxStagingRegions = 1 << 14
	// maxStagingReqsPerInfo bounds the STAGING_REQs one transfer info can
	// make kvxferd send (its page count over the grid).
	maxStagingReqsPerInfo = 1 << 12
	// maxStagingHeld bounds the chunks held per staging peer for a region.
	maxStagingHeld = 1 << 12
)

// stagedChunk is a chunk to a staging peer, handed to its actor as a staged
// peer.Write: the machine holds it until a Writable names it.
type stagedChunk struct {
	t        kv.Transfer
	done     kv.DoneFunc
	post     func(kv.Transfer, kv.DoneFunc) // the transfers' own path (the pool)
	chunkIdx int64
	// refuse, when set, is how it ends at its release: it can never be
	// written (no region asked for its slot, across two slots, too many held).
	refuse kv.Reason
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

// stagingPeer is one incarnation of a decode agent with a staging ring: its
// regions, watermark and ring, owned by the agent's actor (stagingLocal) and
// touched only there; it goes when the incarnation ends.
type stagingPeer struct {
	to             kv.Endpoint
	chunkReady     bool // 0.5.23: CHUNK_READY after the write, no notification on it
	base           uint64
	size           int64
	wmRound, wmTle int64
	hasWM          bool
	regions        map[stagingKey]*StagingRegion
	order          []stagingKey // request order, to forget the oldest past the cap
	// waiting are the staged chunks the machine holds for their region, by
	// write ID (IDs grow in the order chunks are handed over).
	waiting map[uint64]*stagedChunk
}

// stagingLocal is a peer actor's staging state (peerLocal.stg): the current
// incarnation's staging peer (nil: not a staging peer, or ended) and every
// staged chunk the machine names by ID.
type stagingLocal struct {
	p      *stagingPeer
	chunks map[uint64]*stagedChunk
}

// stagingDone is a staged write's end, reported to its actor (peer.Staging):
// its slot is forgotten (decode frees it), if its incarnation is current.
type stagingDone struct {
	p   *stagingPeer
	key stagingKey
}

// stagingAsk asks an actor for one region (tests, /debug): the answer goes to
// reply.
type stagingAsk struct {
	key   stagingKey
	reply chan stagingAnswer
}

type stagingAnswer struct {
	r                StagingRegion
	writable, ok, is bool // is: the agent is a staging peer now
}

// StagingStats are the staging counters.
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

// stager is the daemon-wide part of staging: the rule, the grid and the
// counters. Each staging peer's state is its actor's (stagingLocal); the
// stager keeps none, so it needs no lock.
type stager struct {
	cfg      StagingConfig
	tpSize   int
	mla      bool
	pageSize int
	rank     int // _prefill_unique_rank, CHUNK_READY's prefill_rank
	send     func(to kv.Endpoint, frames [][]byte) error

	reqsSent, reqsFailed, rspRouted, oversized, wmRouted, dropped, regionsLost atomic.Int64
	held, staged, refused, chunkReady, withdrawn                               atomic.Int64
	// peersNow and heldNow are what the actors hold now (each adds and takes
	// back its own).
	peersNow, heldNow atomic.Int64
}

func newStager(cfg StagingConfig, tpSize int, mla bool, send func(kv.Endpoint, [][]byte) error) *stager {
	return &stager{cfg: cfg, tpSize: max(tpSize, 1), mla: mla, send: send}
}

// stages says whether a registration makes its agent a staging peer: staging
// on, a ring announced, MHA, and another attention TP size (SGLang's
// needs_staging: decode_tp_size != attn_tp_size).
func (s *stager) stages(r *wire.Registration) bool {
	if !s.cfg.Enabled || s.mla || (r.StagingBasePtr == 0 && r.StagingTotalSize == 0) {
		return false
	}
	return max(r.DecodeTPSize, 1) != s.tpSize
}

// geometry puts a staging peer's ring into its peer geometry; other peers
// keep none, so the pool never plans a staged write to them.
func (s *stager) geometry(g *sglang.PeerGeometry, r *wire.Registration) {
	if s.stages(r) {
		g.StagingBase, g.StagingSize = r.StagingBasePtr, r.StagingTotalSize
	}
}

// began starts a loaded incarnation's staging state (none unless it stages):
// no regions and no watermark yet. chunkReady: its release reads
// CHUNK_READY, not notifications (0.5.23).
func (s *stager) began(l *stagingLocal, r *wire.Registration, chunkReady bool) {
	s.ended(l)
	if !s.stages(r) {
		return
	}
	s.peersNow.Add(1)
	l.p = &stagingPeer{to: kv.Endpoint{IP: r.DecodeIP, Port: r.DecodePort}, chunkReady: chunkReady,
		base: r.StagingBasePtr, size: r.StagingTotalSize, regions: map[stagingKey]*StagingRegion{},
		waiting: map[uint64]*stagedChunk{}}
}

// ended forgets the incarnation's staging state; the chunks it held are the
// machine's to fail (peer_lost, in the same step).
func (s *stager) ended(l *stagingLocal) {
	if l.p == nil {
		return
	}
	s.peersNow.Add(-1)
	s.heldNow.Add(-int64(len(l.p.waiting)))
	l.p = nil
}

// gridPages is the staging grid slot in pages.
func (s *stager) gridPages(pageSize int) int {
	return sglang.StagingGridPages(s.cfg.ChunkedPrefillSize, pageSize)
}

// info sends the STAGING_REQs of a transfer info from a staging peer: one per
// grid slot of its pages (prefetch_staging_reqs), each slot requested once
// per (room, agent). It returns how many were sent.
func (s *stager) info(p *stagingPeer, t *wire.TransferInfo, pageSize int) int {
	if p == nil || !s.cfg.Enabled || t.IsDummy() || len(t.DstKVIndices) == 0 {
		return 0
	}
	grid := s.gridPages(pageSize)
	total := len(t.DstKVIndices)
	n := min((total+grid-1)/grid, maxStagingReqsPerInfo)
	sent := 0
	for c := range n {
		k := stagingKey{room: t.Room, chunkIdx: int64(c)}
		if _, ok := p.regions[k]; ok {
			continue
		}
		s.remember(p, k)
		r := &wire.StagingReq{Room: t.Room, ChunkIdx: c, ChunkPages: min(grid, total-c*grid), SessionID: t.AgentName}
		sent++
		if err := s.send(p.to, r.Encode()); err != nil {
			s.reqsFailed.Add(1)
			delete(p.regions, k) // the next info asks again
			continue
		}
		s.reqsSent.Add(1)
	}
	return sent
}

func (s *stager) remember(p *stagingPeer, k stagingKey) {
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

// frame applies a STAGING_RSP or WATERMARK to its agent's staging peer (nil:
// the agent is none now); false when it was dropped (malformed, not asked
// for). It counts the drop.
func (s *stager) frame(p *stagingPeer, m wire.Inbound) bool {
	ok := false
	if s.cfg.Enabled && p != nil {
		switch m := m.(type) {
		case *wire.StagingRsp:
			ok = m.Err == nil && s.rsp(p, m)
		case *wire.Watermark:
			ok = m.Err == nil && s.watermark(p, m)
		}
	}
	if !ok {
		s.dropped.Add(1)
	}
	return ok
}

// rsp fills the region a STAGING_RSP answers; false if nobody asked for it
// (unknown room or slot) or it was already answered. Decode answers every
// prefill rank of the room; each takes its own copy.
func (s *stager) rsp(p *stagingPeer, m *wire.StagingRsp) bool {
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
func (s *stager) watermark(p *stagingPeer, m *wire.Watermark) bool {
	if p.hasWM && !wire.WatermarkAfter(m.Round, m.Tail, p.wmRound, p.wmTle) {
		return true // an older one: accepted, nothing changes
	}
	p.wmRound, p.wmTle, p.hasWM = m.Round, m.Tail, true
	s.wmRouted.Add(1)
	return true
}

// region is the region of (room, chunkIdx) and whether it may be written
// now: decode answered, the slot fits, and the watermark allows it
// (wire.WatermarkReady; round 0 needs none).
func (p *stagingPeer) region(roomID uint64, chunkIdx int64) (r StagingRegion, writable, ok bool) {
	if p == nil {
		return StagingRegion{}, false, false
	}
	rp := p.regions[stagingKey{room: roomID, chunkIdx: chunkIdx}]
	if rp == nil {
		return StagingRegion{}, false, false
	}
	r = *rp
	return r, r.Known && r.Offset != wire.AllocOversized && p.watermarkAllows(&r), true
}

func (p *stagingPeer) watermarkAllows(r *StagingRegion) bool {
	wmR, wmT := int64(-1), int64(0)
	if p.hasWM {
		wmR, wmT = p.wmRound, p.wmTle
	}
	return wire.WatermarkReady(r.Round, r.End, wmR, wmT)
}

// writable: may the chunk of a slot be posted now (its region answered and
// the watermark past it, or ALLOC_OVERSIZED, which the plan refuses with
// SGLang's reason)?
func (p *stagingPeer) writable(r *StagingRegion) bool {
	if !r.Known {
		return false
	}
	return r.Offset == wire.AllocOversized || p.watermarkAllows(r)
}

// forget drops a room's regions (its slots are written or the room is over).
func (p *stagingPeer) forget(roomID uint64) {
	for k := range p.regions {
		if k.room == roomID {
			delete(p.regions, k)
		}
	}
}

func (s *stager) stats() StagingStats {
	return StagingStats{Peers: int(s.peersNow.Load()), ReqsSent: s.reqsSent.Load(), ReqsFailed: s.reqsFailed.Load(),
		RspRouted: s.rspRouted.Load(), Oversized: s.oversized.Load(), WMRouted: s.wmRouted.Load(),
		Dropped: s.dropped.Load(), RegionsLost: s.regionsLost.Load(), Held: s.held.Load(), Staged: s.staged.Load(),
		Refused: s.refused.Load(), ChunkReady: s.chunkReady.Load(), Withdrawn: s.withdrawn.Load(),
		HeldNow: int(s.heldNow.Load())}
}

// chunk makes the staged chunk of a transfer to a staging peer, or nil when it
// is not staged (staging off, planned into a region already, or a last chunk
// without pages: aux only, as SGLang): the transfers post it as usual.
func (s *stager) chunk(t kv.Transfer, done kv.DoneFunc, post func(kv.Transfer, kv.DoneFunc)) *stagedChunk {
	if !s.cfg.Enabled || t.Staged != nil {
		return nil
	}
	n := min(len(t.SrcPages), len(t.DstPages))
	if n == 0 {
		return nil
	}
	grid := s.gridPages(s.pageSize)
	ci := t.PageStart / grid
	c := &stagedChunk{t: t, done: done, post: post, chunkIdx: int64(ci)}
	if (t.PageStart+n-1)/grid != ci {
		c.refuse = kv.ReasonInvalidRequest // across two slots: never split here
	}
	return c
}

// hold records a staged write as its actor steps it (the machine names it
// by ID from then on: Post, Fail, Withdrawn).
func (l *stagingLocal) hold(id uint64, c *stagedChunk) {
	if l.chunks == nil {
		l.chunks = map[uint64]*stagedChunk{}
	}
	l.chunks[id] = c
}

// handed takes a staged write the machine now holds waiting (it was not
// failed): true when it may be released at once (writable now, or to be
// refused at its release: no region asked for its slot, too many held).
func (s *stager) handed(l *stagingLocal, id uint64) bool {
	c := l.chunks[id]
	if c == nil {
		return false // failed in the same step
	}
	p := l.p
	if c.refuse != kv.ReasonNone || p == nil {
		return true // released at once: refused, or (no staging peer now) posted as usual
	}
	r := p.regions[stagingKey{room: c.t.Room, chunkIdx: c.chunkIdx}]
	switch {
	case r == nil:
		c.refuse = kv.ReasonInvalidRequest
		return true
	case p.writable(r):
		return true
	case len(p.waiting) >= maxStagingHeld:
		c.refuse = kv.ReasonTransferError
		return true
	}
	p.waiting[id] = c
	s.held.Add(1)
	s.heldNow.Add(1)
	return false
}

// released are the waiting chunks that may go now, in the order they were
// handed over: their region is writable, or was forgotten past the cap (it
// can never be answered: refused at its release).
func (s *stager) released(l *stagingLocal) []uint64 {
	p := l.p
	if p == nil {
		return nil
	}
	var out []uint64
	for id, c := range p.waiting {
		r := p.regions[stagingKey{room: c.t.Room, chunkIdx: c.chunkIdx}]
		if r == nil {
			c.refuse = kv.ReasonInvalidRequest
		} else if !p.writable(r) {
			continue
		}
		out = append(out, id)
		delete(p.waiting, id)
	}
	s.heldNow.Add(-int64(len(out)))
	slices.Sort(out)
	return out
}

// take hands over the staged chunk the machine names (nil: not a staged
// write), no longer waiting.
func (s *stager) take(l *stagingLocal, id uint64) *stagedChunk {
	c := l.chunks[id]
	if c == nil {
		return nil
	}
	delete(l.chunks, id)
	if l.p != nil {
		if _, ok := l.p.waiting[id]; ok {
			delete(l.p.waiting, id)
			s.heldNow.Add(-1)
		}
	}
	return c
}

// withdraw ends a staged write of a failed room, unwritten: decode may free
// or reuse the room's regions once it failed, so a late write could land in
// another room's region. The room is draining; it hears transfer_error.
func (s *stager) withdraw(c *stagedChunk) {
	s.withdrawn.Add(1)
	c.done(kv.ReasonTransferError, nil)
}

// post posts a released chunk into its region (refused when it has none);
// once its writes are done the slot is forgotten (report: its actor hears
// stagingDone) and, for a CHUNK_READY release, the signal goes to decode
// first. A chunk released after its agent stopped staging goes as usual.
func (s *stager) post(l *stagingLocal, c *stagedChunk, report func(peer.Msg)) {
	p := l.p
	if p == nil && c.refuse == kv.ReasonNone {
		c.post(c.t, c.done)
		return
	}
	var r *StagingRegion
	if p != nil {
		r = p.regions[stagingKey{room: c.t.Room, chunkIdx: c.chunkIdx}]
	}
	if c.refuse == kv.ReasonNone && (r == nil || !p.writable(r)) {
		c.refuse = kv.ReasonInvalidRequest // its slot was forgotten since
	}
	if c.refuse != kv.ReasonNone {
		s.refused.Add(1)
		c.done(c.refuse, nil)
		return
	}
	t := c.t
	t.Staged = &kv.StagedRegion{ChunkIdx: int(c.chunkIdx), Offset: r.Offset}
	inner, to, chunkReady := c.done, p.to, p.chunkReady
	key := stagingKey{room: t.Room, chunkIdx: c.chunkIdx}
	s.staged.Add(1)
	c.post(t, func(fail kv.Reason, signal [][]byte) {
		report(peer.Staging{Payload: stagingDone{p: p, key: key}})
		if fail == kv.ReasonNone && chunkReady {
			n := min(len(t.SrcPages), len(t.DstPages))
			m := &wire.ChunkReady{Room: t.Room, ChunkIdx: int(c.chunkIdx), PageStart: t.PageStart, NumPages: n,
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

// staging applies a peer.Staging payload on the agent's actor: a STAGING_RSP
// or WATERMARK (false: dropped), a staged write's end, a question. It
// returns the waiting writes that may go now (for a peer.Writable).
func (s *stager) staging(l *stagingLocal, payload any) (release []uint64, dropped bool) {
	switch m := payload.(type) {
	case stagingDone:
		if l.p == m.p && l.p != nil {
			delete(l.p.regions, m.key)
		}
		return nil, false
	case stagingAsk:
		r, w, ok := l.p.region(m.key.room, m.key.chunkIdx)
		m.reply <- stagingAnswer{r: r, writable: w, ok: ok, is: l.p != nil}
		return nil, false
	case wire.Inbound:
		if !s.frame(l.p, m) {
			return nil, true
		}
		return s.released(l), false
	}
	return nil, false
}

// StagingStats returns the staging counters (zero with -staging off, but for
// Dropped).
func (d *Daemon) StagingStats() StagingStats { return d.peers.stg.stats() }
