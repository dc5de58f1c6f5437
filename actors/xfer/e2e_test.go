package xfer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

var seq atomic.Int64

func shape() kvmem.Shape {
	sh := kvmem.DefaultShape()
	sh.Slots, sh.Item, sh.StateSlots, sh.StateItem, sh.StateBufs = 256, 1024, 32, 256, 2
	return sh
}

func node(t testing.TB, role string, sender int) *kvmem.Node {
	t.Helper()
	return nodeWith(t, role, sender, loopback.Options{})
}

func nodeWith(t testing.TB, role string, sender int, o loopback.Options) *kvmem.Node {
	t.Helper()
	n, err := kvmem.New(fmt.Sprintf("%s-%d", role, seq.Add(1)), shape(), sender, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// rig is a prefill engine with its transfer pool over loopback NIXL and two
// decode ranks, each with its own agent, memory and completion checker.
type rig struct {
	t      testing.TB
	clk    *clock.Fake
	eng    *actors.Engine
	pool   *xfer.Pool
	pre    *kvmem.Node
	dec    []*kvmem.Node
	checks []*sglang.Checker
}

func newRig(t *testing.T) *rig { return newRigWith(t, 0, false) }

func newRigQuarantine(t *testing.T, quarantineAfter time.Duration) *rig {
	return newRigWith(t, quarantineAfter, false)
}

// newRigWith can hold completion notifications back (kvxferd's setting); the
// pool then sends them as the engine's Notifier.
func newRigWith(t testing.TB, quarantineAfter time.Duration, hold bool) *rig {
	return newRigOpts(t, rigOpts{quarantineAfter: quarantineAfter, hold: hold})
}

type rigOpts struct {
	quarantineAfter time.Duration
	hold            bool
	// latencyOnFake: prefill's loopback agent measures injected latency on
	// the rig's fake clock, so a delayed write completes only once the test
	// advances it past its due time.
	latencyOnFake bool
	actors        int                         // pool actors (default the pool's)
	maxInFlight   int                         // the pool's window (default the pool's)
	wrap          func(nixl.Agent) nixl.Agent // what the pool sees of prefill's agent
}

func newRigOpts(t testing.TB, o rigOpts) *rig {
	quarantineAfter, hold := o.quarantineAfter, o.hold
	r := &rig{t: t, clk: clock.NewFake(time.Unix(0, 0))}
	var lo loopback.Options
	if o.latencyOnFake {
		lo.Clock = r.clk
	}
	r.pre = nodeWith(t, "prefill", 3, lo)
	var agent nixl.Agent = r.pre.Agent
	if o.wrap != nil {
		agent = o.wrap(agent)
	}
	pool, err := xfer.New(xfer.Config{Agent: agent, Local: &r.pre.Geo, QuarantineAfter: quarantineAfter, Clock: r.clk, Actors: o.actors, MaxInFlight: o.maxInFlight})
	if err != nil {
		t.Fatal(err)
	}
	r.pool = pool
	for i := range 2 {
		d := node(t, fmt.Sprintf("decode%d", i), 0)
		md, err := d.Agent.LocalMetadata()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.pre.Agent.LoadPeer(md); err != nil {
			t.Fatal(err)
		}
		if err := pool.AddPeer(d.Peer()); err != nil {
			t.Fatal(err)
		}
		r.dec = append(r.dec, d)
		r.checks = append(r.checks, sglang.NewChecker())
	}
	cfg := actors.Config{Clock: r.clk, Transfers: pool, Notifier: pool}
	cfg.Room = room.DefaultConfig()
	cfg.Room.HoldCompletion = hold
	eng, err := actors.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.eng = eng
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Close(ctx)
		pool.Close()
	})
	return r
}

// roomCase is one room's shape.
type roomCase struct {
	id        uint64
	chunks    []int // pages per chunk
	srcBase   int   // first prefill page
	dstBase   int   // first decode page
	aux       int   // aux slot on both sides
	dummyB    bool  // decode 1 sends a dummy transfer info
	prefixHit bool  // decode holds every page: Init(0) and an empty last chunk
	state     bool
}

