package daemon

import (
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// The scenarios of spec §8 against an in-process kvxferd, driven through its
// real interfaces: the control API on one side, raw SGLang frames and NIXL
// notifications on the other. (The multi-process run is make demo and
// cmd/kvxfer-demo's test.)

// roomSpec is one room as the scheduler sends it.
type roomSpec struct {
	id     uint64
	src    []int32 // prefill page slots; page j of the request is src[j]
	chunks []int
	aux    int
	state  [][]int32 // on the last chunk
}

func (s *scheduler) start(t testing.TB, r roomSpec) {
	t.Helper()
	for j, slot := range r.src {
		s.fill(r.id, int(slot), j)
	}
	s.writeAux(r.aux, r.id)
	if _, err := s.cli.Open(r.id, ""); err != nil {
		t.Fatal(err)
	}
	s.cli.Init(r.id, len(r.src), r.aux)
	if len(r.src) == 0 {
		s.cli.Send(r.id, nil, r.state)
		return
	}
	next := 0
	for i, n := range r.chunks {
		var st [][]int32
		if i == len(r.chunks)-1 {
			st = r.state
		}
		s.cli.Send(r.id, r.src[next:next+n], st)
		next += n
	}
}

func (r *decodeRank) verify(t testing.TB, id uint64, dst []int32, aux int) {
	t.Helper()
	r.waitDone(t, id)
	for j, p := range dst {
		if err := r.node.CheckPageAt(id, int(p), j); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.node.CheckAux(aux, id); err != nil {
		t.Fatal(err)
	}
}

func seqPages(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(from + i)
	}
	return out
}

func TestScenarioSingleAndMultiChunk(t *testing.T) {
	d := startDaemon(t, wire.Dialect0518)
	s, dec := newScheduler(t, d), newDecode(t, d)
	for i, chunks := range [][]int{{4}, {2, 2}, {1, 1, 1, 1}, {3, 1}} {
		r := roomSpec{id: uint64(100 + i), src: seqPages(4*i, 4), chunks: chunks, aux: i}
		dst := seqPages(32+4*i, 4)
		dec.checker.Expect(r.id, 1, false)
		dec.send(t, dec.info(r.id, dst, 8+i, 1))
		s.start(t, r)
		if rep := s.waitTerminal(t, r.id); rep.Status != kv.StatusSuccess {
			t.Fatalf("chunks %v: %v/%v", chunks, rep.Status, rep.Reason)
		}
		dec.verify(t, r.id, dst, 8+i)
		s.cli.Clear(r.id)
	}
}

func TestScenarioTwoDecodeRanksAndDummyInfo(t *testing.T) {
	d := startDaemon(t, wire.Dialect0518)
	s := newScheduler(t, d)
	a, b := newDecode(t, d), newDecode(t, d)
	// required_dst_info_num = 2: both ranks get every page.
	r := roomSpec{id: 200, src: seqPages(0, 3), chunks: []int{2, 1}, aux: 1}
	for _, dec := range []*decodeRank{a, b} {
		dec.checker.Expect(r.id, 1, false)
		dec.send(t, dec.info(r.id, seqPages(10, 3), 2, 2))
	}
	s.start(t, r)
	if rep := s.waitTerminal(t, r.id); rep.Status != kv.StatusSuccess {
		t.Fatalf("fan-out: %v/%v", rep.Status, rep.Reason)
	}
	a.verify(t, r.id, seqPages(10, 3), 2)
	b.verify(t, r.id, seqPages(10, 3), 2)

	// A dummy info (MLA fan-in) counts toward required but gets no writes.
	r = roomSpec{id: 201, src: seqPages(3, 2), chunks: []int{2}, aux: 3}
	a.checker.Expect(r.id, 1, false)
	a.send(t, a.info(r.id, seqPages(20, 2), 4, 2))
	dummy := &wire.TransferInfo{Room: r.id, DecodeIP: "127.0.0.1", DecodePort: b.pull.Port(), AgentName: b.node.Agent.Name(),
		DstAuxIndex: 4, RequiredDstInfoNum: 2, HasIsDummy: true, DummyFlag: true}
	b.send(t, dummy.Encode())
	s.start(t, r)
	if rep := s.waitTerminal(t, r.id); rep.Status != kv.StatusSuccess {
		t.Fatalf("dummy: %v/%v", rep.Status, rep.Reason)
	}
	a.verify(t, r.id, seqPages(20, 2), 4)
	if ns, _ := b.node.Agent.Notifs(nil); len(ns) != 0 {
		t.Fatalf("the dummy rank got notifications: %v", ns)
	}
}

func TestScenarioTwoPrefillRanksDistinctSenders(t *testing.T) {
	// Two pipeline stages (pp_rank 0 and 1) of one prefill instance: rank 1
	// registers into rank 0's bootstrap server; decode needs both senders.
	d0 := startDaemonWith(t, func(c *Config) { c.Rank.PPSize, c.Rank.PPRank = 2, 0 })
	d1 := startDaemonWith(t, func(c *Config) {
		c.Rank.PPSize, c.Rank.PPRank = 2, 1
		c.ServeBootstrap, c.BootstrapURL = false, "http://"+d0.BootstrapAddr()
	})
	s0, s1 := newScheduler(t, d0), newScheduler(t, d1)
	dec := newDecode(t, d0, d1)
	r := roomSpec{id: 300, src: seqPages(0, 2), chunks: []int{1, 1}, aux: 0}
	dec.checker.Expect(r.id, 2, false)
	dec.send(t, dec.info(r.id, seqPages(40, 2), 1, 1))
	s0.start(t, r)
	if rep := s0.waitTerminal(t, r.id); rep.Status != kv.StatusSuccess {
		t.Fatalf("stage 0: %v", rep.Status)
	}
	// Decode must not be done with one sender only.
	for range 100 {
		ns, _ := dec.node.Agent.Notifs(nil)
		for _, n := range ns {
			dec.checker.Feed(n.Msg)
		}
	}
	if dec.checker.Done(r.id) {
		t.Fatal("decode completed with one of two prefill senders")
	}
	s1.start(t, r)
	if rep := s1.waitTerminal(t, r.id); rep.Status != kv.StatusSuccess {
		t.Fatalf("stage 1: %v", rep.Status)
	}
	dec.verify(t, r.id, seqPages(40, 2), 1)
}

func TestScenarioPrefixHits(t *testing.T) {
	d := startDaemon(t, wire.Dialect0518)
	s, dec := newScheduler(t, d), newDecode(t, d)
	// Full hit: decode holds every page; prefill inits 0 pages and sends one
	// empty last chunk, which becomes aux_nokv.
	full := &wire.TransferInfo{Room: 400, DecodeIP: "127.0.0.1", DecodePort: dec.pull.Port(), AgentName: dec.node.Agent.Name(),
		DstAuxIndex: 6, RequiredDstInfoNum: 1, DecodePrefixLen: 64, HasDecodePrefixLen: true}
	dec.checker.Expect(400, 1, false)
	dec.send(t, full.Encode())
	s.start(t, roomSpec{id: 400, aux: 5})
	if rep := s.waitTerminal(t, 400); rep.Status != kv.StatusSuccess || rep.PrefixLen != 64 {
		t.Fatalf("full prefix hit: %+v", rep)
	}
	dec.verify(t, 400, nil, 6)
	// Partial hit: decode's page list covers only the pages after its prefix.
	part := &wire.TransferInfo{Room: 401, DecodeIP: "127.0.0.1", DecodePort: dec.pull.Port(), AgentName: dec.node.Agent.Name(),
		DstKVIndices: seqPages(50, 2), DstAuxIndex: 7, RequiredDstInfoNum: 1, DecodePrefixLen: 16, HasDecodePrefixLen: true}
	dec.checker.Expect(401, 1, false)
	dec.send(t, part.Encode())
	s.start(t, roomSpec{id: 401, src: seqPages(8, 2), chunks: []int{2}, aux: 6})
	if rep := s.waitTerminal(t, 401); rep.Status != kv.StatusSuccess || rep.PrefixLen != 16 {
		t.Fatalf("partial prefix hit: %+v", rep)
	}
	dec.verify(t, 401, seqPages(50, 2), 7)
}

func TestScenarioHybridState(t *testing.T) {
	d := startDaemonWith(t, func(c *Config) { c.StateComponents = 1 })
	s := newSchedulerState(t, d, true)
	dec := newDecodeShape(t, decodeShape(true), d)
	for k := range stateItem {
		s.state[3*stateItem+k] = byte(k*7 + 1)
	}
	ti := &wire.TransferInfo{Room: 500, DecodeIP: "127.0.0.1", DecodePort: dec.pull.Port(), AgentName: dec.node.Agent.Name(),
		DstKVIndices: seqPages(0, 2), DstAuxIndex: 1, RequiredDstInfoNum: 1, DstStateIndices: [][]int32{{5}}, HasDecodePrefixLen: true}
	dec.checker.Expect(500, 1, true)
	dec.send(t, ti.Encode())
	s.start(t, roomSpec{id: 500, src: seqPages(0, 2), chunks: []int{1, 1}, aux: 2, state: [][]int32{{3}}})
	if rep := s.waitTerminal(t, 500); rep.Status != kv.StatusSuccess {
		t.Fatalf("state room: %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, 500, seqPages(0, 2), 1)
	got := dec.node.State[0][5*stateItem : 6*stateItem]
	for k, b := range got {
		if b != byte(k*7+1) {
			t.Fatalf("decode state byte %d = %d", k, b)
		}
	}
}

// abortRig is a daemon in the ack protocol on a fake clock, so drain deadlines
// are exact.
func abortRig(t *testing.T) (*Daemon, *scheduler, *decodeRank, *clock.Fake) {
	clk := clock.NewFake(time.Unix(0, 0))
	d := startDaemonWith(t, func(c *Config) { c.Engine.Clock = clk })
	return d, newScheduler(t, d), newDecode(t, d), clk
}

func (r *decodeRank) abort(t *testing.T, id uint64) {
	r.send(t, (&wire.Abort{Room: id, DecodeIP: "127.0.0.1", DecodePort: r.pull.Port(), HasEndpoint: true}).Encode())
}

func (r *decodeRank) acks(id uint64) int { return r.count(isAck(id)) }

func isAck(id uint64) func(wire.Outbound) bool {
	return func(m wire.Outbound) bool { a, ok := m.(*wire.AbortAck); return ok && a.Room == id }
}

func isStatus(id uint64) func(wire.Outbound) bool {
	return func(m wire.Outbound) bool { k, ok := m.(*wire.KVStatus); return ok && k.Room == id }
}

func TestScenarioAbortOrderings(t *testing.T) {
	d, s, dec, clk := abortRig(t)
	expectFailed := func(id uint64, why kv.Reason) {
		t.Helper()
		if rep := s.waitTerminal(t, id); rep.Status != kv.StatusFailed || rep.Reason != why {
			t.Fatalf("room %d: %v/%v, want Failed/%v", id, rep.Status, rep.Reason, why)
		}
	}
	// Before the sender exists.
	dec.abort(t, 600)
	dec.waitFrame(t, isAck(600))
	s.cli.Open(600, "")
	expectFailed(600, kv.ReasonDecodeAbort)

	// After the sender, before the transfer info.
	s.cli.Open(601, "")
	dec.abort(t, 601)
	expectFailed(601, kv.ReasonDecodeAbort)
	dec.waitFrame(t, isAck(601))

	// After the transfer info.
	dec.send(t, dec.info(602, seqPages(0, 1), 0, 1))
	s.cli.Open(602, "")
	dec.abort(t, 602)
	expectFailed(602, kv.ReasonDecodeAbort)
	dec.waitFrame(t, isAck(602))

	// During a transfer that never completes: Failed at once; after the
	// drain deadline decode hears the failure (and why), but no ACK: a write
	// may still land, so decode keeps the pages until its own timeout.
	d.agent.(*loopback.Agent).SetFault(dec.node.Agent.Name(), loopback.Fault{Hang: true})
	dec.send(t, dec.info(603, seqPages(1, 2), 1, 1))
	s.start(t, roomSpec{id: 603, src: seqPages(0, 2), chunks: []int{1, 1}, aux: 1})
	waitFor(t, "room 603's two writes in flight", func() bool { return d.PoolStats().InFlight >= 2 })
	s.cli.Abort(603) // the client gives up
	expectFailed(603, kv.ReasonClientAbort)
	s.cli.Poll([]uint64{603}, nil)
	if n := dec.count(isStatus(603)); n != 0 {
		t.Fatalf("decode told with writes in flight")
	}
	clk.Advance(11 * time.Second)
	st := dec.waitFrame(t, isStatus(603)).(*wire.KVStatus)
	if st.Reason != "client_abort (writes still in flight after the drain deadline)" {
		t.Fatalf("status after an expired drain: %q", st.Reason)
	}
	dec.abort(t, 603) // decode's ABORT now: no ACK for a poisoned room
	s.cli.Poll([]uint64{603}, nil)
	if n := dec.acks(603); n != 0 {
		t.Fatalf("%d ABORT_ACKs for a room whose writes never drained", n)
	}
	d.agent.(*loopback.Agent).SetFault(dec.node.Agent.Name(), loopback.Fault{})

	// After Success: still Success, and decode gets its ACK.
	dec.checker.Expect(604, 1, false)
	dec.send(t, dec.info(604, seqPages(10, 1), 2, 1))
	s.start(t, roomSpec{id: 604, src: seqPages(4, 1), chunks: []int{1}, aux: 2})
	if rep := s.waitTerminal(t, 604); rep.Status != kv.StatusSuccess {
		t.Fatalf("room 604: %v", rep.Status)
	}
	dec.abort(t, 604)
	dec.waitFrame(t, isAck(604))
	if rep := s.waitTerminal(t, 604); rep.Status != kv.StatusSuccess {
		t.Fatalf("an abort after Success changed it to %v", rep.Status)
	}

	// Duplicated: one failure, one ACK per ABORT.
	s.cli.Open(605, "")
	dec.abort(t, 605)
	dec.abort(t, 605)
	expectFailed(605, kv.ReasonDecodeAbort)
	waitFor(t, "an ABORT_ACK for each of room 605's two ABORTs", func() bool { return dec.acks(605) >= 2 })
}

func TestScenarioLateInfoAfterClearIsToldTheFailure(t *testing.T) {
	_, s, dec, _ := abortRig(t)
	s.cli.Open(700, "")
	s.cli.Abort(700)
	if rep := s.waitTerminal(t, 700); rep.Status != kv.StatusFailed {
		t.Fatal(rep.Status)
	}
	s.cli.Failure([]uint64{700}, true) // failure_exception clears
	dec.send(t, dec.info(700, seqPages(0, 1), 0, 1))
	st := dec.waitFrame(t, isStatus(700)).(*wire.KVStatus)
	if st.Status != kv.StatusFailed || st.Reason != "client_abort" {
		t.Fatalf("late transfer info answered %+v", st)
	}
}

func TestScenarioDuplicateRegistrationAndUnknownAgent(t *testing.T) {
	d := startDaemon(t, wire.Dialect0518)
	s, dec := newScheduler(t, d), newDecode(t, d)
	waitFor(t, "registered", func() bool { return d.Counters()["registrations"] == 1 })
	// The same agent from another endpoint: first wins. (From its own
	// endpoint it is the decode coming back: TestSameAgentRegisteringAgain...)
	other := *dec.reg
	other.DecodePort = deadPort(t)
	dec.send(t, other.Encode())
	ghost := &wire.TransferInfo{Room: 800, DecodeIP: "127.0.0.1", DecodePort: 1, AgentName: "ghost",
		DstKVIndices: seqPages(0, 1), DstAuxIndex: 0, RequiredDstInfoNum: 1, HasDecodePrefixLen: true}
	dec.send(t, ghost.Encode())
	s.start(t, roomSpec{id: 800, src: seqPages(0, 1), chunks: []int{1}, aux: 0})
	if rep := s.waitTerminal(t, 800); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonInvalidRequest {
		t.Fatalf("unknown agent: %v/%v", rep.Status, rep.Reason)
	}
	dec.checker.Expect(801, 1, false)
	dec.send(t, dec.info(801, seqPages(5, 1), 3, 1))
	s.start(t, roomSpec{id: 801, src: seqPages(1, 1), chunks: []int{1}, aux: 1})
	if rep := s.waitTerminal(t, 801); rep.Status != kv.StatusSuccess {
		t.Fatalf("registered agent after the bad room: %v", rep.Status)
	}
	dec.verify(t, 801, seqPages(5, 1), 3)
	if c := d.Counters(); c["duplicate_registrations"] != 1 || c["registrations"] != 1 {
		t.Fatalf("counters %v", c)
	}
}

func TestScenarioDecodeVanishesMidTransfer(t *testing.T) {
	d := startDaemon(t, wire.Dialect0518)
	s := newScheduler(t, d)
	gone, ok := newDecode(t, d), newDecode(t, d)
	d.agent.(*loopback.Agent).SetFault(gone.node.Agent.Name(), loopback.Fault{Disconnect: true})
	gone.send(t, gone.info(900, seqPages(0, 2), 0, 1))
	ok.checker.Expect(901, 1, false)
	ok.send(t, ok.info(901, seqPages(0, 2), 0, 1))
	s.start(t, roomSpec{id: 900, src: seqPages(0, 2), chunks: []int{1, 1}, aux: 0})
	s.start(t, roomSpec{id: 901, src: seqPages(2, 2), chunks: []int{2}, aux: 1})
	if rep := s.waitTerminal(t, 900); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("room on the vanished decode: %v/%v", rep.Status, rep.Reason)
	}
	if rep := s.waitTerminal(t, 901); rep.Status != kv.StatusSuccess {
		t.Fatalf("room on the healthy decode: %v/%v", rep.Status, rep.Reason)
	}
	ok.verify(t, 901, seqPages(0, 2), 0)
}
