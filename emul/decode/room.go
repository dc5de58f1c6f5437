package decode

import (
	"context"
	"time"

	"github.com/kvxfer/kvxfer/emul/pages"
	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// Outcome is how a room ended on decode.
type Outcome uint8

const (
	// OutcomeSuccess: the completion rule held, the aux gate passed, and every
	// byte was checked (Result.WrongBytes says how many were wrong).
	OutcomeSuccess Outcome = iota
	// OutcomeFailedStatus: a failure KV_STATUS arrived (0.5.20+); Result.Reason
	// is its reason string.
	OutcomeFailedStatus
	// OutcomeAborted: decode aborted (a planned decode abort or Emulator.Abort).
	OutcomeAborted
	// OutcomeWaitingTimeout: no completion within the waiting timeout; ABORT sent.
	OutcomeWaitingTimeout
	// OutcomeLostConnection: the heartbeat declared the prefill lost.
	OutcomeLostConnection
	// OutcomeError: decode could not run the room (bootstrap lookup, pages,
	// context ended); Result.Reason says why.
	OutcomeError
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"success", "failed_kv_status", "aborted", "waiting_timeout",
	"lost_connection", "error"}

func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return "unknown"
}

// ReleaseKind is how a room's pages went back to the free lists.
type ReleaseKind uint8

const (
	// ReleaseNone: the room never held pages (aborted before its transfer
	// info, or it could not run).
	ReleaseNone ReleaseKind = iota
	// ReleaseAtOnce: freed when the room ended (success; 0.5.18 / 0.5.20 on
	// any failure; lost connection).
	ReleaseAtOnce
	// ReleaseByAck: 0.5.21+ held the pages after an armed abort or a failure
	// until ABORT_ACKs from every target prefill rank arrived.
	ReleaseByAck
	// ReleaseByTimeout: as ReleaseByAck, but the release timeout (or the end
	// of the run) came first.
	ReleaseByTimeout
	numReleaseKinds
)

var releaseKindNames = [numReleaseKinds]string{"none", "at_once", "by_ack", "by_timeout"}

func (k ReleaseKind) String() string {
	if k < numReleaseKinds {
		return releaseKindNames[k]
	}
	return "unknown"
}

// How a successful room completed.
const (
	CompletedByNotifs = "notifs"    // SGLang's is_done rule over NIXL notifications
	CompletedByStatus = "kv_status" // KV_STATUS "4" from N distinct prefill ranks
)

// Result is one room's decode-side record.
type Result struct {
	Plan    workload.Plan
	Outcome Outcome
	Reason  string
	// CompletedBy is CompletedByNotifs or CompletedByStatus (successful rooms).
	CompletedBy string
	// Latency is transfer info sent → completion (successful rooms only).
	Latency       time.Duration
	BytesVerified int64
	WrongBytes    int64
	AuxError      string // aux bytes or the bootstrap_room gate were wrong
	// Release is how the room's pages were freed; Pages how many it held.
	Release ReleaseKind
	Pages   int
	// Generation is the armed ABORT's generation (0.5.22+; 0: none).
	Generation uint64
}

// roomState is what the listeners, the poller and the timers record for a
// running room (under Emulator.mu); the room's goroutine wakes on poke.
type roomState struct {
	wake chan struct{}

	ranks          map[int]bool // _prefill_unique_rank of every target (dummy ones included)
	infoSent       bool
	complete       bool   // the release's completion rule holds
	completedBy    string // CompletedByNotifs or CompletedByStatus
	lost           bool
	abortReq       bool
	waitingExpired bool
	releaseExpired bool
	failed         bool
	failReason     string
	okRanks        map[int]bool // prefill ranks that sent KV_STATUS "4"
	dst            []int32      // decode pages of the transfer info (staged regions scatter into them)

	// Deferred release (0.5.21+): abortSent is abort_notified; armed says the
	// ACK tracker exists, gen is its generation (0.5.22+), acks the prefill
	// ranks whose ABORT_ACK counted.
	abortSent bool
	armed     bool
	gen       uint64
	acks      map[int]bool
}

func (rs *roomState) poke() {
	select {
	case rs.wake <- struct{}{}:
	default:
	}
}

