package actors

import (
	"context"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

func benchEngine(b *testing.B) *Engine {
	eng, err := New(Config{Clock: clock.NewFake(time.Unix(0, 0)), Transfers: &transfersDouble{}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = eng.Close(ctx)
	})
	return eng
}

// BenchmarkRoomLifecycle drives whole rooms through the actors: Open, a
// transfer info, Init, two chunks (writes complete at once), Clear. It reports
// room messages per second through directory and room mailboxes.
func BenchmarkRoomLifecycle(b *testing.B) {
	eng := benchEngine(b)
	const batch = 1000
	ids := make([]uint64, batch)
	ti := room.TransferInfo{Agent: "a", DstPages: []int32{1, 2, 3, 4}, Required: 1}
	p1, p2 := []int32{1, 2}, []int32{3, 4}
	next := uint64(1)
	msgs := 0
	b.ResetTimer()
	for done := 0; done < b.N; done += batch {
		for i := range ids {
			ids[i] = next
			next++
			eng.Open(ids[i])
			eng.TransferInfo(ids[i], ti)
			eng.Init(ids[i], 4, 0)
			eng.Send(ids[i], p1, nil)
			eng.Send(ids[i], p2, nil)
		}
		for {
			all := true
			for _, r := range eng.Poll(ids, nil) {
				all = all && r.Status == kv.StatusSuccess
			}
			if all {
				break
			}
		}
		for _, id := range ids {
			eng.Clear(id)
		}
		msgs += batch * 8 // 6 sent + 2 completions per room, polls not counted
	}
	b.ReportMetric(float64(msgs)/b.Elapsed().Seconds(), "room-msgs/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/room")
}

// BenchmarkPoll1000 is the latency of one batched poll of 1,000 live rooms.
func BenchmarkPoll1000(b *testing.B) {
	eng := benchEngine(b)
	ids := make([]uint64, 1000)
	for i := range ids {
		ids[i] = uint64(i + 1)
		eng.Open(ids[i])
	}
	out := eng.Poll(ids, nil)
	b.ResetTimer()
	for b.Loop() {
		out = eng.Poll(ids, out)
	}
}

// BenchmarkBytesPerLiveRoom measures the heap held per live, opened room with
// one transfer info (waiting for the scheduler), actor included. Each
// iteration adds one room, so -benchtime=20000x measures 20,000 rooms.
func BenchmarkBytesPerLiveRoom(b *testing.B) {
	eng := benchEngine(b)
	ti := room.TransferInfo{Agent: "a", DstPages: make([]int32, 16), Required: 1}
	ids := make([]uint64, b.N)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for i := range ids {
		ids[i] = uint64(i + 1)
		eng.Open(ids[i])
		eng.TransferInfo(ids[i], ti)
	}
	eng.Poll(ids, nil)
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "B/room")
	runtime.KeepAlive(ids)
}

// BenchmarkNewRoomsBatched is the ingest's new-room path without the socket:
// b.N transfer infos for rooms nobody named yet, handed over in Batches of
// 256 (as the ZMQ ingest does), timed until every shard created its rooms
// (Stats answers after what was routed before). Each info spawns a room
// actor, which arms its bootstrap deadline. Real clock, as in the daemon.
func BenchmarkNewRoomsBatched(b *testing.B) {
	eng, err := New(Config{Transfers: &transfersDouble{}, RoomCap: 1 << 24, PeerRoomCap: 1 << 24})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_ = eng.Close(ctx)
	})
	tis := make([]room.TransferInfo, b.N)
	for i := range tis {
		tis[i] = room.TransferInfo{Agent: "decode-0", DstPages: []int32{1, 2, 3}, Required: 1}
	}
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	bt := eng.NewBatch()
	for i := range tis {
		bt.TransferInfo(uint64(1<<40+i), tis[i])
		if i%256 == 255 {
			bt.Flush()
		}
	}
	bt.Flush()
	if st := eng.Stats(); st.LiveRooms != b.N {
		b.Fatalf("live rooms %d, want %d: %+v", st.LiveRooms, b.N, st)
	}
	cpu := processCPU() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rooms/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/room")
}

// processCPU is the CPU time (user and system) the process has used, every
// goroutine and the GC included: on a shared machine it moves far less with
// the load than wall time does.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRetirePastIdleCap opens 3 × idleCap rooms in one shard and clears
// them, so that most retired rooms' actors are stopped, not kept: each
// Terminated must find its actor without a scan of the shard's rooms or idle
// actors (that scan made 20,000 retirements take 6 s).
func BenchmarkRetirePastIdleCap(b *testing.B) {
	eng, err := New(Config{Clock: clock.NewFake(time.Unix(0, 0)), Transfers: &transfersDouble{}, Shards: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = eng.Close(context.Background()) })
	ids := make([]uint64, 3*idleCap(1))
	next := uint64(1)
	for b.Loop() {
		for i := range ids {
			ids[i] = next
			next++
			eng.Open(ids[i])
		}
		for _, id := range ids {
			eng.Clear(id)
		}
		eng.PollSync(ids, nil)
		for deadline := time.Now().Add(time.Minute); len(roomActorPIDs(eng)) > idleCap(1); {
			if time.Now().After(deadline) {
				b.Fatalf("room actors still %d", len(roomActorPIDs(eng)))
			}
			time.Sleep(time.Millisecond)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ids)), "ns/room")
}
