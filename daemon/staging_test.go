package daemon

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/kvxfer/kvxfer/actors/peer"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/wire"
)

var errSendTest = errors.New("send failed")

const (
	stgBase = 0x7000000
	stgSize = 1 << 20
)

// stagingRig is prefill TP 2 (rank 0, one KV head of two) serving a decode
// TP 1 (both heads: twice the item) that announced a staging ring: the
// heterogeneous-TP MHA case SGLang stages. grid is chunked_prefill_size in
// tokens (page size 1).
func stagingRig(t *testing.T, enabled bool, grid int) (*Daemon, *scheduler, *decodeRank) {
	t.Helper()
	d := startDaemonWith(t, func(c *Config) {
		c.Rank = Rank{TPSize: 2, TPRank: 0}
		c.Topology = Topology{KVHeadNum: 1}
		c.Staging = StagingConfig{Enabled: enabled, ChunkedPrefillSize: grid}
	})
	s := newScheduler(t, d)
	sh := decodeShape(false)
	sh.Item = 2 * item
	dec := newDecodeWith(t, sh, func(r *wire.Registration) {
		r.DecodeTPSize, r.DecodeTPRank, r.DstKVItemLen = 1, 0, 2*item
		r.StagingBasePtr, r.StagingTotalSize = stgBase, stgSize
		for i := range r.KVMemKinds {
			r.KVMemKinds[i] = wire.MemVRAM // SGLang refuses head slices into host memory
		}
	}, d)
	waitFor(t, "the decode registered", func() bool {
		if why := d.dialects.rejection(dec.reg.AgentName); why != "" {
			t.Fatalf("registration refused: %s", why)
		}
		return d.counters.registrations.Load() == 1
	})
	return d, s, dec
}

// stagingRegion asks agent's actor for the region of (room, chunk).
func stagingRegion(t *testing.T, d *Daemon, agent string, roomID uint64, chunk int64) (StagingRegion, bool, bool) {
	t.Helper()
	reply := make(chan stagingAnswer, 1)
	d.peers.actors.Send(agent, peer.Staging{Payload: stagingAsk{key: stagingKey{room: roomID, chunkIdx: chunk}, reply: reply}})
	var a stagingAnswer
	waitFor(t, "the peer's actor answers", func() bool {
		select {
		case a = <-reply:
			return true
		default:
			return false
		}
	})
	return a.r, a.writable, a.ok
}

// stagingHarness is one staging peer's machine and staging state, stepped
// as its actor's Exec does (peerexec.go: ended, Fail, Withdrawn, Post, then
// stageStep), on the test's goroutine: what a step reports back to the actor
// is stepped right after it.
type stagingHarness struct {
	t        testing.TB
	s        *stager
	m        *peer.Machine
	l        stagingLocal
	agent    string
	next     uint64
	queue    []peer.Msg
	stepping bool
}

func newStagingHarness(t testing.TB, cfg StagingConfig, send func(kv.Endpoint, [][]byte) error) *stagingHarness {
	return &stagingHarness{t: t, s: newStager(cfg, 2, false, send), m: peer.New(&peer.Config{NoLiveness: true})}
}

// add registers r and loads it (the actor's ready: staging begins).
func (h *stagingHarness) add(r *wire.Registration, chunkReady bool) {
	h.agent = r.AgentName
	fx := h.step(peer.Register{From: peer.Endpoint{IP: r.DecodeIP, Port: r.DecodePort}, Reg: r})
	h.step(peer.LoadDone{Inc: fx.Load.Inc})
	h.s.began(&h.l, r, chunkReady)
}

func (h *stagingHarness) report(msg peer.Msg) {
	if h.stepping {
		h.queue = append(h.queue, msg)
		return
	}
	h.step(msg)
}

