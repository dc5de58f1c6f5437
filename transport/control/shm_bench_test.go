package control

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// stormPath is what the storm's scheduler loop drives: the shared-memory
// ring and table, or request/reply with one batched poll per iteration.
type stormPath interface {
	open(id uint64) error
	init(id uint64) error
	send(id uint64, pages []int32) error
	abort(id uint64) error
	clear(id uint64) error
	poll(ids []uint64, out []kv.Reply) ([]kv.Reply, error)
}

type shmStorm struct{ s *ShmClient }

func (p shmStorm) open(id uint64) error             { return p.s.Open(id) }
func (p shmStorm) init(id uint64) error             { return p.s.Init(id, 4, 0) }
func (p shmStorm) send(id uint64, pg []int32) error { return p.s.Send(id, pg, nil) }
func (p shmStorm) abort(id uint64) error            { return p.s.Abort(id) }
func (p shmStorm) clear(id uint64) error            { return p.s.Clear(id) }
func (p shmStorm) poll(ids []uint64, out []kv.Reply) ([]kv.Reply, error) {
	return p.s.Poll(ids, out)
}

type rrStorm struct{ c *Client }

func (p rrStorm) open(id uint64) error {
	_, err := p.c.Open(id, "")
	return err
}
func (p rrStorm) init(id uint64) error             { return p.c.Init(id, 4, 0) }
func (p rrStorm) send(id uint64, pg []int32) error { return p.c.Send(id, pg, nil) }
func (p rrStorm) abort(id uint64) error            { return p.c.Abort(id) }
func (p rrStorm) clear(id uint64) error            { return p.c.Clear(id) }
func (p rrStorm) poll(ids []uint64, out []kv.Reply) ([]kv.Reply, error) {
	return p.c.Poll(ids, out)
}

// BenchmarkAbortStorm is the abort storm as the scheduler sees it, over
// each path of one server in the same run: 256 rooms in flight, decode's
// transfer info arriving as each room opens, half the rooms aborted by the
// scheduler at a random phase (right after open, after init, after the
// first of two chunks). Reported: abort-to-terminal (the abort call to the
// first poll that shows the room terminal) p50/p99, time-to-terminal p50,
// rooms/s, and for shm the consumer's doorbell sleeps per room. A benchmark,
// not a test: nothing here asserts a time.
//
// closed: 256 rooms in flight, admitted as fast as they end (saturation:
// the figures are queueing in the engine); open: 1,500 rooms/s offered
// (the bench suite's open-loop rate), up to 1,024 in flight.
//
// shm and reqrep run the server in this process, beside the scheduler's
// loop; shm-proc runs it in a child process (this binary again, see
// TestMain), as kvxferd runs beside a scheduler: the two share the cores,
// not the Go runtime, its threads or their scheduling attributes. There the
// child delivers decode's transfer info as it applies each open.
func BenchmarkAbortStorm(b *testing.B) {
	for _, load := range []struct {
		name string
		rate float64
	}{{"closed", 0}, {"open1500", 1500}} {
		for _, name := range []string{"shm", "reqrep", "shm-proc"} {
			b.Run(load.name+"/"+name, func(b *testing.B) { abortStorm(b, name, load.rate) })
		}
	}
}

func abortStorm(b *testing.B, name string, rate float64) {
	{
		{
			var srv *Server
			var c *Client
			info := func(uint64, room.TransferInfo) {} // shm-proc: the daemon delivers it
			daemon := 0
			if name == "shm-proc" {
				var ep string
				ep, daemon = stormDaemon(b)
				c = dial(b, ep)
			} else {
				eng := newEngine(b)
				srv = startServer(b, eng, nil)
				c = dial(b, srv.Endpoint())
				info = eng.TransferInfo
			}
			var p stormPath = rrStorm{c}
			if name != "reqrep" {
				s, err := AttachShm(c, ShmOptions{Slots: 1024})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				p = shmStorm{s}
			}
			var a2t, ttt []time.Duration
			rooms, wall := 0, time.Duration(0)
			next := uint64(1)
			var sleeps uint64
			if srv != nil {
				sleeps = srv.ShmStats().Sleeps
			}
			cpu0 := procCPU(daemon)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				a, t, n := runStorm(b, p, info, &next, 4000, rate)
				wall += time.Since(start)
				a2t, ttt, rooms = append(a2t, a...), append(ttt, t...), rooms+n
			}
			b.StopTimer()
			slices.Sort(a2t)
			slices.Sort(ttt)
			q := func(d []time.Duration, f float64) float64 {
				return float64(d[min(len(d)-1, int(float64(len(d))*f))]) / 1e6
			}
			b.ReportMetric(q(a2t, 0.5), "a2t-p50-ms")
			b.ReportMetric(q(a2t, 0.99), "a2t-p99-ms")
			b.ReportMetric(q(ttt, 0.5), "ttt-p50-ms")
			b.ReportMetric(float64(rooms)/wall.Seconds(), "rooms/s")
			if daemon != 0 {
				// kvxferd's CPU (all its threads) per room, spinning included.
				b.ReportMetric(float64((procCPU(daemon)-cpu0).Microseconds())/float64(rooms), "daemon-cpu-us/room")
			}
			if srv != nil && name == "shm" {
				// How often the consumer slept on its doorbell: each sleep's
				// wake-up waits for a core (see nextSpin).
				b.ReportMetric(float64(srv.ShmStats().Sleeps-sleeps)/float64(rooms), "sleeps/room")
			}
		}
	}
}

