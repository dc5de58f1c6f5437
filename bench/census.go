package bench

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/kv"
)

// CensusResult counts what a mixed workload left behind on one engine.
type CensusResult struct {
	Rooms     int
	Succeeded int // terminal answers the scheduler saw
	Failed    int
	// Pinned: rooms never terminal by the end of the scheduler's loop (Grace
	// of fake time, polled once per simulated second).
	Pinned int
	// PinnedAt counts the pinned rooms by the status they are stuck in.
	PinnedAt map[kv.Status]int
	// LiveBeforeGrace and Leaked: Target.Live when the loop ended, and after
	// a further Grace of fake time (sweeps, tombstone expiry).
	LiveBeforeGrace int
	Leaked          int
}

// openPerLoop is how many new requests the scheduler admits per iteration.
const openPerLoop = 4

// Room plans of the census: what decode and the scheduler do with a room.
const (
	planOK          = iota // the normal life
	planAbortEarly         // decode aborts before (or racing) the sender
	planAbortMid           // decode sends its info, then aborts at some point
	planClientAbort        // the client aborts after the first chunk
	planLateInfo           // decode re-sends its info after the scheduler cleared
	numPlans
)

// Census drives rooms through one engine the way the two sides really run:
// decode on its own goroutine (infos, ABORTs, late infos), the scheduler as
// one loop that admits a few new requests, polls every live room and acts on
// the answers (init and two chunks once WaitingForInput, clear once
// terminal); each iteration lets the engine settle and is one second of fake
// time. Unlike the race scenarios the
// interleavings are not forced, so it measures how often the races hit under
// a given mix; the seed fixes the mix, not the schedule.
func Census(t *Target, rooms int, seed uint64) CensusResult {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	plans := make([]int, rooms)
	ids := make([]uint64, rooms)
	cleared := make([]chan struct{}, rooms)
	for i := range plans {
		plans[i] = rng.IntN(numPlans)
		ids[i] = uint64(10_000 + i)
		cleared[i] = make(chan struct{})
	}

	var decode sync.WaitGroup
	decode.Add(1)
	go func() { // decode: one goroutine per rank, frames in order
		defer decode.Done()
		var midAborts []uint64
		for i, p := range plans {
			switch p {
			case planAbortEarly:
				t.Engine.DecodeAbort(ids[i], decodeEP)
			default:
				t.Engine.TransferInfo(ids[i], info(2, 1))
			}
			if p == planAbortMid {
				midAborts = append(midAborts, ids[i])
			}
			if p == planLateInfo {
				decode.Add(1)
				go func(i int) {
					defer decode.Done()
					<-cleared[i]
					t.Engine.TransferInfo(ids[i], info(2, 1))
				}(i)
			}
			if len(midAborts) > 0 && i%3 == 0 {
				t.Engine.DecodeAbort(midAborts[0], decodeEP)
				midAborts = midAborts[1:]
			}
			runtime.Gosched()
		}
		for _, id := range midAborts {
			t.Engine.DecodeAbort(id, decodeEP)
		}
	}()

	res := CensusResult{Rooms: rooms}
	phase := make([]int, rooms) // 0 opened, 1 first chunk sent, 2 both sent, 3 cleared
	index := make(map[uint64]int, rooms)
	for i, id := range ids {
		index[id] = i
	}
	var live []uint64
	var out []kv.Reply
	opened := 0
	for elapsed := time.Duration(0); (len(live) > 0 || opened < rooms) && elapsed < Grace; elapsed += time.Second {
		// Requests reach the prefill over time, so decode (which does not
		// wait) is often ahead of the sender: infos and ABORTs come first.
		for k := 0; k < openPerLoop && opened < rooms; k++ {
			t.Engine.Open(ids[opened])
			live = append(live, ids[opened])
			opened++
		}
		// One iteration is one second of fake time only once the engine has
		// caught up with it; otherwise a starved worker would look pinned.
		t.Settle(live...)
		out = t.Engine.Poll(live, out)
		next := live[:0]
		for j, id := range live {
			i, r := index[id], out[j]
			switch {
			case r.Status.Terminal():
				if r.Status == kv.StatusSuccess {
					res.Succeeded++
				} else {
					res.Failed++
				}
				t.Engine.Clear(id)
				phase[i] = 3
				close(cleared[i])
				continue
			case phase[i] == 0 && r.Status == kv.StatusWaitingForInput:
				t.Engine.Init(id, 2, 0)
				t.Engine.Send(id, []int32{1}, nil)
				phase[i] = 1
				if plans[i] == planClientAbort {
					t.Engine.Abort(id)
				}
			case phase[i] == 1:
				t.Engine.Send(id, []int32{2}, nil)
				phase[i] = 2
			}
			next = append(next, id)
		}
		live = next
		t.Clock.Advance(time.Second)
		runtime.Gosched()
	}
	res.Pinned = len(live)
	if len(live) > 0 {
		res.PinnedAt = map[kv.Status]int{}
		for _, r := range t.Engine.Poll(live, nil) {
			res.PinnedAt[r.Status]++
		}
	}
	for _, id := range live {
		close(cleared[index[id]]) // let decode's late-info goroutines end
	}
	decode.Wait()
	t.SettleBootstrap(ids...)
	res.LiveBeforeGrace = t.Live()
	t.Quiesce(nil, Grace, GraceStep)
	res.Leaked = t.Live()
	return res
}
