package actors

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/actors/xfer/xfertest"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

type abortPlan uint8

const (
	noAbort abortPlan = iota
	clientAbort
	decodeAbort
	decodeAbortFirst // decode's ABORT before the scheduler opens the sender
)

type roomPlan struct {
	id       uint64
	agents   int // 1 or 2 real agents
	dummy    bool
	chunks   [][]int32
	abort    abortPlan
	abortAt  int // index in the room's op sequence
	failing  bool
	stuck    bool
	numPages int
}

func (p *roomPlan) clean() bool { return p.abort == noAbort && !p.failing && !p.stuck }

func makePlans(n int, rng *rand.Rand) []*roomPlan {
	plans := make([]*roomPlan, n)
	for i := range plans {
		p := &roomPlan{id: uint64(i)*7919 + 1, agents: 1 + rng.IntN(2), dummy: rng.IntN(4) == 0}
		nChunks := 1 + rng.IntN(3)
		next := int32(0)
		for c := 0; c < nChunks; c++ {
			k := 1 + rng.IntN(3)
			chunk := make([]int32, k)
			for j := range chunk {
				chunk[j] = next
				next++
			}
			p.chunks = append(p.chunks, chunk)
		}
		p.numPages = int(next)
		switch r := rng.IntN(100); {
		case r < 15:
			p.abort = clientAbort
		case r < 30:
			p.abort = decodeAbort
		case r < 35:
			p.abort = decodeAbortFirst
		}
		p.abortAt = rng.IntN(2 + nChunks)
		p.failing = rng.IntN(100) < 5
		p.stuck = rng.IntN(100) < 2
		plans[i] = p
	}
	return plans
}

// TestEngineTenThousandRoomsConcurrently drives 10,000 rooms from concurrent
// scheduler and decode goroutines in random orders, with aborts from both
// sides, failing writes and writes that never complete, then lets the
// deadlines pass. Every room must publish exactly one terminal status, clean
// rooms must succeed, aborted rooms must fail, nothing may stay live, and no
// goroutine may outlive Close.
func TestEngineTenThousandRoomsConcurrently(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 2000
	}
	baseline := runtime.NumGoroutine()
	rng := rand.New(rand.NewPCG(1, 2))
	plans := makePlans(n, rng)
	byRoom := map[uint64]*roomPlan{}
	for _, p := range plans {
		byRoom[p.id] = p
	}

	x := &transfersDouble{async: true}
	x.outcome = func(tr kv.Transfer) kv.Reason {
		if byRoom[tr.Room].failing {
			return kv.ReasonTransferError
		}
		return kv.ReasonNone
	}
	x.never = func(tr kv.Transfer) bool { return byRoom[tr.Room].stuck }
	clk := clock.NewFake(time.Unix(0, 0))
	obs := newRecorder()
	// The room cap is not under test here: 10,000 rooms, most from one agent.
	eng, err := New(Config{Clock: clk, Transfers: x, Observer: Flat(obs), Notifier: &xfertest.Notices{}, RoomCap: 1 << 20, PeerRoomCap: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}

	const workers = 8
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(2)
		go func(w int) { // scheduler side
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			mine := pick(plans, w, workers)
			steps := make([]int, len(mine))
			for remaining := len(mine); remaining > 0; {
				i := r.IntN(len(mine))
				p := mine[i]
				if steps[i] < 0 {
					continue
				}
				if schedulerStep(eng, p, steps[i]) {
					steps[i]++
				} else {
					steps[i] = -1
					remaining--
				}
			}
		}(w)
		go func(w int) { // decode side
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 11))
			for _, p := range pick(plans, w, workers) {
				if p.abort == decodeAbortFirst {
					eng.DecodeAbort(p.id, kv.Endpoint{IP: "127.0.0.1", Port: 1})
					continue
				}
				for a := 0; a < p.agents; a++ {
					eng.TransferInfo(p.id, info(string(rune('a'+a)), p.numPages, p.agents+boolInt(p.dummy)))
				}
				if p.dummy {
					eng.TransferInfo(p.id, room.TransferInfo{Agent: "d", Required: p.agents + 1, Dummy: true})
				}
				if p.abort == decodeAbort {
					if r.IntN(2) == 0 {
						runtime.Gosched()
					}
					eng.DecodeAbort(p.id, kv.Endpoint{IP: "127.0.0.1", Port: 2})
				}
			}
		}(w)
	}
	wg.Wait()
	ids := make([]uint64, n)
	for i, p := range plans {
		ids[i] = p.id
	}
	// Quiesce without time passing: a poll of every room is handled after
	// everything queued before it (so every Post has happened), then every
	// completed write reports back; repeat until nothing new was posted.
	for {
		before := x.posted.Load()
		eng.PollSync(ids, nil)
		x.wg.Wait()
		if x.posted.Load() == before {
			break
		}
	}
	replies := eng.PollSync(ids, nil)
	for i, p := range plans {
		if p.clean() && replies[i].Status != kv.StatusSuccess {
			t.Fatalf("clean room %d is %v/%v before any deadline", p.id, replies[i].Status, replies[i].Reason)
		}
	}
	// Let time pass: bootstrap, waiting, transfer and drain deadlines fire.
	for round := 0; round < 10; round++ {
		replies = eng.PollSync(ids, replies)
		pending := 0
		for _, r := range replies {
			if !r.Status.Terminal() {
				pending++
			}
		}
		if pending == 0 {
			break
		}
		clk.Advance(5 * time.Minute)
		x.wg.Wait()
	}
	for i, p := range plans {
		r := replies[i]
		switch {
		case !r.Status.Terminal():
			t.Fatalf("room %d pinned at %v", p.id, r.Status)
		case (p.abort == clientAbort || p.abort == decodeAbortFirst) && r.Status != kv.StatusFailed:
			// A decode abort races the scheduler and may land after Success,
			// which it must not change; these two always come first.
			t.Fatalf("aborted room %d (plan %d) ended %v", p.id, p.abort, r.Status)
		case (p.failing || p.stuck) && p.abort == noAbort && r.Status != kv.StatusFailed:
			t.Fatalf("room %d with failing writes ended %v", p.id, r.Status)
		}
		if got := obs.terminal(p.id); len(got) != 1 || got[0] != r.Status {
			t.Fatalf("room %d published terminal statuses %v, polls %v", p.id, got, r.Status)
		}
	}
	for _, id := range ids {
		eng.Clear(id)
	}
	clk.Advance(10 * time.Minute) // drains and lingers end
	eng.PollSync(ids, replies)
	if st := eng.Stats(); st.LiveRooms != 0 {
		t.Fatalf("%d rooms still live after every room was cleared: %+v", st.LiveRooms, eng.Rooms(5))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := eng.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitGoroutines(t, baseline)
}

func schedulerStep(eng *Engine, p *roomPlan, step int) bool {
	if p.abort == clientAbort && step == p.abortAt {
		eng.Abort(p.id)
	}
	switch {
	case step == 0:
		eng.Open(p.id)
	case step == 1:
		eng.Init(p.id, p.numPages, 0)
	case step-2 < len(p.chunks):
		eng.Send(p.id, p.chunks[step-2], nil)
	default:
		return false
	}
	return true
}

func pick(plans []*roomPlan, w, n int) []*roomPlan {
	var out []*roomPlan
	for i := w; i < len(plans); i += n {
		out = append(out, plans[i])
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// waitGoroutines fails if goroutines started by the test outlive it. Goroutines
// end asynchronously after Close returns, so it re-checks for a bounded time.
func waitGoroutines(t *testing.T, baseline int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= baseline {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines left after Close (baseline %d):\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
