package actors

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// TestDirectoryTable checks the table against a map through adds and
// removes that force rebuilds, with ids that collide in the low bits.
func TestDirectoryTable(t *testing.T) {
	d := newDirectory()
	want := map[uint64]*live{}
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 200000 {
		id := uint64(rng.IntN(5000)) << 20 // same low bits: only the hash spreads them
		if lr, ok := want[id]; ok {
			d.remove(lr)
			delete(want, id)
		} else {
			lr := &live{id: id}
			d.add(lr)
			want[id] = lr
		}
		if step%997 == 0 {
			for id, lr := range want {
				if got := d.get(id); got != lr {
					t.Fatalf("step %d: get(%#x) = %p, want %p", step, id, got, lr)
				}
			}
		}
		probe := uint64(rng.IntN(5000)) << 20
		if got := d.get(probe); got != want[probe] {
			t.Fatalf("step %d: get(%#x) = %p, want %p", step, probe, got, want[probe])
		}
	}
	if d.count != len(want) {
		t.Fatalf("count %d, want %d", d.count, len(want))
	}
	if n := len(d.tab.Load().slots); n > 4*dirMinSlots && n > 8*len(want) {
		t.Fatalf("%d slots for %d rooms: removed slots are not reclaimed", n, len(want))
	}
	if d.gen == 0 {
		t.Fatal("no rebuild happened: the test does not exercise one")
	}
}

// TestDirectoryRemoveTwice: a room removed twice (retired, then its actor
// stopped) leaves another room in its old slot alone.
func TestDirectoryRemoveTwice(t *testing.T) {
	d := newDirectory()
	a := &live{id: 7}
	d.add(a)
	d.remove(a)
	b := &live{id: 7}
	d.add(b) // reuses a's removed slot
	d.remove(a)
	if d.get(7) != b {
		t.Fatal("removing a stale entry removed the room now in its slot")
	}
}

// TestDirectoryConcurrentReaders: readers racing the writer (run with -race)
// only ever get the room they asked for, and find rooms that stay.
func TestDirectoryConcurrentReaders(t *testing.T) {
	d := newDirectory()
	stay := make([]*live, 64)
	for i := range stay {
		stay[i] = &live{id: uint64(1_000_000 + i)}
		d.add(stay[i])
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 9))
			for !stop.Load() {
				id := uint64(rng.IntN(2000))
				if lr := d.get(id); lr != nil && lr.id != id {
					errs <- "got another room's entry"
					return
				}
				s := stay[rng.IntN(len(stay))]
				if d.get(s.id) != s {
					errs <- "lost a room that stays"
					return
				}
			}
		}()
	}
	churn := map[uint64]*live{}
	for i := range 300000 {
		id := uint64(i % 2000)
		if lr, ok := churn[id]; ok {
			d.remove(lr)
			delete(churn, id)
		} else {
			churn[id] = &live{id: id}
			d.add(churn[id])
		}
	}
	stop.Store(true)
	wg.Wait()
	select {
	case e := <-errs:
		t.Fatal(e)
	default:
	}
}

// TestDirectoryReadRules: a poll is answered from the directory only when
// the shard routed everything counted, the room handled everything routed to
// it, and nothing bounces.
func TestDirectoryReadRules(t *testing.T) {
	d := newDirectory()
	lr := &live{id: 5}
	lr.store(2, kv.Reply{Status: kv.StatusTransferring})
	lr.sent.Store(2)
	d.add(lr)
	d.enq.Store(10)
	d.routed.Store(10)
	cases := []struct {
		name string
		mod  func()
		ok   bool
	}{
		{"all routed and handled", func() {}, true},
		{"a counted message not routed", func() { d.enq.Store(11) }, false},
		{"a message routed, not handled", func() { lr.sent.Store(3) }, false},
		{"an envelope bouncing", func() { d.bouncing.Store(1) }, false},
		{"a prefix the view cannot hold", func() { lr.store(2, kv.Reply{Status: kv.StatusTransferring, PrefixLen: 1 << 40}) }, false},
		{"not live", func() { d.remove(lr) }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.mod()
			r, ok := d.read(5)
			if ok != c.ok || (ok && r.Status != kv.StatusTransferring) {
				t.Fatalf("read = %v, %v; want ok %v", r, ok, c.ok)
			}
			// Undo.
			d.enq.Store(10)
			lr.sent.Store(2)
			d.bouncing.Store(0)
			lr.store(2, kv.Reply{Status: kv.StatusTransferring})
			if d.get(5) == nil {
				d.add(lr)
			}
		})
	}
	if _, ok := d.read(99); ok {
		t.Fatal("a room nobody named was answered from the directory (the shard answers it)")
	}
}

