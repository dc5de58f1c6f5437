package daemon

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// as0523 makes a registration look like SGLang 0.5.23's (24 frames).
func as0523(r *wire.Registration) { r.HasStateDataLens = true }

// cpRank has a _prefill_unique_rank (3) that differs from the notification
// sender id (1), so a test can tell which one a frame carries.
// cpRank is a rank whose unique rank exercises every term of SGLang's
// formula. CP rank 1 transfers only when every CP rank does (otherwise it is
// SGLang's dummy CP rank and decode never pulls from it).
func cpRank(c *Config) {
	c.Rank = Rank{PPSize: 2, PPRank: 1, CPSize: 2, CPRank: 1}
	c.Topology.AllCPRanks = true
}

func isSuccess(id uint64) func(wire.Outbound) bool {
	return func(m wire.Outbound) bool {
		k, ok := m.(*wire.KVStatus)
		return ok && k.Room == id && k.Status == kv.StatusSuccess
	}
}

func (r *decodeRank) abortGen(t *testing.T, id, gen uint64) {
	r.send(t, (&wire.Abort{Room: id, DecodeIP: "127.0.0.1", DecodePort: r.pull.Port(), HasEndpoint: true, Generation: gen, HasGen: true}).Encode())
}

func (r *decodeRank) count(match func(wire.Outbound) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, f := range r.got {
		if m, err := wire.DecodeOutbound(f); err == nil && match(m) {
			n++
		}
	}
	return n
}