func (h *stagingHarness) step(msg peer.Msg) peer.Effects {
	h.stepping = true
	fx := h.m.Step(msg)
	if w, ok := msg.(peer.Write); ok {
		if c, ok := w.Payload.(*stagedChunk); ok {
			h.l.hold(w.ID, c)
		}
	}
	if fx.FailRooms {
		h.s.ended(&h.l)
	}
	for _, id := range fx.Fail {
		if c := h.s.take(&h.l, id); c != nil {
			c.done(kv.ReasonPeerLost, nil)
		}
	}
	for _, id := range fx.Withdrawn {
		if c := h.s.take(&h.l, id); c != nil {
			h.s.withdraw(c)
		}
	}
	for _, id := range fx.Post {
		if c := h.s.take(&h.l, id); c != nil {
			h.s.post(&h.l, c, h.report)
		}
	}
	var release []uint64
	switch m := msg.(type) {
	case peer.Write:
		if m.Staged && h.s.handed(&h.l, m.ID) {
			release = []uint64{m.ID}
		}
	case peer.Staging:
		release, _ = h.s.staging(&h.l, m.Payload)
	}
	if len(release) > 0 {
		h.queue = append(h.queue, peer.Writable{IDs: release})
	}
	h.stepping = false
	for len(h.queue) > 0 {
		next := h.queue[0]
		h.queue = h.queue[1:]
		h.step(next)
	}
	return fx
}

// stage is the transfers' hook (peers.stage): false when not staged.
func (h *stagingHarness) stage(t kv.Transfer, done kv.DoneFunc, post func(kv.Transfer, kv.DoneFunc)) bool {
	if t.Agent != h.agent {
		return false
	}
	c := h.s.chunk(t, done, post)
	if c == nil {
		return false
	}
	h.next++
	h.step(peer.Write{ID: h.next, Inc: h.m.Inc(), Staged: true, Room: t.Room, Payload: c})
	return true
}

// frame is a STAGING_RSP or WATERMARK reaching the actor: false if dropped.
func (h *stagingHarness) frame(m wire.Inbound) bool {
	agent := ""
	switch m := m.(type) {
	case *wire.StagingRsp:
		agent = m.SessionID
	case *wire.Watermark:
		agent = m.SessionID
	}
	if !h.s.cfg.Enabled || agent != h.agent { // the directory's Orphan, or peers.Staging with staging off

		h.s.dropped.Add(1)
		return false
	}
	before := h.s.dropped.Load()
	h.step(peer.Staging{Payload: m})
	return h.s.dropped.Load() == before
}

func (h *stagingHarness) info(t *wire.TransferInfo, pageSize int) int {
	return h.s.info(h.l.p, t, pageSize)
}

func (h *stagingHarness) region(roomID uint64, chunk int64) (StagingRegion, bool, bool) {
	return h.l.p.region(roomID, chunk)
}

func (h *stagingHarness) withdraw(roomID uint64) { h.step(peer.Withdraw{Room: roomID}) }

func (h *stagingHarness) drop() { h.step(peer.Drop{Why: "dropped"}) }

func (h *stagingHarness) stats() StagingStats { return h.s.stats() }

// stagingReqs is every STAGING_REQ decode received, in order.
func (r *decodeRank) stagingReqs() []wire.StagingReq {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []wire.StagingReq
	for _, f := range r.got {
		if m, err := wire.DecodeOutbound(f); err == nil {
			if q, ok := m.(*wire.StagingReq); ok {
				out = append(out, *q)
			}
		}
	}
	return out
}