// TestPollReadsDirectoryAfterOwnCalls: once a room handled everything routed
// to it, Engine.Poll answers it from the directory with what the room
// answers itself; right after the caller's own Abort the directory either
// cannot answer or answers Failed, never the status before the abort.
func TestPollReadsDirectoryAfterOwnCalls(t *testing.T) {
	f := newFixture(t, &transfersDouble{never: func(kv.Transfer) bool { return true }}, nil)
	ids := make([]uint64, 200)
	for i := range ids {
		ids[i] = uint64(i + 1)
		f.eng.Open(ids[i])
		f.eng.TransferInfo(ids[i], info("a", 4, 1))
		f.eng.Init(ids[i], 4, 0)
		f.eng.Send(ids[i], []int32{1, 2, 3, 4}, nil)
	}
	sync := f.eng.PollSync(ids, nil)
	for i, id := range ids {
		r, ok := f.eng.dirs[f.eng.shardIndex(id)].read(id)
		if !ok || r != sync[i] {
			t.Fatalf("room %d: directory %v, %v; the room answers %v", id, r, ok, sync[i])
		}
		if r.Status != kv.StatusTransferring {
			t.Fatalf("room %d: %v, want Transferring (its write never completes)", id, r.Status)
		}
	}
	for _, id := range ids {
		f.eng.Abort(id)
		if r, ok := f.eng.dirs[f.eng.shardIndex(id)].read(id); ok && r.Status != kv.StatusFailed {
			t.Fatalf("room %d: directory answered %v right after the caller's Abort", id, r.Status)
		}
		if r := f.poll(id); r.Status != kv.StatusFailed {
			t.Fatalf("room %d: Poll answered %v right after the caller's Abort", id, r.Status)
		}
	}
	f.settle(ids...)
	for _, id := range ids {
		if r, ok := f.eng.dirs[f.eng.shardIndex(id)].read(id); !ok || r.Status != kv.StatusFailed {
			t.Fatalf("room %d: directory %v, %v after settling, want Failed", id, r, ok)
		}
	}
	f.clk.Advance(time.Hour) // the drain deadlines: the engine closes without waiting
}

// TestPollOrderedAfterOwnCallsConcurrently: many goroutines, each opening
// rooms whose writes never complete and aborting them, never poll a status
// from before their own Abort, whichever path answers.
func TestPollOrderedAfterOwnCallsConcurrently(t *testing.T) {
	f := newFixture(t, &transfersDouble{never: func(kv.Transfer) bool { return true }}, nil)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]kv.Reply, 0, 1)
			for i := range 300 {
				id := uint64(g)<<32 | uint64(i+1)
				f.eng.Open(id)
				f.eng.TransferInfo(id, info("a", 2, 1))
				f.eng.Init(id, 2, 0)
				f.eng.Send(id, []int32{1, 2}, nil)
				if r := f.eng.Poll([]uint64{id}, out)[0]; r.Status == kv.StatusFailed || r.Status == kv.StatusSuccess {
					errs <- "a room ended before its abort"
					return
				}
				f.eng.Abort(id)
				if r := f.eng.Poll([]uint64{id}, out)[0]; r.Status != kv.StatusFailed {
					errs <- "a poll after the caller's Abort answered " + r.Status.String()
					return
				}
				f.eng.Clear(id)
			}
		}()
	}
	wg.Wait()
	f.clk.Advance(time.Hour) // the drain deadlines: the engine closes without waiting
	select {
	case e := <-errs:
		t.Fatal(e)
	default:
	}
}

