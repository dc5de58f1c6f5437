package decode

import (
	"context"
	"time"

	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/transport"
)

// Outcome is how a room ended on decode.
type Outcome uint8

const (
	// OutcomeSuccess: the completion rule held, the aux gate passed, and every
	// byte was checked (Result.WrongBytes says how many were wrong).
	OutcomeSuccess Outcome = iota
	// OutcomeFailedStatus: a failure KV_STATUS arrived (ack mode); Result.Reason
	// is its reason string.
	OutcomeFailedStatus
	// OutcomeAbortedAcked: decode aborted and every target rank acknowledged
	// (ABORT_ACK or a failure KV_STATUS) before the release timeout.
	OutcomeAbortedAcked
	// OutcomeAbortedReleaseTimeout: decode aborted and gave up waiting for acks.
	OutcomeAbortedReleaseTimeout
	// OutcomeAborted: decode aborted in baseline mode (no acks expected; freed at once).
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

var outcomeNames = [numOutcomes]string{"success", "failed_kv_status", "aborted_acked", "aborted_release_timeout",
	"aborted", "waiting_timeout", "lost_connection", "error"}

func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return "unknown"
}

// Result is one room's decode-side record.
type Result struct {
	Plan    workload.Plan
	Outcome Outcome
	Reason  string
	// Latency is transfer info sent → completion (successful rooms only).
	Latency       time.Duration
	BytesVerified int64
	WrongBytes    int64
	AuxError      string // aux bytes or the bootstrap_room gate were wrong
	// ReleaseTimedOut: an abort's acks did not all arrive in time (ack mode),
	// whatever the outcome.
	ReleaseTimedOut bool
}

// roomState is what the listeners, the poller and the timers record for a
// running room (under Emulator.mu); the room's goroutine wakes on poke.
type roomState struct {
	wake chan struct{}

	infoSent       bool
	complete       bool // decode's is_done rule holds
	lost           bool
	abortReq       bool
	waitingExpired bool
	releaseExpired bool
	failed         bool
	failReason     string
	drained        map[int]bool // prefill ranks that sent ABORT_ACK or a failure KV_STATUS
}

func (rs *roomState) poke() {
	select {
	case rs.wake <- struct{}{}:
	default:
	}
}

// track registers a room so that listeners can reach it. A room id that is
// already running is refused (the workload never repeats one).
func (e *Emulator) track(room uint64) *roomState {
	rs := &roomState{wake: make(chan struct{}, 1), drained: map[int]bool{}}
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
	s.drained = nil
	return s
}