func (c *roomCase) pages() int {
	n := 0
	for _, k := range c.chunks {
		n += k
	}
	return n
}

func (r *rig) start(c *roomCase) {
	total := c.pages()
	for p := 0; p < total; p++ {
		r.pre.FillPage(c.id, c.srcBase+p)
	}
	r.pre.WriteAux(c.aux, c.id)
	if c.state {
		for b, buf := range r.pre.State {
			it := r.pre.Shape.StateItem
			for k := range it {
				buf[c.aux*it+k] = kvmem.Pattern(c.id, 100+b, c.aux, k)
			}
		}
	}
	r.eng.Open(c.id)
	for i, d := range r.dec {
		info := room.TransferInfo{Agent: d.Agent.Name(), From: kv.Endpoint{IP: "127.0.0.1", Port: 7000 + i}, DstAux: c.aux, Required: 2}
		if c.prefixHit {
			info.PrefixLen = 64
		} else {
			for p := 0; p < total; p++ {
				info.DstPages = append(info.DstPages, int32(c.dstBase+p))
			}
		}
		if c.state {
			info.DstState = [][]int32{{int32(c.aux)}}
		}
		if i == 1 && c.dummyB {
			info = room.TransferInfo{Agent: d.Agent.Name(), Required: 2, DstAux: c.aux, Dummy: true}
		} else {
			r.checks[i].Expect(c.id, 1, c.state)
		}
		r.eng.TransferInfo(c.id, info)
	}
	r.eng.Init(c.id, total, c.aux)
	next := c.srcBase
	if c.prefixHit {
		r.eng.Send(c.id, nil, nil)
		return
	}
	for i, k := range c.chunks {
		ps := make([]int32, k)
		for j := range ps {
			ps[j] = int32(next)
			next++
		}
		var state [][]int32
		if c.state && i == len(c.chunks)-1 {
			state = [][]int32{{int32(c.aux)}}
		}
		r.eng.Send(c.id, ps, state)
	}
}

