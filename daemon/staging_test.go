package daemon

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvxfer/kvxfer/actors/room"
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
	tbl := d.peers.staging()
	if _, _, ok := tbl.region(agent, id, 0); !ok {
		t.Fatal("slot 0 not recorded as requested")
	}
	if r, w, _ := tbl.region(agent, id, 0); r.Known || w {
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
	if r, w, ok := tbl.region(agent, id, 0); !ok || !w || r != (StagingRegion{Offset: 0, Round: 0, End: 4096, Known: true}) {
		t.Fatalf("slot 0: %+v writable %v", r, w)
	}
	// Round 1 needs round 0 freed past 8192; decode's watermark is at 6000.
	if r, w, _ := tbl.region(agent, id, 1); w || r.End != 8192 || r.Round != 1 {
		t.Fatalf("slot 1 writable before the watermark passed it: %+v", r)
	}
	if _, w, _ := tbl.region(agent, id, 2); w {
		t.Fatal("an ALLOC_OVERSIZED slot is writable")
	}
	dec.send(t, (&wire.Watermark{Round: 0, Tail: 8192, SessionID: agent}).Encode())
	waitFor(t, "slot 1 writable once round 0 is freed past its end", func() bool {
		_, w, _ := tbl.region(agent, id, 1)
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
		s := newStagingTable(StagingConfig{Enabled: c.on}, 2, c.mla, nil)
		var g sglang.PeerGeometry
		s.geometry(&g, c.r)
		s.add(c.r)
		got := g.StagingBase != 0 || g.StagingSize != 0
		if got != c.want || (len(s.peers) == 1) != c.want {
			t.Errorf("%s: staging peer %v (table %d), want %v", c.name, got, len(s.peers), c.want)
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
	s := newStagingTable(StagingConfig{Enabled: true, ChunkedPrefillSize: 1}, 2, false, func(room.Endpoint, [][]byte) error {
		if fail {
			return errSendTest
		}
		sent++
		return nil
	})
	r := &wire.Registration{AgentName: "a", DecodeTPSize: 1, StagingBasePtr: stgBase, StagingTotalSize: stgSize}
	s.add(r)
	info := func(id uint64, pages int) *wire.TransferInfo {
		return &wire.TransferInfo{Room: id, AgentName: "a", DstKVIndices: make([]int32, pages), HasDecodePrefixLen: true}
	}
	if n := s.info(info(1, 2*maxStagingReqsPerInfo), 1); n != maxStagingReqsPerInfo || sent != n {
		t.Fatalf("one info sent %d (%d) requests", n, sent)
	}
	for id := uint64(2); id < 6; id++ {
		s.info(info(id, maxStagingReqsPerInfo), 1)
	}
	if n := len(s.peers["a"].regions); n != maxStagingRegions {
		t.Fatalf("%d regions kept, cap %d", n, maxStagingRegions)
	}
	if st := s.stats(); st.RegionsLost != 5*maxStagingReqsPerInfo-maxStagingRegions {
		t.Fatalf("regions lost %d", st.RegionsLost)
	}
	if _, _, ok := s.region("a", 1, 0); ok {
		t.Fatal("the oldest region was kept past the cap")
	}
	if _, _, ok := s.region("a", 5, 0); !ok {
		t.Fatal("the newest region was forgotten")
	}
	before := sent
	if s.info(info(7, 0), 1) != 0 || s.info(&wire.TransferInfo{Room: 8, AgentName: "a"}, 1) != 0 || sent != before {
		t.Fatal("an info without pages asked for regions")
	}
	fail = true
	s.info(info(9, 2), 1)
	if _, _, ok := s.region("a", 9, 0); ok || s.stats().ReqsFailed != 2 {
		t.Fatalf("an unsent request was kept (failed %d)", s.stats().ReqsFailed)
	}
	fail = false
	if s.info(info(9, 2), 1) != 2 {
		t.Fatal("a failed request was not asked again")
	}
	s.forget("a", 9)
	if _, _, ok := s.region("a", 9, 1); ok {
		t.Fatal("forget kept a region")
	}
	s.drop("a")
	if s.info(info(10, 2), 1) != 0 {
		t.Fatal("a dropped agent was asked")
	}
}