// track registers a room so that listeners can reach it. A room id that is
// already running is refused (the workload never repeats one).
func (e *Emulator) track(room uint64, ts []Target) *roomState {
	rs := &roomState{wake: make(chan struct{}, 1), ranks: map[int]bool{}, okRanks: map[int]bool{}, acks: map[int]bool{}}
	for _, t := range ts {
		rs.ranks[t.UniqueRank(e.info.PPSize, e.info.AttnCPSize)] = true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, dup := e.rooms[room]; dup {
		return nil
	}
	e.rooms[room] = rs
	return rs
}

func (e *Emulator) untrack(room uint64) {
	e.mu.Lock()
	delete(e.rooms, room)
	e.checker.Forget(room)
	e.mu.Unlock()
}

// set runs f on the room's state under the lock and wakes the room.
func (e *Emulator) set(rs *roomState, f func(*roomState)) {
	e.mu.Lock()
	f(rs)
	rs.poke()
	e.mu.Unlock()
}

func (e *Emulator) snapshot(rs *roomState) roomState {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := *rs
	s.ranks, s.okRanks, s.acks = nil, nil, nil
	return s
}

// allAcked: ABORT_ACKs from as many distinct prefill_rank values as the room
// has targets (len(bootstrap_infos), dummy pairs included), as upstream counts.
func (e *Emulator) allAcked(rs *roomState, ts []Target) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(rs.acks) >= len(ts)
}

// RunRoom plays one room on decode and returns when decode is done with it
// (its pages are free again). Start must have been called.
func (e *Emulator) RunRoom(ctx context.Context, p workload.Plan) Result {
	res := Result{Plan: p}
	fail := func(err error) Result {
		res.Outcome, res.Reason = OutcomeError, err.Error()
		return res
	}
	ts, err := e.targetsFor(ctx, e.primary, p.Room)
	if err != nil {
		return fail(err)
	}
	rs := e.track(p.Room, ts)
	if rs == nil {
		res.Outcome, res.Reason = OutcomeError, "room already running"
		return res
	}
	defer e.untrack(p.Room)

	if p.Abort == workload.AbortDecodeBeforeInfo {
		// No metadata sent yet: the abort is not armed (4 frames, no ACK
		// awaited), and there are no pages to hold.
		e.ensureAbort(rs, p.Room, ts, false)
		res.Outcome = OutcomeAborted
		return res
	}

	var ok bool
	required := e.mapping.RequiredDstInfoNum
	withDummy := p.Dummy && required == 1 && e.dummy != nil
	if withDummy {
		required = 2
		if _, err := e.targetsFor(ctx, e.dummy, p.Room); err != nil {
			return fail(err)
		}
	}
	var pages, auxSlot, stateSlot []int32
	defer func() { e.free(pages, auxSlot, stateSlot, res.releasedUnsafe()) }()
	if pages, ok = e.pages.Take(ctx, p.Pages); !ok {
		return fail(errNoPages(ctx, "KV pages", p.Pages))
	}
	if auxSlot, ok = e.aux.Take(ctx, 1); !ok {
		return fail(errNoPages(ctx, "aux slots", 1))
	}
	var state [][]int32
	if e.state != nil {
		if stateSlot, ok = e.state.Take(ctx, 1); !ok {
			return fail(errNoPages(ctx, "state slots", 1))
		}
		for range e.primary.node.Geo.State {
			state = append(state, stateSlot)
		}
	}
	e.poison(pages, int(auxSlot[0]), stateSlot)
	res.Pages, res.Release = len(pages), ReleaseAtOnce

	e.mu.Lock()
	e.checker.Expect(p.Room, e.mapping.RequiredPrefillResponses, len(state) > 0)
	rs.infoSent = true
	if e.stg != nil {
		e.stg.sawInfo(p.Room)
		rs.dst = pages
	}
	e.mu.Unlock()
	prefixTokens := p.PrefixPages * max(deref0(e.info.PageSize), 1)
	for _, t := range ts {
		// Every release sends 10 frames, is_dummy included.
		ti := &wire.TransferInfo{Room: p.Room, DecodeIP: e.cfg.Host, DecodePort: e.primary.pull.Port(),
			AgentName: e.primary.node.NIXL.Name(), DstAuxIndex: int(auxSlot[0]), RequiredDstInfoNum: required,
			HasDecodePrefixLen: true, HasIsDummy: true, DummyFlag: t.Dummy}
		if !t.Dummy {
			ti.DstKVIndices, ti.DstStateIndices, ti.DecodePrefixLen = pages, state, prefixTokens
		}
		e.send(e.primary, t, ti.Encode())
		if withDummy {
			di := &wire.TransferInfo{Room: p.Room, DecodeIP: e.cfg.Host, DecodePort: e.dummy.pull.Port(),
				AgentName: e.dummy.node.NIXL.Name(), RequiredDstInfoNum: required, HasDecodePrefixLen: true,
				HasIsDummy: true, DummyFlag: true}
			e.send(e.dummy, t, di.Encode())
		}
	}
	start := time.Now()
	waiting := e.clk.AfterFunc(e.cfg.WaitingTimeout, func() { e.set(rs, func(s *roomState) { s.waitingExpired = true }) })
	defer waiting.Stop()
	if p.Abort == workload.AbortDecodeAfterInfo {
		if p.AbortDelay <= 0 {
			e.set(rs, func(s *roomState) { s.abortReq = true })
		} else {
			t := e.clk.AfterFunc(p.AbortDelay, func() { e.set(rs, func(s *roomState) { s.abortReq = true }) })
			defer t.Stop()
		}
	}

	for {
		select {
		case <-rs.wake:
		case <-ctx.Done():
			return fail(ctx.Err())
		}
		s := e.snapshot(rs)
		switch {
		case s.complete:
			// Decode's metadata gate: Success stays Transferring while the
			// aux bootstrap_room is still 0; anything else but the room is
			// corruption. The completion signal follows the bytes, so 0
			// should not be seen; if it is, look again shortly.
			if auxRoom(e.primary.node, int(auxSlot[0])) == 0 && !s.waitingExpired && !s.abortReq && !s.lost {
				time.AfterFunc(time.Millisecond, rs.poke)
				continue
			}
			res.Latency = time.Since(start)
			e.verify(p.Room, pages, int(auxSlot[0]), stateSlot, &res)
			res.Outcome, res.CompletedBy = OutcomeSuccess, s.completedBy
			return res
		case s.lost:
			res.Outcome, res.Reason = OutcomeLostConnection, "Lost connection with prefill instance"
			return res
		case s.failed:
			res.Outcome, res.Reason = OutcomeFailedStatus, s.failReason
			// 0.5.21+: any failure calls ensure_abort_notified(force_arm=True)
			// and defers the release. 0.5.20 frees at once, without an ABORT.
			if e.cfg.Release.Defers() {
				e.ensureAbort(rs, p.Room, ts, true)
				e.awaitRelease(ctx, rs, ts, &res)
			}
			return res
		case s.waitingExpired || s.abortReq:
			res.Outcome = OutcomeAborted
			if s.waitingExpired && !s.abortReq {
				res.Outcome = OutcomeWaitingTimeout
			}
			// The metadata went out, so 0.5.21+ arm (and hold); 0.5.18 and
			// 0.5.20 free at once after the ABORT.
			e.ensureAbort(rs, p.Room, ts, e.cfg.Release.Defers())
			if e.cfg.Release.Defers() {
				e.awaitRelease(ctx, rs, ts, &res)
			}
			return res
		}
	}
}