func (r *rig) wait(id uint64, want kv.Status) kv.Reply {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rep := r.eng.Poll([]uint64{id}, nil)[0]
		if rep.Status == want || (rep.Status.Terminal() && want.Terminal()) {
			if rep.Status != want {
				r.t.Fatalf("room %d ended %v/%v, want %v", id, rep.Status, rep.Reason, want)
			}
			return rep
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("room %d still %v, want %v (pool %+v)", id, rep.Status, want, r.pool.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

// awaitDecode drains decode notifications until SGLang's completion rule
// holds for the room on every real decode, as decode's poll() does; delivery
// is asynchronous to prefill's Done.
func (r *rig) awaitDecode(c *roomCase) {
	r.t.Helper()
	for i, d := range r.dec {
		if i == 1 && c.dummyB {
			continue
		}
		deadline := time.Now().Add(20 * time.Second)
		for !r.checks[i].Done(c.id) {
			notifs, err := d.Agent.Notifs(nil)
			if err != nil {
				r.t.Fatal(err)
			}
			for _, n := range notifs {
				if _, err := r.checks[i].Feed(n.Msg); err != nil {
					r.t.Fatalf("decode %d notif %q: %v", i, n.Msg, err)
				}
			}
			if time.Now().After(deadline) {
				r.t.Fatalf("decode %d: room %d not done by SGLang's rule: %+v", i, c.id, r.checks[i].Status(c.id))
			}
			if len(notifs) == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}
}

// verify checks completion, KV bytes, aux and state on every real decode.
func (r *rig) verify(c *roomCase) {
	r.t.Helper()
	r.awaitDecode(c)
	for i, d := range r.dec {
		if i == 1 && c.dummyB {
			continue
		}
		if !c.prefixHit {
			for p := 0; p < c.pages(); p++ {
				if err := d.CheckPage(c.id, c.dstBase+p, c.srcBase+p); err != nil {
					r.t.Fatalf("decode %d: %v", i, err)
				}
			}
		}
		if err := d.CheckAux(c.aux, c.id); err != nil {
			r.t.Fatalf("decode %d: %v", i, err)
		}
		if c.state {
			it := d.Shape.StateItem
			for b, buf := range d.State {
				for k := range it {
					if got, want := buf[c.aux*it+k], kvmem.Pattern(c.id, 100+b, c.aux, k); got != want {
						r.t.Fatalf("decode %d state buffer %d byte %d = %d, want %d", i, b, k, got, want)
					}
				}
			}
		}
	}
}

func TestEndToEndRoomsOverLoopback(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) { endToEnd(t, newRigWith(t, 0, hold)) })
	}
}

func endToEnd(t *testing.T, r *rig) {
	cases := []*roomCase{
		{id: 101, chunks: []int{3}, srcBase: 0, dstBase: 10, aux: 1},
		{id: 102, chunks: []int{2, 2, 1}, srcBase: 3, dstBase: 20, aux: 2},
		{id: 103, chunks: []int{1, 1, 1, 1, 1, 1, 1, 1}, srcBase: 8, dstBase: 30, aux: 3},
		{id: 104, chunks: []int{4, 4}, srcBase: 16, dstBase: 40, aux: 4, dummyB: true},
		{id: 105, prefixHit: true, aux: 5},
		{id: 106, chunks: []int{2, 3}, srcBase: 24, dstBase: 50, aux: 6, state: true},
	}
	for _, c := range cases {
		r.start(c)
	}
	for _, c := range cases {
		r.wait(c.id, kv.StatusSuccess)
	}
	// Every room is done on the prefill side: decode must agree, byte for byte.
	for _, c := range cases {
		r.verify(c)
	}
	// A worker reports a transfer done before it drops the in-flight count
	// (Pool.finish), so the last room may poll Success a moment before the
	// count reaches 0.
	until(t, "the pool's in-flight count back to 0", func() bool { return r.pool.Stats().InFlight == 0 })
	if st := r.pool.Stats(); st.Failed != 0 {
		t.Fatalf("pool after all rooms: %+v", st)
	}
}

func TestEndToEndFaultsFailOnlyAffectedRooms(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault loopback.Fault
		want  kv.Reason
	}{
		{"error", loopback.Fault{Fail: true}, kv.ReasonTransferError},
		{"disconnect", loopback.Fault{Disconnect: true}, kv.ReasonPeerLost},
		{"stall", loopback.Fault{Hang: true}, kv.ReasonTransferTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRigQuarantine(t, time.Millisecond)
			// Rooms on decode 0 only (decode 1 dummy) must succeed while
			// decode 1 misbehaves; rooms that need decode 1 must fail.
			healthy := &roomCase{id: 201, chunks: []int{2, 2}, srcBase: 0, dstBase: 0, aux: 1, dummyB: true}
			r.pre.Agent.SetFault(r.dec[1].Agent.Name(), tc.fault)
			hit := &roomCase{id: 202, chunks: []int{2, 1}, srcBase: 10, dstBase: 10, aux: 2}
			r.start(healthy)
			r.start(hit)
			r.wait(healthy.id, kv.StatusSuccess)
			r.verify(healthy)
			if tc.want == kv.ReasonTransferTimeout {
				// Decode 0's writes complete; decode 1's never do. Time passes
				// once every write is posted (healthy: 2, hit: 2 chunks × 2
				// decodes) and only decode 1's two are left in flight.
				until(t, "every write posted, decode 1's two left in flight", func() bool {
					st := r.pool.Stats()
					return st.Posted >= 6 && st.InFlight <= 2
				})
				// Every completion so far is handled (each re-arms the
				// no-progress deadline) before time passes.
				r.eng.PollSync([]uint64{healthy.id, hit.id}, nil)
				r.clk.Advance(61 * time.Second)
			}
			rep := r.wait(hit.id, kv.StatusFailed)
			if rep.Reason != tc.want {
				t.Fatalf("room on the faulty peer failed with %v, want %v", rep.Reason, tc.want)
			}
			if tc.want != kv.ReasonTransferTimeout {
				return
			}
			// The stalled request is never released: it is quarantined and
			// counted, and the room concludes by its drain deadline. The
			// quarantine is decided on the fake clock (it passed 1 ms only
			// when the test advanced it, after the healthy writes were done),
			// so exactly the two stuck chunks are quarantined.
			until(t, "the stuck chunks quarantined", func() bool { return r.pool.Stats().Quarantined >= 2 })
			if st := r.pool.Stats(); st.Quarantined != 2 || st.InFlight != 2 {
				t.Fatalf("stalled transfer: pool %+v, want both chunks to decode 1 quarantined and still in flight", st)
			}
			r.clk.Advance(11 * time.Second)
			if rooms := r.eng.Rooms(10); len(rooms) != 0 {
				t.Fatalf("non-terminal rooms after the drain deadline: %+v", rooms)
			}
		})
	}
}