// With -staging, a transfer info of a staging decode makes kvxferd ask for
// one region per grid slot of the room's pages (prefetch_staging_reqs: 7
// pages on a 3-page grid are slots of 3, 3 and 1 pages), once; decode's
// STAGING_RSP fills the slot it answers and WATERMARK the ring's watermark,
// which decides whether a region of a later round may be written. Replies
// nobody asked for are dropped and change nothing.
func TestStagingRequestsAndRoutesReplies(t *testing.T) {
	d, _, dec := stagingRig(t, true, 3)
	agent := dec.reg.AgentName
	const id = 41
	dec.send(t, dec.info(id, seqPages(0, 7), 0, 1))
	waitFor(t, "3 STAGING_REQs", func() bool { return len(dec.stagingReqs()) >= 3 })
	want := []wire.StagingReq{
		{Room: id, ChunkIdx: 0, ChunkPages: 3, SessionID: agent},
		{Room: id, ChunkIdx: 1, ChunkPages: 3, SessionID: agent},
		{Room: id, ChunkIdx: 2, ChunkPages: 1, SessionID: agent},
	}
	if got := dec.stagingReqs(); !slices.Equal(got, want) {
		t.Fatalf("STAGING_REQs %+v, want %+v", got, want)
	}
	if _, _, ok := stagingRegion(t, d, agent, id, 0); !ok {
		t.Fatal("slot 0 not recorded as requested")
	}
	if r, w, _ := stagingRegion(t, d, agent, id, 0); r.Known || w {
		t.Fatalf("slot 0 known before any STAGING_RSP: %+v", r)
	}

	rsp := func(chunk, off, round, end int64, session string) {
		dec.send(t, (&wire.StagingRsp{Room: id, ChunkIdx: chunk, Offset: off, Round: round, End: end, SessionID: session}).Encode())
	}
	rsp(0, 0, 0, 4096, agent)
	rsp(1, 4096, 1, 8192, agent)
	rsp(2, wire.AllocOversized, 1, 0, agent)
	rsp(9, 0, 0, 10, agent)          // never asked for
	rsp(0, 0, 0, 10, "someone-else") // not a staging peer
	rsp(0, 512, 0, 600, agent)       // answered already
	rsp(1, 0, 0, stgSize+1, agent)   // (already answered, and) past the ring
	dec.send(t, (&wire.Watermark{Round: 0, Tail: 6000, SessionID: agent}).Encode())
	dec.send(t, (&wire.Watermark{Round: 0, Tail: 100, SessionID: agent}).Encode()) // older: kept out
	waitFor(t, "every staging frame handled", func() bool {
		st := d.StagingStats()
		return st.RspRouted+st.Dropped+st.WMRouted >= 7 && st.RspRouted == 3 && st.WMRouted == 1
	})
	waitFor(t, "the older watermark handled", func() bool {
		return d.counters.staging.Load() == 4
	})
	st := d.StagingStats()
	if st.Peers != 1 || st.ReqsSent != 3 || st.RspRouted != 3 || st.Oversized != 1 || st.WMRouted != 1 || st.Dropped != 4 {
		t.Fatalf("stats %+v", st)
	}
	if r, w, ok := stagingRegion(t, d, agent, id, 0); !ok || !w || r != (StagingRegion{Offset: 0, Round: 0, End: 4096, Known: true}) {
		t.Fatalf("slot 0: %+v writable %v", r, w)
	}
	// Round 1 needs round 0 freed past 8192; decode's watermark is at 6000.
	if r, w, _ := stagingRegion(t, d, agent, id, 1); w || r.End != 8192 || r.Round != 1 {
		t.Fatalf("slot 1 writable before the watermark passed it: %+v", r)
	}
	if _, w, _ := stagingRegion(t, d, agent, id, 2); w {
		t.Fatal("an ALLOC_OVERSIZED slot is writable")
	}
	dec.send(t, (&wire.Watermark{Round: 0, Tail: 8192, SessionID: agent}).Encode())
	waitFor(t, "slot 1 writable once round 0 is freed past its end", func() bool {
		_, w, _ := stagingRegion(t, d, agent, id, 1)
		return w
	})

	// The same room's info again (a second prefill-side look) asks nothing twice.
	dec.send(t, dec.info(id, seqPages(0, 7), 0, 1))
	dec.abort(t, id)
	dec.waitFrame(t, isAck(id)) // sent after anything the infos made kvxferd send
	if n := len(dec.stagingReqs()); n != 3 {
		t.Fatalf("%d STAGING_REQs after the repeated info, want 3", n)
	}
}

// Without -staging (the default) kvxferd is SGLang's prefill with staging
// off: the same decode gets no STAGING_REQ, its staging frames are dropped
// and counted, and the peer geometry has no ring (no staged plan possible).
func TestStagingOffSendsNothing(t *testing.T) {
	d, _, dec := stagingRig(t, false, 3)
	const id = 42
	dec.send(t, dec.info(id, seqPages(0, 7), 0, 1))
	dec.send(t, (&wire.StagingRsp{Room: id, ChunkIdx: 0, Offset: 0, Round: 0, End: 10, SessionID: dec.reg.AgentName}).Encode())
	dec.send(t, (&wire.Watermark{Round: 0, Tail: 10, SessionID: dec.reg.AgentName}).Encode())
	dec.abort(t, id)
	dec.waitFrame(t, isAck(id))
	if n := len(dec.stagingReqs()); n != 0 {
		t.Fatalf("%d STAGING_REQs with staging off", n)
	}
	waitFor(t, "both staging frames dropped", func() bool { return d.counters.staging.Load() == 2 })
	if st := d.StagingStats(); st.Peers != 0 || st.ReqsSent != 0 || st.RspRouted != 0 || st.WMRouted != 0 {
		t.Fatalf("stats with staging off: %+v", st)
	}
}