// TestBouncedEnvelopesAreCounted: one Batch part routes a transfer info (a
// room nobody opened), a Fail (which retires it at once: nobody will poll
// it) and a decode ABORT to the same room in one shard step, so the ABORT
// reaches the retired room's actor and bounces. While it is on its way back
// the directory counts it; once it and every other bounce are routed,
// nothing.
func TestBouncedEnvelopesAreCounted(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, func(c *Config) { c.Shards = 1 })
	const id = 42
	d := f.eng.dirs[0]
	var atTomb []int64
	f.eng.cfg.hooks.shardStep = func(rid uint64, msg room.Msg) {
		if _, ok := msg.(room.DecodeAbort); ok && rid == id {
			atTomb = append(atTomb, d.bouncing.Load()) // the shard's goroutine
		}
	}
	b := f.eng.NewBatch()
	b.TransferInfo(id, info("a", 2, 1))
	b.Fail(id, kv.ReasonPeerLost)
	b.DecodeAbort(id, kv.Endpoint{IP: "127.0.0.1", Port: 9000})
	b.Flush()
	settled(f, id)
	// The ABORT itself is still counted when it reaches the tombstone (the
	// settling poll may be bouncing too, if it came before the retirement).
	if len(atTomb) != 1 || atTomb[0] < 1 {
		t.Fatalf("bouncing when the ABORT reached the tombstone: %v, want one value ≥ 1", atTomb)
	}
	if n := d.bouncing.Load(); n != 0 {
		t.Fatalf("bouncing = %d after settling, want 0", n)
	}
	if r := f.poll(id); r.Status != kv.StatusFailed {
		t.Fatalf("%v, want the tombstone's Failed", r.Status)
	}
}

// TestBouncesThenDirectory: Clear, Abort and Open sent back to back to a
// concluded room: whichever way the shard and the room interleave them
// (bounced or routed to the tombstone), every bounce is counted out again
// and the room the Open revived is answered from the directory.
func TestBouncesThenDirectory(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, nil)
	for id := uint64(1); id <= 300; id++ {
		f.eng.Open(id)
		f.eng.TransferInfo(id, info("a", 2, 1))
		f.eng.Init(id, 2, 0)
		f.eng.Send(id, []int32{1, 2}, nil)
	}
	for id := uint64(1); id <= 300; id++ {
		f.waitStatus(id, kv.StatusSuccess)
		f.settle(id) // concluded: its Clear retires it
	}
	for id := uint64(1); id <= 300; id++ {
		f.eng.Clear(id)
		f.eng.Abort(id)
		f.eng.Open(id)
		if r := f.poll(id); r.Status != kv.StatusBootstrapping {
			t.Fatalf("room %d: %v after Clear, Abort, Open; want the new incarnation's Bootstrapping", id, r.Status)
		}
	}
	for id := uint64(1); id <= 300; id++ {
		settled(f, id)
		d := f.eng.dirs[f.eng.shardIndex(id)]
		if n := d.bouncing.Load(); n != 0 {
			t.Fatalf("bouncing = %d after settling, want 0", n)
		}
		if _, ok := d.read(id); !ok {
			t.Fatalf("room %d: the revived room is not answered from the directory", id)
		}
	}
}

// settled settles id twice: a settling poll that bounced is answered while
// it is routed again, before the shard counts it out (bounceRouted); the
// second poll is routed after that.
func settled(f *fixture, id uint64) {
	f.settle(id)
	f.settle(id)
}

// TestLiveSize: a live room's entry stays in the 80-byte size class (one
// per live room; see live).
func TestLiveSize(t *testing.T) {
	if n := unsafe.Sizeof(live{}); n > 80 {
		t.Fatalf("live is %d bytes, want at most 80", n)
	}
}