// stormInfo is the transfer info decode sends for every storm room.
var stormInfo = room.TransferInfo{Agent: "d0", From: kv.Endpoint{IP: "127.0.0.1", Port: 9000},
	DstPages: []int32{1, 2, 3, 4}, DstAux: 1, Required: 1}

// stormEngine is the shm-proc daemon's engine: decode's transfer info
// arrives as the scheduler's open is applied.
type stormEngine struct{ realEngine }

func (e stormEngine) Open(id uint64) {
	e.Engine.Open(id)
	e.Engine.TransferInfo(id, stormInfo)
}

// stormDaemonEnv names the endpoint a child process of this test binary
// serves as the abort storm's kvxferd (TestMain).
const stormDaemonEnv = "KVXFER_TEST_STORM_DAEMON"

func TestMain(m *testing.M) {
	if ep := os.Getenv(stormDaemonEnv); ep != "" {
		os.Exit(runStormDaemon(ep))
	}
	os.Exit(m.Run())
}

// runStormDaemon serves ep with a fresh engine (newEngine's) until its stdin
// closes.
func runStormDaemon(ep string) int {
	eng, err := actors.New(actors.Config{Transfers: instantTransfers{}, Clock: clock.NewFake(time.Unix(0, 0)), Shards: 4})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	srv, err := Start(Config{Endpoint: ep, Engine: stormEngine{realEngine{eng}}, PollInterval: 5 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer srv.Stop()
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// stormDaemon starts the child process and returns its endpoint and pid; it
// ends with the benchmark.
func stormDaemon(b *testing.B) (string, int) {
	ep := ipcEndpoint(b)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), stormDaemonEnv+"="+ep)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		b.Fatalf("storm daemon: %q, %v", line, err)
	}
	return ep, cmd.Process.Pid
}

// procCPU is the user and system CPU process pid has used (/proc; 10 ms
// ticks), 0 for pid 0.
func procCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis: state is 3rd, utime 14th, stime 15th.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

type stormRoom struct {
	id      uint64
	phase   int // 0 opened, 1 inited and sent
	abortAt int // -1: never; 0 after open; 1 after init; 2 after the first chunk
	opened  time.Time
	aborted time.Time
}

func runStorm(b *testing.B, p stormPath, info func(uint64, room.TransferInfo), next *uint64, total int, rate float64) (a2t, ttt []time.Duration, n int) {
	inflight := 256
	if rate > 0 {
		inflight = 1024
	}
	t0 := time.Now()
	rng := rand.New(rand.NewSource(int64(*next)))
	var live []*stormRoom
	var ids []uint64
	var out []kv.Reply
	admitted := 0
	abort := func(r *stormRoom) {
		r.aborted = time.Now()
		if err := p.abort(r.id); err != nil {
			b.Fatal(err)
		}
	}
	for admitted < total || len(live) > 0 {
		for admitted < total && len(live) < inflight {
			if rate > 0 && time.Since(t0).Seconds()*rate < float64(admitted) {
				break
			}
			r := &stormRoom{id: *next, abortAt: -1, opened: time.Now()}
			*next++
			admitted++
			if rng.Intn(2) == 0 {
				r.abortAt = rng.Intn(3)
			}
			if err := p.open(r.id); err != nil {
				b.Fatal(err)
			}
			info(r.id, stormInfo)
			if r.abortAt == 0 {
				abort(r)
			}
			live = append(live, r)
		}
		ids = ids[:0]
		for _, r := range live {
			ids = append(ids, r.id)
		}
		var err error
		if out, err = p.poll(ids, out); err != nil {
			b.Fatal(err)
		}
		kept := live[:0]
		for i, r := range live {
			st := out[i].Status
			switch {
			case st.Terminal():
				now := time.Now()
				if !r.aborted.IsZero() {
					a2t = append(a2t, now.Sub(r.aborted))
				}
				ttt = append(ttt, now.Sub(r.opened))
				if err := p.clear(r.id); err != nil {
					b.Fatal(err)
				}
				n++
				continue
			case st == kv.StatusWaitingForInput && r.phase == 0:
				r.phase = 1
				if err := p.init(r.id); err != nil {
					b.Fatal(err)
				}
				if r.abortAt == 1 {
					abort(r)
					break
				}
				if err := p.send(r.id, []int32{5, 6}); err != nil {
					b.Fatal(err)
				}
				if r.abortAt == 2 {
					abort(r)
					break
				}
				if err := p.send(r.id, []int32{7, 8}); err != nil {
					b.Fatal(err)
				}
			}
			kept = append(kept, r)
		}
		live = kept
		runtime.Gosched() // the scheduler's thread spins; it does not sleep between passes
	}
	return a2t, ttt, n
}
