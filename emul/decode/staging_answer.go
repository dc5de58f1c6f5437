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
		s.order = s.order[1:]
	}
}

// StagingCounts are what the staging listener saw: requests answered, skipped
// (unknown room, bad frame) and regions the ring could never hold.
type StagingCounts struct {
	Answered, Skipped, Oversized int64
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
	rsp := s.ring.HandleReq(s.view, req)
	if rsp.Offset == wire.AllocOversized {
		s.reqs["oversized"]++
	}
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

// Staging returns the staging listener's counts (zero without a ring).
func (e *Emulator) Staging() StagingCounts {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stg
	if s == nil {
		return StagingCounts{}
	}
	return StagingCounts{Answered: s.reqs["answered"], Skipped: s.reqs["skipped"], Oversized: s.reqs["oversized"],
		Regions: len(s.ring.byChunk)}
}