// Which registrations make a staging peer, and what reaches the peer
// geometry: a ring, MHA, another TP size, and -staging on.
func TestStagingPeerRule(t *testing.T) {
	reg := func(tp int, base uint64, size int64) *wire.Registration {
		return &wire.Registration{AgentName: "a", DecodeTPSize: tp, StagingBasePtr: base, StagingTotalSize: size}
	}
	for _, c := range []struct {
		name    string
		on, mla bool
		r       *wire.Registration
		want    bool
	}{
		{"on, ring, tp 1 vs 2", true, false, reg(1, stgBase, stgSize), true},
		{"on, ring, size only", true, false, reg(4, 0, stgSize), true},
		{"off", false, false, reg(1, stgBase, stgSize), false},
		{"no ring", true, false, reg(1, 0, 0), false},
		{"same tp", true, false, reg(2, stgBase, stgSize), false},
		{"mla", true, true, reg(1, stgBase, stgSize), false},
	} {
		s := newStager(StagingConfig{Enabled: c.on}, 2, c.mla, nil)
		var g sglang.PeerGeometry
		s.geometry(&g, c.r)
		var l stagingLocal
		s.began(&l, c.r, false)
		got := g.StagingBase != 0 || g.StagingSize != 0
		if got != c.want || (l.p != nil) != c.want || (s.stats().Peers == 1) != c.want {
			t.Errorf("%s: staging peer %v (state %v), want %v", c.name, got, l.p != nil, c.want)
		}
		if c.want && (g.StagingBase != c.r.StagingBasePtr || g.StagingSize != c.r.StagingTotalSize) {
			t.Errorf("%s: geometry ring %#x+%d", c.name, g.StagingBase, g.StagingSize)
		}
	}
}

// What one transfer info can make kvxferd send and keep is capped: at most
// maxStagingReqsPerInfo requests, and maxStagingRegions regions per peer
// (oldest forgotten first, counted). A dummy info or one without pages asks
// nothing; an unsent request is forgotten, so the next info asks again.
func TestStagingCaps(t *testing.T) {
	sent, fail := 0, false
	s := newStagingHarness(t, StagingConfig{Enabled: true, ChunkedPrefillSize: 1}, func(kv.Endpoint, [][]byte) error {
		if fail {
			return errSendTest
		}
		sent++
		return nil
	})
	r := &wire.Registration{AgentName: "a", DecodeTPSize: 1, StagingBasePtr: stgBase, StagingTotalSize: stgSize}
	s.add(r, false)
	info := func(id uint64, pages int) *wire.TransferInfo {
		return &wire.TransferInfo{Room: id, AgentName: "a", DstKVIndices: make([]int32, pages), HasDecodePrefixLen: true}
	}
	if n := s.info(info(1, 2*maxStagingReqsPerInfo), 1); n != maxStagingReqsPerInfo || sent != n {
		t.Fatalf("one info sent %d (%d) requests", n, sent)
	}
	for id := uint64(2); id < 6; id++ {
		s.info(info(id, maxStagingReqsPerInfo), 1)
	}
	if n := len(s.l.p.regions); n != maxStagingRegions {
		t.Fatalf("%d regions kept, cap %d", n, maxStagingRegions)
	}
	if st := s.stats(); st.RegionsLost != 5*maxStagingReqsPerInfo-maxStagingRegions {
		t.Fatalf("regions lost %d", st.RegionsLost)
	}
	if _, _, ok := s.region(1, 0); ok {
		t.Fatal("the oldest region was kept past the cap")
	}
	if _, _, ok := s.region(5, 0); !ok {
		t.Fatal("the newest region was forgotten")
	}
	before := sent
	if s.info(info(7, 0), 1) != 0 || s.info(&wire.TransferInfo{Room: 8, AgentName: "a"}, 1) != 0 || sent != before {
		t.Fatal("an info without pages asked for regions")
	}
	fail = true
	s.info(info(9, 2), 1)
	if _, _, ok := s.region(9, 0); ok || s.stats().ReqsFailed != 2 {
		t.Fatalf("an unsent request was kept (failed %d)", s.stats().ReqsFailed)
	}
	fail = false
	if s.info(info(9, 2), 1) != 2 {
		t.Fatal("a failed request was not asked again")
	}
	s.l.p.forget(9)
	if _, _, ok := s.region(9, 1); ok {
		t.Fatal("forget kept a region")
	}
	s.drop()
	if s.info(info(10, 2), 1) != 0 {
		t.Fatal("a dropped agent was asked")
	}
}

