package suite

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/bench"
	"github.com/kvxfer/kvxfer/bench/stats"
	"github.com/kvxfer/kvxfer/bench/workload"
	"github.com/kvxfer/kvxfer/kv"
)

// openRooms opens n rooms with one decode agent's transfer info each (four
// pages), the state of a request waiting for prefill compute, and returns
// their ids once the engine has handled every message.
func openRooms(rig *workload.Rig, n int) []uint64 {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(1_000_000 + i)
		rig.Engine.Open(ids[i])
		rig.Engine.TransferInfo(ids[i], room.TransferInfo{Agent: "decode-0", DstPages: []int32{1, 2, 3, 4}, DstAux: i % 64, Required: 1})
	}
	rig.Settle()
	for _, r := range rig.Engine.Poll(ids, nil) {
		if r.Status != kv.StatusWaitingForInput {
			panic(fmt.Sprintf("suite: an opened room polls %v", r.Status))
		}
	}
	return ids
}

// memory measures the heap and resident set one live room costs in engine k
// with n rooms open, over the instant transfer layer (no write is pending).
// The engine is started before the baseline, so its fixed cost is left out.
func memory(k bench.Kind, n int) (MemoryUsage, error) {
	rig, err := workload.NewRig(k, workload.Instant{})
	if err != nil {
		return MemoryUsage{}, err
	}
	var before, after runtime.MemStats
	runtime.GC()
	debug.FreeOSMemory()
	runtime.ReadMemStats(&before)
	rss0 := workload.RSS()
	ids := openRooms(rig, n)
	runtime.GC()
	runtime.ReadMemStats(&after)
	rss1 := workload.RSS()
	u := MemoryUsage{Engine: string(k),
		HeapPerRoom: float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n),
		RSSPerRoom:  float64(rss1-rss0) / float64(n),
		Objects:     float64(int64(after.HeapObjects)-int64(before.HeapObjects)) / float64(n),
	}
	runtime.KeepAlive(ids)
	return u, rig.Close()
}

// pollLatency times rounds batched polls of n live rooms (at most about
// five seconds of them).
func pollLatency(k bench.Kind, n, rounds int) (PollResult, error) {
	rig, err := workload.NewRig(k, workload.Instant{})
	if err != nil {
		return PollResult{}, err
	}
	ids := openRooms(rig, n)
	out := rig.Engine.Poll(ids, nil)
	var ds []time.Duration
	end := time.Now().Add(5 * time.Second)
	for i := 0; i < rounds && (i < 5 || time.Now().Before(end)); i++ {
		t := time.Now()
		out = rig.Engine.Poll(ids, out)
		ds = append(ds, time.Since(t))
	}
	s := stats.Sorted(ds, 0)
	p := PollResult{Engine: string(k), Rooms: n, Rounds: len(ds), P50: stats.Percentile(s, 0.5), P99: stats.Percentile(s, 0.99)}
	p.PerRoom = p.P50 / time.Duration(n)
	return p, rig.Close()
}

// races runs the seeds' race scenarios (bench.Races) on every engine each
// names and records what each engine did.
func races() []RaceRow {
	var rows []RaceRow
	for _, s := range bench.Races() {
		for _, k := range s.Kinds {
			row := RaceRow{Scenario: s.Name, Spec: s.Spec, Engine: string(k)}
			o, err := s.RunOn(k)
			if err != nil {
				row.Error = err.Error()
			} else {
				row.Final = o.Final.Status.String()
				if o.Final.Reason != kv.ReasonNone {
					row.Final += "/" + o.Final.Reason.String()
				}
				row.Pinned, row.Leaked, row.LateWrites = o.Pinned, o.Leaked, o.LateWrites
				row.PostsAfterAbort, row.Notices = o.PostsAfterAbort, len(o.Notices)
				if cerr := s.Check(o); cerr != nil {
					row.Error = cerr.Error()
				} else {
					row.CheckOK = true
				}
			}
			rows = append(rows, row)
		}
	}
	return rows
}