// allDrained: every target acknowledged. Ranks are matched by sender id
// (pp·tp_size + tp); a prefill that numbers itself differently still counts
// once as many distinct ranks answered as there are targets.
func (e *Emulator) allDrained(rs *roomState, ts []Target) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(rs.drained) >= len(ts) {
		return true
	}
	for _, t := range ts {
		if !rs.drained[t.SenderID(max(e.info.AttnTPSize, 1))] {
			return false
		}
	}
	return true
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
	rs := e.track(p.Room)
	if rs == nil {
		res.Outcome, res.Reason = OutcomeError, "room already running"
		return res
	}
	defer e.untrack(p.Room)

	if p.Abort == workload.AbortDecodeBeforeInfo {
		e.sendAbort(p.Room, ts)
		res.Outcome = OutcomeAborted
		if e.cfg.AckMode {
			res.Outcome = OutcomeAbortedReleaseTimeout
			if e.awaitRelease(ctx, rs, ts, &res) {
				res.Outcome = OutcomeAbortedAcked
			}
		}
		return res
	}

	required := e.mapping.RequiredDstInfoNum
	withDummy := p.Dummy && required == 1 && e.dummy != nil
	if withDummy {
		required = 2
		if _, err := e.targetsFor(ctx, e.dummy, p.Room); err != nil {
			return fail(err)
		}
	}
	pages, ok := e.pages.take(ctx, p.Pages)
	if !ok {
		return fail(errNoPages(ctx, "KV pages", p.Pages))
	}
	defer e.pages.put(pages)
	auxSlot, ok := e.aux.take(ctx, 1)
	if !ok {
		return fail(errNoPages(ctx, "aux slots", 1))
	}
	defer e.aux.put(auxSlot)
	var state [][]int32
	var stateSlot []int32
	if e.state != nil {
		st, ok := e.state.take(ctx, 1)
		if !ok {
			return fail(errNoPages(ctx, "state slots", 1))
		}
		defer e.state.put(st)
		stateSlot = st
		for range e.primary.node.Geo.State {
			state = append(state, st)
		}
	}
	e.poison(pages, int(auxSlot[0]), stateSlot)

	e.mu.Lock()
	e.checker.Expect(p.Room, e.mapping.RequiredPrefillResponses, len(state) > 0)
	rs.infoSent = true
	e.mu.Unlock()
	prefixTokens := p.PrefixPages * max(deref0(e.info.PageSize), 1)
	for _, t := range ts {
		ti := &transport.TransferInfo{Room: p.Room, DecodeIP: e.cfg.Host, DecodePort: e.primary.pull.Port(),
			AgentName: e.primary.node.Agent.Name(), DstAuxIndex: int(auxSlot[0]), RequiredDstInfoNum: required,
			HasDecodePrefixLen: true, HasIsDummy: e.cfg.LaterFrames, DummyFlag: t.Dummy}
		if !t.Dummy {
			ti.DstKVIndices, ti.DstStateIndices, ti.DecodePrefixLen = pages, state, prefixTokens
		}
		e.send(e.primary, t, ti.Encode())
		if withDummy {
			di := &transport.TransferInfo{Room: p.Room, DecodeIP: e.cfg.Host, DecodePort: e.dummy.pull.Port(),
				AgentName: e.dummy.node.Agent.Name(), RequiredDstInfoNum: required, HasDecodePrefixLen: true,
				HasIsDummy: e.cfg.LaterFrames, DummyFlag: true}
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
			// corruption. The notification follows the bytes, so 0 should
			// not be seen; if it is, look again shortly.
			if auxRoom(e.primary.node, int(auxSlot[0])) == 0 && !s.waitingExpired && !s.abortReq && !s.lost {
				time.AfterFunc(time.Millisecond, rs.poke)
				continue
			}
			res.Latency = time.Since(start)
			e.verify(p.Room, pages, int(auxSlot[0]), stateSlot, &res)
			res.Outcome = OutcomeSuccess
			return res
		case s.lost:
			res.Outcome, res.Reason = OutcomeLostConnection, "Lost connection with prefill instance"
			return res
		case s.failed:
			res.Outcome, res.Reason = OutcomeFailedStatus, s.failReason
			if !e.allDrained(rs, ts) {
				e.sendAbortUndrained(rs, p.Room, ts)
				e.awaitRelease(ctx, rs, ts, &res)
			}
			return res
		case s.waitingExpired || s.abortReq:
			res.Outcome = OutcomeAborted
			if s.waitingExpired && !s.abortReq {
				res.Outcome = OutcomeWaitingTimeout
			}
			e.sendAbort(p.Room, ts)
			if e.cfg.AckMode {
				acked := e.awaitRelease(ctx, rs, ts, &res)
				if res.Outcome == OutcomeAborted {
					res.Outcome = OutcomeAbortedReleaseTimeout
					if acked {
						res.Outcome = OutcomeAbortedAcked
					}
				}
			}
			return res
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

// sendAbort is _send_abort_notification: [ABORT, room, ip, port] once to
// every target rank.
func (e *Emulator) sendAbort(room uint64, ts []Target) {
	a := &transport.Abort{Room: room, DecodeIP: e.cfg.Host, DecodePort: e.primary.pull.Port(), HasEndpoint: true}
	for _, t := range ts {
		e.send(e.primary, t, a.Encode())
	}
}

// sendAbortUndrained aborts toward the target ranks that have not reported
// yet (one rank failed the room; the others may still be writing).
func (e *Emulator) sendAbortUndrained(rs *roomState, room uint64, ts []Target) {
	var rest []Target
	e.mu.Lock()
	for _, t := range ts {
		if !rs.drained[t.SenderID(max(e.info.AttnTPSize, 1))] {
			rest = append(rest, t)
		}
	}
	e.mu.Unlock()
	e.sendAbort(room, rest)
}

// awaitRelease holds the room (and so its pages: the caller frees them when
// RunRoom returns) until every target rank acknowledged, the release timeout
// passed, the prefill was declared lost, or ctx ended. It reports whether all
// acked.
func (e *Emulator) awaitRelease(ctx context.Context, rs *roomState, ts []Target, res *Result) bool {
	t := e.clk.AfterFunc(e.cfg.ReleaseTimeout, func() { e.set(rs, func(s *roomState) { s.releaseExpired = true }) })
	defer t.Stop()
	for {
		if e.allDrained(rs, ts) {
			return true
		}
		s := e.snapshot(rs)
		if s.releaseExpired || s.lost {
			res.ReleaseTimedOut = true
			return false
		}
		select {
		case <-rs.wake:
		case <-ctx.Done():
			res.ReleaseTimedOut = true
			return false
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
		for b, buf := range n.KV {
			page := buf[int(dst)*it : (int(dst)+1)*it]
			for k, got := range page {
				if got != kvmem.Pattern(room, b, j, k) {
					res.WrongBytes++
				}
			}
		}
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

// FillState writes room r's state pattern into state slot of every state
// buffer: byte k of buffer b is kvmem.Pattern(r, 100+b, 0, k), keyed by the
// room only, so either side can check it without knowing the other's slots.
func FillState(n *kvmem.Node, r uint64, slot int) {
	it := n.Shape.StateItem
	for b, buf := range n.State {
		for k := range it {
			buf[slot*it+k] = kvmem.Pattern(r, 100+b, 0, k)
		}
	}
}

// checkState counts the wrong bytes of a room's state slot (see FillState).
func checkState(n *kvmem.Node, r uint64, slot int) (wrong int64) {
	it := n.Shape.StateItem
	for b, buf := range n.State {
		for k := range it {
			if buf[slot*it+k] != kvmem.Pattern(r, 100+b, 0, k) {
				wrong++
			}
		}
	}
	return wrong
}