// The staging gate: a chunk to a staging peer waits until its grid slot's
// region is answered and the watermark allows the write, then is posted with
// the region (in order, woken by the STAGING_RSP or WATERMARK that made it
// writable); for a CHUNK_READY release (0.5.23) kvxferd sends CHUNK_READY
// with the chunk's slot, first page and page count once the write is done,
// before the room hears of it. A chunk across two slots or for a slot never
// asked for is refused; an ALLOC_OVERSIZED slot is posted so that the plan
// refuses it with SGLang's reason; held chunks of a dropped agent fail
// peer_lost; empty chunks and other peers pass through.
func TestStagingGateHoldsUntilWritable(t *testing.T) {
	var sent [][][]byte
	s := newStagingHarness(t, StagingConfig{Enabled: true, ChunkedPrefillSize: 3}, func(_ kv.Endpoint, f [][]byte) error {
		sent = append(sent, f)
		return nil
	})
	s.s.pageSize, s.s.rank = 1, 5
	s.add(&wire.Registration{AgentName: "a", DecodeIP: "10.0.0.9", DecodePort: 7, DecodeTPSize: 1, StagingBasePtr: stgBase, StagingTotalSize: stgSize}, true)
	s.info(&wire.TransferInfo{Room: 1, AgentName: "a", DstKVIndices: seqPages(0, 7), HasDecodePrefixLen: true}, 1)
	sent = sent[:0] // the three STAGING_REQs
	type posted struct {
		t    kv.Transfer
		done kv.DoneFunc
	}
	var posts []posted
	post := func(t kv.Transfer, d kv.DoneFunc) { posts = append(posts, posted{t, d}) }
	var results []kv.Reason
	done := func(f kv.Reason, _ [][]byte) { results = append(results, f) }
	chunk := func(start, n int) kv.Transfer {
		return kv.Transfer{Room: 1, Agent: "a", PageStart: start, SrcPages: seqPages(start, n), DstPages: seqPages(start, n)}
	}
	if !s.stage(chunk(0, 3), done, post) || !s.stage(chunk(3, 3), done, post) || len(posts) != 0 {
		t.Fatalf("posted before any region: %d", len(posts))
	}
	if !s.frame(&wire.StagingRsp{Room: 1, ChunkIdx: 1, Offset: 4096, Round: 1, End: 8192, SessionID: "a"}) || len(posts) != 0 {
		t.Fatal("slot 1 (round 1) posted without a watermark past it")
	}
	s.frame(&wire.StagingRsp{Room: 1, ChunkIdx: 0, Offset: 0, Round: 0, End: 4096, SessionID: "a"})
	if len(posts) != 1 || *posts[0].t.Staged != (kv.StagedRegion{ChunkIdx: 0, Offset: 0}) {
		t.Fatalf("slot 0 not posted with its region: %+v", posts)
	}
	s.frame(&wire.Watermark{Round: 0, Tail: 8192, SessionID: "a"})
	if len(posts) != 2 || *posts[1].t.Staged != (kv.StagedRegion{ChunkIdx: 1, Offset: 4096}) {
		t.Fatalf("slot 1 not posted once the watermark passed it: %+v", posts)
	}
	if len(sent) != 0 || len(results) != 0 {
		t.Fatal("CHUNK_READY or done before the write was done")
	}
	posts[1].done(kv.ReasonNone, nil)
	posts[0].done(kv.ReasonTransferError, nil)
	if !slices.Equal(results, []kv.Reason{kv.ReasonNone, kv.ReasonTransferError}) || len(sent) != 1 {
		t.Fatalf("results %v, %d frames sent", results, len(sent))
	}
	m, err := wire.DecodeOutbound(sent[0])
	if cr, ok := m.(*wire.ChunkReady); err != nil || !ok || *cr != (wire.ChunkReady{Room: 1, ChunkIdx: 1, PageStart: 3, NumPages: 3, WriterID: "a", PrefillRank: 5}) {
		t.Fatalf("CHUNK_READY %+v %v", m, err)
	}
	if _, _, ok := s.region(1, 1); ok {
		t.Fatal("a written slot was kept")
	}
	results = results[:0]
	s.stage(chunk(2, 2), done, post)                                                                                        // pages 2 and 3: slots 0 and 1
	s.stage(kv.Transfer{Room: 2, Agent: "a", PageStart: 0, SrcPages: seqPages(0, 1), DstPages: seqPages(0, 1)}, done, post) // never asked
	if !slices.Equal(results, []kv.Reason{kv.ReasonInvalidRequest, kv.ReasonInvalidRequest}) {
		t.Fatalf("refusals %v", results)
	}
	s.frame(&wire.StagingRsp{Room: 1, ChunkIdx: 2, Offset: wire.AllocOversized, Round: 0, End: -1, SessionID: "a"})
	n := len(posts)
	s.stage(chunk(6, 1), done, post)
	if len(posts) != n+1 || posts[n].t.Staged.Offset != wire.AllocOversized {
		t.Fatal("an oversized slot was not handed to the plan")
	}
	if s.stage(kv.Transfer{Room: 1, Agent: "a", Last: true}, done, post) || s.stage(kv.Transfer{Room: 1, Agent: "b", SrcPages: seqPages(0, 1), DstPages: seqPages(0, 1)}, done, post) {
		t.Fatal("an empty last chunk or another peer's chunk was staged")
	}
	s.info(&wire.TransferInfo{Room: 3, AgentName: "a", DstKVIndices: seqPages(0, 3), HasDecodePrefixLen: true}, 1)
	results = results[:0]
	s.stage(kv.Transfer{Room: 3, Agent: "a", SrcPages: seqPages(0, 3), DstPages: seqPages(0, 3)}, done, post)
	if st := s.stats(); st.HeldNow != 1 {
		t.Fatalf("held %d", st.HeldNow)
	}
	s.drop()
	if !slices.Equal(results, []kv.Reason{kv.ReasonPeerLost}) {
		t.Fatalf("held chunk of a dropped agent: %v", results)
	}
	if st := s.stats(); st.Held != 3 || st.Staged != 3 || st.Refused != 2 || st.ChunkReady != 1 || st.HeldNow != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A failed room's held chunks are withdrawn (room.Effects.Withdraw): they end
// transfer_error and are never written, even when their region becomes
// writable later; another room's held chunk stays and is posted.
func TestStagingWithdrawFailedRoom(t *testing.T) {
	s := newStagingHarness(t, StagingConfig{Enabled: true, ChunkedPrefillSize: 2}, func(kv.Endpoint, [][]byte) error { return nil })
	s.s.pageSize = 1
	s.add(&wire.Registration{AgentName: "a", DecodeTPSize: 1, StagingBasePtr: stgBase, StagingTotalSize: stgSize}, false)
	for _, id := range []uint64{1, 2} {
		s.info(&wire.TransferInfo{Room: id, AgentName: "a", DstKVIndices: seqPages(0, 2), HasDecodePrefixLen: true}, 1)
	}
	var posted []uint64
	post := func(t kv.Transfer, _ kv.DoneFunc) { posted = append(posted, t.Room) }
	ends := map[uint64][]kv.Reason{}
	for _, id := range []uint64{1, 2} {
		s.stage(kv.Transfer{Room: id, Agent: "a", SrcPages: seqPages(0, 2), DstPages: seqPages(0, 2)},
			func(f kv.Reason, _ [][]byte) { ends[id] = append(ends[id], f) }, post)
	}
	s.withdraw(1)
	if !slices.Equal(ends[1], []kv.Reason{kv.ReasonTransferError}) || len(ends[2]) != 0 {
		t.Fatalf("ends %v", ends)
	}
	for _, id := range []uint64{1, 2} {
		s.frame(&wire.StagingRsp{Room: id, ChunkIdx: 0, Offset: int64(id) * 1024, Round: 0, End: int64(id)*1024 + 512, SessionID: "a"})
	}
	if !slices.Equal(posted, []uint64{2}) {
		t.Fatalf("posted rooms %v, want only 2", posted)
	}
	if st := s.stats(); st.Withdrawn != 1 || st.HeldNow != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Through the daemon's own actors: a chunk handed to a staging decode's
// actor waits there for its region, is posted with it once decode's
// STAGING_RSP comes (its slot forgotten once the write is done), a failed
// room's waiting chunk is withdrawn (transfer_error) at the actor of the
// room's agent, and the chunks still waiting when the decode is dropped
// fail peer_lost.
func TestStagingChunksWaitAtTheirPeersActor(t *testing.T) {
	d, _, dec := stagingRig(t, true, 3)
	agent := dec.reg.AgentName
	for _, id := range []uint64{51, 52, 53} {
		dec.send(t, dec.info(id, seqPages(0, 3), 0, 1))
	}
	waitFor(t, "3 STAGING_REQs", func() bool { return len(dec.stagingReqs()) >= 3 })
	var mu sync.Mutex
	var posted []kv.Transfer
	var dones []kv.DoneFunc
	ends := map[uint64][]kv.Reason{}
	post := func(t kv.Transfer, done kv.DoneFunc) {
		mu.Lock()
		defer mu.Unlock()
		posted, dones = append(posted, t), append(dones, done)
	}
	chunk := func(id uint64) {
		t.Helper()
		tr := kv.Transfer{Room: id, Agent: agent, SrcPages: seqPages(0, 3), DstPages: seqPages(0, 3)}
		if !d.peers.stage(tr, func(f kv.Reason, _ [][]byte) {
			mu.Lock()
			defer mu.Unlock()
			ends[id] = append(ends[id], f)
		}, post) {
			t.Fatalf("room %d's chunk not staged", id)
		}
	}
	for _, id := range []uint64{51, 52, 53} {
		chunk(id)
	}
	waitFor(t, "3 chunks waiting", func() bool { return d.StagingStats().HeldNow == 3 })
	d.xfers.Withdraw(52, []string{agent})
	dec.send(t, (&wire.StagingRsp{Room: 51, ChunkIdx: 0, Offset: 1024, Round: 0, End: 2048, SessionID: agent}).Encode())
	dec.send(t, (&wire.StagingRsp{Room: 52, ChunkIdx: 0, Offset: 4096, Round: 0, End: 8192, SessionID: agent}).Encode())
	waitFor(t, "room 51 posted, room 52 withdrawn", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(posted) == 1 && len(ends[52]) == 1
	})
	mu.Lock()
	if *posted[0].Staged != (kv.StagedRegion{ChunkIdx: 0, Offset: 1024}) || !slices.Equal(ends[52], []kv.Reason{kv.ReasonTransferError}) {
		t.Fatalf("posted %+v, room 52 ended %v", posted[0].Staged, ends[52])
	}
	done := dones[0]
	mu.Unlock()
	done(kv.ReasonNone, nil)
	waitFor(t, "room 51's slot forgotten once written", func() bool {
		_, _, ok := stagingRegion(t, d, agent, 51, 0)
		return !ok
	})
	d.peers.actors.Send(agent, peer.Drop{Why: "test"})
	waitFor(t, "room 53's chunk failed with its decode", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Equal(ends[53], []kv.Reason{kv.ReasonPeerLost})
	})
	mu.Lock()
	defer mu.Unlock()
	if len(posted) != 1 || !slices.Equal(ends[51], []kv.Reason{kv.ReasonNone}) {
		t.Fatalf("posted %d, room 51 ended %v", len(posted), ends[51])
	}
	if st := d.StagingStats(); st.HeldNow != 0 || st.Peers != 0 || st.Withdrawn != 1 || st.Staged != 1 || st.Held != 3 {
		t.Fatalf("stats %+v", st)
	}
}