// releasedUnsafe: the room's pages went back while a write for it may still
// be in flight (freed at once after an ABORT, a release timeout, a lost
// prefill, or a room that never ended).
func (r *Result) releasedUnsafe() bool {
	switch r.Release {
	case ReleaseByTimeout:
		return true
	case ReleaseAtOnce:
		return r.Outcome != OutcomeSuccess && r.Outcome != OutcomeFailedStatus
	}
	return r.Outcome == OutcomeError
}

// free returns a room's pages, aux slot and state slot to their pools.
func (e *Emulator) free(kv, aux, state []int32, unsafe bool) {
	if unsafe && len(kv)+len(aux) > 0 {
		e.c.unsafeReleases.Add(1)
	}
	for _, x := range []struct {
		l  *pages.Pool
		xs []int32
	}{{e.pages, kv}, {e.aux, aux}, {e.state, state}} {
		switch {
		case x.l == nil:
		case unsafe:
			x.l.PutBack(x.xs)
		default:
			x.l.Put(x.xs)
		}
	}
}

func deref0(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

type pagesErr struct {
	what string
	n    int
	ctx  error
}

func (e pagesErr) Error() string {
	if e.ctx != nil {
		return "waiting for " + e.what + ": " + e.ctx.Error()
	}
	return "room needs more " + e.what + " than decode has"
}

func errNoPages(ctx context.Context, what string, n int) error {
	return pagesErr{what: what, n: n, ctx: ctx.Err()}
}

// ensureAbort is ensure_abort_notified / _send_abort_notification: once per
// room, [ABORT, room, ip, port] to every target rank (dummy ones included).
// arm creates the ACK tracker first (so that no ACK can beat it); from 0.5.22
// an armed ABORT takes the next value of the process-wide generation counter
// (the first is 1) as a 5th frame.
func (e *Emulator) ensureAbort(rs *roomState, room uint64, ts []Target, arm bool) {
	a := &wire.Abort{Room: room, DecodeIP: e.cfg.Host, DecodePort: e.primary.pull.Port(), HasEndpoint: true}
	e.mu.Lock()
	if rs.abortSent {
		e.mu.Unlock()
		return
	}
	rs.abortSent = true
	if arm {
		rs.armed, rs.acks = true, map[int]bool{}
		if e.cfg.Release.Generations() {
			e.gen++
			rs.gen = e.gen
			a.Generation, a.HasGen = rs.gen, true
			e.c.generations.Add(1)
		}
	}
	e.mu.Unlock()
	for _, t := range ts {
		e.send(e.primary, t, a.Encode())
	}
}

// awaitRelease holds the room (and so its pages: the caller frees them when
// RunRoom returns) until every target rank acknowledged, the release timeout
// passed, the prefill was declared lost, or ctx ended.
func (e *Emulator) awaitRelease(ctx context.Context, rs *roomState, ts []Target, res *Result) {
	e.mu.Lock()
	res.Generation = rs.gen
	e.mu.Unlock()
	t := e.clk.AfterFunc(e.cfg.ReleaseTimeout, func() { e.set(rs, func(s *roomState) { s.releaseExpired = true }) })
	defer t.Stop()
	for {
		if e.allAcked(rs, ts) {
			res.Release = ReleaseByAck
			return
		}
		s := e.snapshot(rs)
		if s.releaseExpired || s.lost {
			res.Release = ReleaseByTimeout
			return
		}
		select {
		case <-rs.wake:
		case <-ctx.Done():
			res.Release = ReleaseByTimeout
			return
		}
	}
}

// poison overwrites pages and the aux slot before they are handed to the
// prefill: a page must not pass verification with a previous room's bytes,
// and the bootstrap_room gate must start at 0.
func (e *Emulator) poison(pages []int32, auxSlot int, stateSlots []int32) {
	n := e.primary.node
	it := n.Shape.Item
	for _, buf := range n.KV {
		for _, p := range pages {
			clear(buf[int(p)*it : (int(p)+1)*it])
		}
	}
	for i, buf := range n.Aux {
		sz := int(n.Shape.AuxItems[i])
		clear(buf[auxSlot*sz : (auxSlot+1)*sz])
	}
	for _, buf := range n.State {
		for _, s := range stateSlots {
			clear(buf[int(s)*n.Shape.StateItem : (int(s)+1)*n.Shape.StateItem])
		}
	}
}

// auxRoom reads the bootstrap_room value of an aux slot (the last aux buffer,
// u64 little endian at the slot's start).
func auxRoom(n *kvmem.Node, slot int) uint64 {
	last := n.Aux[len(n.Aux)-1]
	it := int(n.Shape.AuxItems[len(n.Aux)-1])
	b := last[slot*it : slot*it+8]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// verify checks the aux slot and every KV byte of a completed room: request
// page j is in pages[j] and holds kvmem's pattern for (room, j).
func (e *Emulator) verify(room uint64, pages []int32, auxSlot int, stateSlots []int32, res *Result) {
	n := e.primary.node
	it := n.Shape.Item
	for j, dst := range pages {
		res.BytesVerified += int64(len(n.KV) * it)
		if n.CheckPageAt(room, int(dst), j) == nil {
			continue
		}
		res.WrongBytes += int64(n.WrongBytesAt(room, int(dst), j))
	}
	for _, sz := range n.Shape.AuxItems {
		res.BytesVerified += int64(sz)
	}
	if err := n.CheckAux(auxSlot, room); err != nil {
		res.AuxError = err.Error()
	}
	if len(stateSlots) > 0 {
		res.BytesVerified += int64(len(n.State) * n.Shape.StateItem)
		res.WrongBytes += checkState(n, room, int(stateSlots[0]))
	}
}

// fillState writes room r's state pattern into state slot of every state
// buffer: byte k of buffer b is kvmem.Pattern(r, 100+b, 0, k), keyed by the
// room only, so either side can check it without knowing the other's slots.
func fillState(n *kvmem.Node, r uint64, slot int) {
	it := n.Shape.StateItem
	for b, buf := range n.State {
		kvmem.PatternRow(buf[slot*it:(slot+1)*it], r, 100+b, 0)
	}
}

// checkState counts the wrong bytes of a room's state slot (see FillState).
func checkState(n *kvmem.Node, r uint64, slot int) (wrong int64) {
	it := n.Shape.StateItem
	for b, buf := range n.State {
		if kvmem.PatternMatches(buf[slot*it:(slot+1)*it], r, 100+b, 0) {
			continue
		}
		for k := range it {
			if buf[slot*it+k] != kvmem.Pattern(r, 100+b, 0, k) {
				wrong++
			}
		}
	}
	return wrong
}