func debugPeers(t *testing.T, d *Daemon) map[string]peerInfo {
	t.Helper()
	resp, err := http.Get("http://" + d.DebugAddr() + "/debug/peers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Peers []peerInfo }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	out := map[string]peerInfo{}
	for _, p := range body.Peers {
		out[p.Agent] = p
	}
	return out
}

// A 0.5.23 decode completes only on KV_STATUS "4" with the unique rank, and
// must not be sent a single NIXL notification (they would pile up in its agent).
func TestDialect0523CompletesOnSuccessStatus(t *testing.T) {
	d := startDaemonWith(t, cpRank)
	s := newScheduler(t, d)
	dec := newDecodeWith(t, decodeShape(false), as0523, d)
	dst := seqPages(20, 3)
	dec.send(t, dec.info(700, dst, 5, 1))
	s.start(t, roomSpec{id: 700, src: seqPages(0, 3), chunks: []int{2, 1}, aux: 5})
	st := dec.waitFrame(t, isSuccess(700)).(*wire.KVStatus)
	if st.PrefillRank != 3 || st.Reason != "" {
		t.Fatalf("success status %+v: want prefill_rank 3 (_prefill_unique_rank) and no reason", st)
	}
	for j, p := range dst {
		if err := dec.node.CheckPageAt(700, int(p), j); err != nil {
			t.Fatal(err)
		}
	}
	if err := dec.node.CheckAux(5, 700); err != nil {
		t.Fatal("the success status left before aux landed: ", err)
	}
	if rep := s.waitTerminal(t, 700); rep.Status != kv.StatusSuccess {
		t.Fatalf("prefill: %v", rep.Status)
	}
	if ns, _ := dec.node.Agent.Notifs(nil); len(ns) != 0 {
		t.Fatalf("a 0.5.23 decode was sent %d NIXL notifications, e.g. %q", len(ns), ns[0].Msg)
	}
	if p := debugPeers(t, d)[dec.node.Agent.Name()]; p.Release != "0.5.23" || p.Frames != 24 {
		t.Fatalf("/debug/peers: %+v", p)
	}
}

// A legacy decode completes on notifications; with completion held, the last
// chunk's come after its writes, and a failure is a KV_STATUS "0" with the
// unique rank. A generation on an ABORT marks the decode 0.5.22: its ACK has 4
// frames and echoes it.
func TestDialectLegacyNotificationsAndGenerationAck(t *testing.T) {
	d := startDaemonWith(t, cpRank)
	s := newScheduler(t, d)
	dec := newDecode(t, d)
	dec.checker.Expect(710, 1, false)
	dst := seqPages(30, 2)
	dec.send(t, dec.info(710, dst, 6, 1))
	s.start(t, roomSpec{id: 710, src: seqPages(4, 2), chunks: []int{1, 1}, aux: 6})
	dec.verify(t, 710, dst, 6)
	if n := dec.count(isSuccess(710)); n != 0 {
		t.Fatalf("a 23-frame decode was sent %d success statuses (default 0.5.20 completes on notifications)", n)
	}
	if p := debugPeers(t, d)[dec.node.Agent.Name()]; p.Release != "0.5.20" {
		t.Fatalf("23-frame peer: %+v", p)
	}

	dec.send(t, dec.info(711, seqPages(40, 1), 7, 1))
	s.cli.Open(711, "")
	dec.abortGen(t, 711, 9)
	ack := dec.waitFrame(t, isAck(711)).(*wire.AbortAck)
	if !ack.HasGen || ack.Generation != 9 || ack.PrefillRank != 3 {
		t.Fatalf("ACK %+v: want generation 9 echoed, prefill_rank 3", ack)
	}
	// A failure decode did not cause (a client abort) is a KV_STATUS "0";
	// the decode that sent an ABORT is not told what it already knows.
	dec.send(t, dec.info(713, seqPages(41, 1), 8, 1))
	s.cli.Open(713, "")
	s.cli.Abort(713)
	st := dec.waitFrame(t, isStatus(713)).(*wire.KVStatus)
	if st.Status != kv.StatusFailed || st.PrefillRank != 3 || st.Reason != "client_abort" {
		t.Fatalf("failure status %+v", st)
	}
	if n := dec.count(isStatus(711)); n != 0 {
		t.Fatalf("the aborting decode was sent %d statuses for its own ABORT", n)
	}
	if p := debugPeers(t, d)[dec.node.Agent.Name()]; p.Release != "0.5.22" || p.Detected != "ABORT with a generation" {
		t.Fatalf("after a 5-frame ABORT: %+v", p)
	}
	// 0.5.22 ignores 3-frame ACKs: an ABORT without a generation (decode did
	// not arm) gets none.
	s.cli.Open(712, "")
	dec.abort(t, 712)
	if rep := s.waitTerminal(t, 712); rep.Status != kv.StatusFailed {
		t.Fatal(rep.Status)
	}
	dec.abortGen(t, 712, 10) // a later armed ABORT of the same room: acked now
	if a := dec.waitFrame(t, isAck(712)).(*wire.AbortAck); a.Generation != 10 {
		t.Fatalf("ACK %+v", a)
	}
	if n := dec.acks(712); n != 1 {
		t.Fatalf("%d ACKs for room 712, want only the generation's", n)
	}
}

// 0.5.18 reads nothing on its PULL socket: kvxferd sends it nothing.
func TestDialect0518IsSentNothing(t *testing.T) {
	d := startDaemonWith(t, func(c *Config) { c.LegacyDialect = wire.Dialect0518 })
	s := newScheduler(t, d)
	dec := newDecode(t, d)
	dec.checker.Expect(720, 1, false)
	dec.send(t, dec.info(720, seqPages(0, 1), 1, 1))
	s.start(t, roomSpec{id: 720, src: seqPages(0, 1), chunks: []int{1}, aux: 1})
	dec.verify(t, 720, seqPages(0, 1), 1)
	dec.send(t, dec.info(721, seqPages(1, 1), 2, 1))
	s.cli.Open(721, "")
	dec.abort(t, 721)
	if rep := s.waitTerminal(t, 721); rep.Status != kv.StatusFailed {
		t.Fatal(rep.Status)
	}
	// A witness: a room both decodes take part in fails; the 0.5.23 decode
	// hears it, and the 0.5.18 decode's notice was decided in the same step,
	// before it.
	witness := newDecodeWith(t, decodeShape(false), as0523, d)
	s.cli.Open(722, "")
	dec.send(t, dec.info(722, seqPages(2, 1), 3, 2))
	witness.send(t, witness.info(722, seqPages(2, 1), 3, 2))
	s.cli.Abort(722)
	witness.waitFrame(t, isStatus(722))
	if n := dec.count(func(wire.Outbound) bool { return true }); n != 0 {
		t.Fatalf("a 0.5.18 decode was sent %d frames", n)
	}
	dec.mu.Lock()
	defer dec.mu.Unlock()
	if len(dec.got) != 0 {
		t.Fatalf("a 0.5.18 decode was sent %d frames", len(dec.got))
	}
}

// One kvxferd serves a 0.5.18, a 0.5.20 and a 0.5.23 decode at once.
func TestDialectMixedFleet(t *testing.T) {
	d := startDaemonWith(t, func(c *Config) {})
	s := newScheduler(t, d)
	legacy := newDecode(t, d)
	modern := newDecodeWith(t, decodeShape(false), as0523, d)
	const n = 40
	for i := range n {
		id := uint64(800 + i)
		dec := legacy
		if i%2 == 1 {
			dec = modern
		} else {
			dec.checker.Expect(id, 1, false)
		}
		dec.send(t, dec.info(id, seqPages(i%slots, 1), i%auxSlots, 1))
		s.start(t, roomSpec{id: id, src: seqPages((i+7)%slots, 1), chunks: []int{1}, aux: i % auxSlots})
	}
	for i := range n {
		id := uint64(800 + i)
		if i%2 == 1 {
			modern.waitFrame(t, isSuccess(id))
		} else {
			legacy.waitDone(t, id)
		}
		if rep := s.waitTerminal(t, id); rep.Status != kv.StatusSuccess {
			t.Fatalf("room %d: %v", id, rep.Status)
		}
	}
	if ns, _ := modern.node.Agent.Notifs(nil); len(ns) != 0 {
		t.Fatalf("0.5.23 decode got %d notifications", len(ns))
	}
	if legacy.count(isSuccess(0)) != 0 || legacy.count(func(m wire.Outbound) bool { _, ok := m.(*wire.KVStatus); return ok }) != 0 {
		t.Fatal("the legacy decode got KV_STATUS frames for successful rooms")
	}
}

// A registration no supported release sends is rejected; the agent's rooms
// fail with peer_rejected and decode is told why.
func TestDialectRejectsUnknownRegistration(t *testing.T) {
	d := startDaemon(t, wire.DialectUnknown)
	s := newScheduler(t, d)
	bad := newDecodeWith(t, decodeShape(false), func(r *wire.Registration) { r.HasLayerInfo = false }, d) // 19 frames
	s.cli.Open(730, "")
	bad.send(t, bad.info(730, seqPages(0, 1), 0, 1))
	if rep := s.waitTerminal(t, 730); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerRejected {
		t.Fatalf("room of a rejected agent: %v/%v", rep.Status, rep.Reason)
	}
	st := bad.waitFrame(t, isStatus(730)).(*wire.KVStatus)
	if !strings.Contains(st.Reason, "peer_rejected") || !strings.Contains(st.Reason, "19 frames") {
		t.Fatalf("decode was told %q", st.Reason)
	}
	if d.Counters()["bad_registrations"] != 1 {
		t.Fatalf("counters %v", d.Counters())
	}
	if p := debugPeers(t, d)[bad.node.Agent.Name()]; p.Rejected == "" {
		t.Fatalf("/debug/peers does not show the rejection: %+v", p)
	}
	// A good decode on the same daemon is untouched.
	good := newDecode(t, d)
	good.checker.Expect(731, 1, false)
	good.send(t, good.info(731, seqPages(3, 1), 2, 1))
	s.start(t, roomSpec{id: 731, src: seqPages(3, 1), chunks: []int{1}, aux: 2})
	good.verify(t, 731, seqPages(3, 1), 2)
}

// The ACK leaves only once every posted write drained: zeroing decode's pages
// right after it must leave them zero.
func TestDialectNothingLandsAfterTheAck(t *testing.T) {
	d := startDaemon(t, wire.DialectUnknown)
	s := newScheduler(t, d)
	dec := newDecode(t, d)
	d.agent.(*loopback.Agent).SetFault(dec.node.Agent.Name(), loopback.Fault{Latency: loopback.Fixed(50 * time.Millisecond)})
	dst := seqPages(10, 4)
	dec.send(t, dec.info(740, dst, 3, 1))
	s.start(t, roomSpec{id: 740, src: seqPages(0, 4), chunks: []int{1, 1, 1, 1}, aux: 3})
	waitFor(t, "room 740's writes in flight", func() bool { return d.PoolStats().InFlight != 0 })
	dec.abortGen(t, 740, 1)
	dec.waitFrame(t, isAck(740))
	dec.node.ZeroPages(dst)
	d.agent.(*loopback.Agent).SetFault(dec.node.Agent.Name(), loopback.Fault{})
	waitFor(t, "room 740's writes done", func() bool { return d.PoolStats().InFlight == 0 })
	// A later room through the same pool actor and peer: once it landed,
	// anything 740 still had queued would have too.
	dec.checker.Expect(741, 1, false)
	dec.send(t, dec.info(741, seqPages(30, 1), 4, 1))
	s.start(t, roomSpec{id: 741, src: seqPages(9, 1), chunks: []int{1}, aux: 4})
	dec.verify(t, 741, seqPages(30, 1), 4)
	if !dec.node.PagesZero(dst) {
		t.Fatal("a write landed in room 740's pages after its ABORT_ACK")
	}
}
