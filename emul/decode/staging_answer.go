package decode

import (
	"bytes"

	"github.com/kvxfer/kvxfer/transport/wire"
)

// Decode's staging listener (SGLang's _start_staging_req_listener and
// handle_staging_req): with a staging ring (Config.StagingBytes), the primary
// rank answers each STAGING_REQ that reaches its PULL socket, on every
// release (the listener is staging's own thread, not the 0.5.20+ status
// listener): it allocates the chunk's region in its ring (StagingRing, once
// per room and chunk) and sends the STAGING_RSP to every prefill rank the
// room is pulled from, as decode answers every writer. A request for a room
// decode has not sent its transfer info for is skipped, as SGLang's is
// ("STAGING_REQ received for unregistered room"). A room stays known to the
// listener after it completes (up to maxStagingRooms, oldest forgotten):
// SGLang's decode cannot complete a staged room before its regions were
// answered, but while kvxferd still writes head slices (staged writes are
// not wired) a room may complete before its STAGING_REQ arrives.
const maxStagingRooms = 1 << 14

// stagingAnswer is the emulator's staging state, under Emulator.mu.
type stagingAnswer struct {
	ring *StagingRing
	view *StagingView // made at the first request (needs the prefill TP size)
	reqs map[string]int64
	// known: rooms decode sent its transfer info for, in order.
	known map[uint64]bool
	order []uint64
	// arrivals counts the writers' signals per (room, chunk_idx) region.
	arrivals map[[2]uint64]int
	// answered: each known room's answers by chunk_idx, kept after the
	// region is freed (SGLang's receiver.chunk_staging_infos): a late
	// request of another writer gets the same answer, never a new region.
	answered map[uint64]map[int]wire.StagingRsp
}

// sawInfo records that decode sent room's transfer info. Call with e.mu held.
func (s *stagingAnswer) sawInfo(room uint64) {
	if s.known[room] {
		return
	}
	s.known[room] = true
	s.order = append(s.order, room)
	for len(s.order) > maxStagingRooms {
		delete(s.known, s.order[0])
		delete(s.answered, s.order[0])
		s.order = s.order[1:]
	}
}

// StagingCounts are what the staging listener saw: requests answered, skipped
// (unknown room, bad frame) and regions the ring could never hold.
type StagingCounts struct {
	Answered, Skipped, Oversized int64
	// Scattered regions (every writer signalled), their bytes checked and
	// how many were wrong, WATERMARKs sent, and signals for a room or region
	// decode no longer holds (Late) or does not match (BadRegion).
	Scattered, StagedBytes, StagedWrong, Watermarks, Late, BadRegion int64
	// Regions is the ring's live allocations.
	Regions int
}

func isStagingReq(frames [][]byte) bool {
	return len(frames) > 0 && bytes.Equal(frames[0], []byte(wire.TagStagingReq))
}

// onStagingReq handles one STAGING_REQ on the primary rank's socket goroutine.
func (e *Emulator) onStagingReq(frames [][]byte) {
	m, err := wire.DecodeOutbound(frames)
	req, ok := m.(*wire.StagingReq)
	e.mu.Lock()
	s := e.stg
	if s == nil || err != nil || !ok {
		if s != nil {
			s.reqs["skipped"]++
		}
		e.mu.Unlock()
		return
	}
	if !s.known[req.Room] || req.SessionID != e.primary.node.NIXL.Name() {
		s.reqs["skipped"]++
		e.mu.Unlock()
		return
	}
	if s.view == nil {
		v := e.stagingView()
		s.view = &v
	}
	if s.answered == nil {
		s.answered = map[uint64]map[int]wire.StagingRsp{}
	}
	byIdx := s.answered[req.Room]
	if byIdx == nil {
		byIdx = map[int]wire.StagingRsp{}
		s.answered[req.Room] = byIdx
	}
	rsp, seen := byIdx[req.ChunkIdx]
	if !seen {
		rsp = *s.ring.HandleReq(s.view, req)
		byIdx[req.ChunkIdx] = rsp
		if rsp.Offset == wire.AllocOversized {
			s.reqs["oversized"]++
		}
	}
	rsp.SessionID = req.SessionID
	s.reqs["answered"]++
	dp, derr := DPRank(e.info, req.Room)
	ts := e.targets[dp]
	e.mu.Unlock()
	if derr != nil {
		return
	}
	for _, t := range ts {
		if !t.Dummy {
			e.send(e.primary, t, rsp.Encode())
		}
	}
}

// stagingView is the decode rank's own view of a staged region: which
// prefill ranks write it and which global heads each owns (NewStagingView),
// from its shape and the prefill's attention TP size. Call with e.mu held.
func (e *Emulator) stagingView() StagingView {
	tp := e.cfg.Shape.Topo
	layers := make([]int, e.cfg.Shape.Layers)
	heads, start, hb, page := 1, 0, 0, e.cfg.PageSize
	if tp != nil {
		heads, start, hb = max(len(tp.Heads), 1)*max(e.cfg.TPSize, 1), tp.StartLayer, tp.HeadBytes
		if tp.PageTokens > 0 {
			page = tp.PageTokens
		}
	}
	for i := range layers {
		layers[i] = start + i
	}
	ptp := 1
	if e.info != nil {
		ptp = max(e.info.AttnTPSize, 1)
	}
	return NewStagingView(heads, ptp, max(e.cfg.TPSize, 1), e.cfg.TPRank, layers, page, hb)
}