func TestUnknownAgentFailsOnlyThatRoom(t *testing.T) {
	r := newRig(t)
	r.eng.Open(301)
	r.eng.TransferInfo(301, room.TransferInfo{Agent: "nobody", DstPages: []int32{1}, DstAux: 1, Required: 1})
	r.eng.Init(301, 1, 1)
	r.eng.Send(301, []int32{1}, nil)
	if rep := r.wait(301, kv.StatusFailed); rep.Reason != kv.ReasonInvalidRequest {
		t.Fatalf("reason %v", rep.Reason)
	}
	ok := &roomCase{id: 302, chunks: []int{1}, srcBase: 5, dstBase: 5, aux: 2}
	r.start(ok)
	r.wait(ok.id, kv.StatusSuccess)
	r.verify(ok)
}

// A write that reaches the pool after its decode was removed (lost while the
// write was queued) fails its room peer_lost; the decode registering again
// is served again.
func TestRemovedAgentFailsPeerLost(t *testing.T) {
	r := newRig(t)
	d := r.dec[0]
	r.pool.RemovePeer(d.Agent.Name())
	r.eng.Open(311)
	r.eng.TransferInfo(311, room.TransferInfo{Agent: d.Agent.Name(), DstPages: []int32{1}, DstAux: 1, Required: 1})
	r.eng.Init(311, 1, 1)
	r.eng.Send(311, []int32{1}, nil)
	if rep := r.wait(311, kv.StatusFailed); rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("room to a removed decode: reason %v, want peer_lost", rep.Reason)
	}
	if err := r.pool.AddPeer(d.Peer()); err != nil {
		t.Fatal(err)
	}
	ok := &roomCase{id: 312, chunks: []int{1}, srcBase: 5, dstBase: 5, aux: 2}
	r.start(ok)
	r.wait(ok.id, kv.StatusSuccess)
	r.verify(ok)
}

func TestBadIndexNeverWritesOutOfRange(t *testing.T) {
	r := newRig(t)
	r.eng.Open(401)
	for i, d := range r.dec {
		r.eng.TransferInfo(401, room.TransferInfo{Agent: d.Agent.Name(), From: kv.Endpoint{Port: i}, DstPages: []int32{int32(d.Shape.Slots + 5)}, DstAux: 1, Required: 2})
	}
	r.eng.Init(401, 1, 1)
	r.eng.Send(401, []int32{0}, nil)
	if rep := r.wait(401, kv.StatusFailed); rep.Reason != kv.ReasonInvalidRequest {
		t.Fatalf("reason %v", rep.Reason)
	}
	if st := r.pool.Stats(); st.Requests != 0 {
		t.Fatalf("%d NIXL requests were posted for an out-of-range page", st.Requests)
	}
}
