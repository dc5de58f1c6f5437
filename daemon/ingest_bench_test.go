package daemon

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// BenchmarkDaemonIngest measures ingest end to end: a real daemon's PULL
// socket, fed by a PUSH socket (zmqio.SendMany: one cgo call sends them all,
// so the sender costs little next to the daemon), b.N transfer infos of a
// registered decode agent, each for a new room (11 frames, 3 pages); timed
// until the engine holds b.N live rooms. batched: the peer table takes runs of
// transfer infos (zmqio.BatchSink) and hands them to the engine one message
// per directory shard (actors.Batch); perframe: one TransferInfo call and one
// engine message per info, as before. Reports msgs/s, frames/s, the
// process's CPU time per message (cpu-ns/msg: ZMQ's I/O threads and the
// sender included) and the 1-minute load average. For medians and a side-by-side ratio:
//
//	go test -run '^$' -bench DaemonIngest -benchtime 100000x -count 5 ./daemon/
//
// The new/ rows create a room per info (the decode spoke first: a room actor
// is spawned per info, which dominates); the opened/ rows send infos for rooms
// the scheduler opened before the clock starts (the hand-off into existing
// rooms), timed until the ingest decoded them all and every shard routed
// them (Engine.Stats answers after what was routed before), and then checked:
// every room waits for input (its info arrived).
func BenchmarkDaemonIngest(b *testing.B) {
	b.Run("new/batched", func(b *testing.B) { benchDaemonIngest(b, false, false) })
	b.Run("new/perframe", func(b *testing.B) { benchDaemonIngest(b, true, false) })
	b.Run("opened/batched", func(b *testing.B) { benchDaemonIngest(b, false, true) })
	b.Run("opened/perframe", func(b *testing.B) { benchDaemonIngest(b, true, true) })
}

func benchDaemonIngest(b *testing.B, perFrame, opened bool) {
	perFrameIngest = perFrame
	defer func() { perFrameIngest = false }()
	d := startDaemonWith(b, func(c *Config) {
		c.Engine = actors.Config{RoomCap: 1 << 22, PeerRoomCap: 1 << 22}
	})
	newScheduler(b, d)
	dec := newDecode(b, d)
	agent := dec.node.Agent.Name()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		if peerState(b, d, agent).State == "ready" {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("decode registration never loaded")
		}
	}
	msgs := make([][][]byte, b.N)
	ids := make([]uint64, b.N)
	frames := 0
	for i := range msgs {
		ids[i] = uint64(1<<40 + i)
		msgs[i] = dec.info(ids[i], []int32{1, 2, 3}, 0, 1)
		frames += len(msgs[i])
		if opened {
			d.eng.Open(ids[i])
		}
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	push, err := zctx.NewSocket(zmq.PUSH)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = push.Close() }()
	_ = push.SetLinger(0)
	_ = push.SetSndhwm(b.N + 1)
	if err := push.Connect(zmqio.TCPEndpoint("127.0.0.1", d.PullPort())); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	before := d.eng.Stats().LiveRooms
	d.mu.Lock()
	in := d.ingest
	d.mu.Unlock()
	infos0 := in.Stats().TransferInfos
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU()
	if err := zmqio.SendMany(push, msgs); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Microsecond) {
		if opened && in.Stats().TransferInfos-infos0 >= uint64(b.N) {
			d.eng.Stats() // every shard has routed what came before
			break
		}
		if !opened && d.eng.Stats().LiveRooms-before >= b.N {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d rooms after 60 s: %+v", d.eng.Stats().LiveRooms-before, b.N, d.eng.Stats())
		}
	}
	el, cpu := time.Since(start), processCPU()-cpu0
	b.StopTimer()
	for i, r := range d.eng.PollSync(ids, nil) {
		if r.Status != kv.StatusWaitingForInput {
			b.Fatalf("room %d: %v/%v", ids[i], r.Status, r.Reason)
		}
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
	b.ReportMetric(float64(frames)/el.Seconds(), "frames/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/msg")
	b.ReportMetric(loadAvg1(), "load1")
	if st := d.eng.Stats(); st.RefusedRoomCap+st.RefusedPeerShare != 0 {
		b.Fatalf("refused rooms: %+v", st)
	}
}

// processCPU is the CPU time (user and system) the process has used: the
// daemon's goroutines, the sender's (SendMany: one cgo call, little next to
// the daemon) and the GC. On a shared machine it moves far less with the load
// than wall time does.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func loadAvg1() float64 {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f, err := strconv.ParseFloat(strings.Fields(string(raw))[0], 64)
	if err != nil {
		return -1
	}
	return f
}