// staging returns the staging listener's counts (zero without a ring).
func (e *Emulator) staging() StagingCounts {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stg
	if s == nil {
		return StagingCounts{}
	}
	return StagingCounts{Answered: s.reqs["answered"], Skipped: s.reqs["skipped"], Oversized: s.reqs["oversized"],
		Scattered: s.reqs["scattered"], StagedBytes: s.reqs["stagedBytes"], StagedWrong: s.reqs["stagedWrong"],
		Watermarks: s.reqs["watermarks"], Late: s.reqs["late"], BadRegion: s.reqs["badRegion"], Regions: len(s.ring.byChunk)}
}

// The staged chunks (decode's _handle_staging_chunk_arrived and scatter): a
// region is complete once every writer of it signalled its block — a "stg"
// notification (0.5.18 to 0.5.22) or a CHUNK_READY (0.5.23) each. Then the
// rank checks every byte of the region against its own view
// (StagingView.WrongStagedBytes: which prefill ranks write it, which global
// heads each owns, kvmem.LogicalPattern), scatters the region into the
// room's pages (the later page check reads them again), frees it, and sends
// its ring's WATERMARK to every prefill rank of the room.

// stagedWatermark is a WATERMARK to send once Emulator.mu is released.
type stagedWatermark struct {
	wm *wire.Watermark
	ts []Target
}

func isChunkReady(frames [][]byte) bool {
	return len(frames) > 0 && bytes.Equal(frames[0], []byte(wire.TagChunkReady))
}

// onChunkReady handles 0.5.23's CHUNK_READY on the socket goroutine.
func (e *Emulator) onChunkReady(frames [][]byte) {
	m, err := wire.DecodeOutbound(frames)
	cr, ok := m.(*wire.ChunkReady)
	if err != nil || !ok {
		e.c.badOutbound.Add(1)
		return
	}
	e.mu.Lock()
	wm := e.stagedArrivedLocked(cr.Room, cr.ChunkIdx, cr.PageStart, cr.NumPages)
	e.mu.Unlock()
	if wm.wm != nil {
		e.sendWatermarks([]stagedWatermark{wm})
	}
}

func (e *Emulator) sendWatermarks(wms []stagedWatermark) {
	for _, w := range wms {
		for _, t := range w.ts {
			if !t.Dummy {
				e.send(e.primary, t, w.wm.Encode())
			}
		}
	}
}

// stagedArrivedLocked counts one writer's block of (room, chunkIdx); the
// last one completes the region. Call with e.mu held.
func (e *Emulator) stagedArrivedLocked(room uint64, chunkIdx, pageStart, numPages int) stagedWatermark {
	s := e.stg
	rs := e.rooms[room]
	if rs == nil || rs.dst == nil || s.view == nil {
		s.reqs["late"]++
		return stagedWatermark{}
	}
	key := [2]uint64{room, uint64(chunkIdx)}
	if s.arrivals == nil {
		s.arrivals = map[[2]uint64]int{}
	}
	s.arrivals[key]++
	if s.arrivals[key] < len(s.view.Writers) {
		return stagedWatermark{}
	}
	delete(s.arrivals, key)
	off, end, pages, ok := s.ring.Region(room, chunkIdx)
	if !ok || pages != numPages || pageStart < 0 || pageStart+numPages > len(rs.dst) {
		s.reqs["badRegion"]++
		return stagedWatermark{}
	}
	region := e.primary.stg[off:end]
	s.reqs["stagedBytes"] += int64(len(region))
	bad := s.view.WrongStagedBytes(region, room, pageStart, numPages)
	s.reqs["stagedWrong"] += int64(bad)
	if bad == 0 {
		e.scatterLocked(region, rs.dst, pageStart, numPages)
	}
	s.reqs["scattered"]++
	wm, err := s.ring.Release(room, chunkIdx, e.primary.node.NIXL.Name())
	if err != nil {
		return stagedWatermark{}
	}
	dp, err := DPRank(e.info, room)
	if err != nil {
		return stagedWatermark{}
	}
	s.reqs["watermarks"]++
	return stagedWatermark{wm: wm, ts: e.targets[dp]}
}

// scatterLocked copies a checked region into the room's decode pages: writer
// blocks in order, each K then V layers, each [token, head, byte]; a head
// goes to its place among the rank's own heads in the page's token.
func (e *Emulator) scatterLocked(region []byte, dst []int32, pageStart, pages int) {
	v := e.stg.view
	sh := e.cfg.Shape
	tp := sh.Topo
	if tp == nil || tp.MLA {
		return
	}
	at := make(map[int]int, len(tp.Heads))
	for i, g := range tp.Heads {
		at[g] = i
	}
	hb, it, k := tp.HeadBytes, sh.Item, 0
	for _, heads := range v.Writers {
		for kv := range 2 {
			for li := range v.Layers {
				buf := e.primary.node.KV[kv*sh.Layers+li]
				for i := range pages * v.Page {
					slot := int(dst[pageStart+i/v.Page])
					for _, g := range heads {
						o := slot*it + ((i%v.Page)*len(tp.Heads)+at[g])*hb
						copy(buf[o:o+hb], region[k:k+hb])
						k += hb
					}
				}
			}
		}
	}
}
