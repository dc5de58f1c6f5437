package control

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/kv"
)

// hangLimit bounds a wait on the server: it turns a hang into a failure and
// decides nothing the tests check.
const hangLimit = 20 * time.Second

func attach(t testing.TB, ep string, o ShmOptions) *ShmClient {
	t.Helper()
	c := dial(t, ep)
	s, err := AttachShm(c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// shmUntil reads the table until room id reports want. It waits on the
// engine (every read is a memory read); the deadline only turns a hang into a
// failure.
func shmUntil(t testing.TB, s *ShmClient, id uint64, want kv.Status) kv.Reply {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rs, err := s.Poll([]uint64{id}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rs[0].Status == want {
			return rs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("room %d: %+v, want %v", id, rs[0], want)
		}
		time.Sleep(time.Millisecond)
	}
}

func info(prefix int) room.TransferInfo {
	return room.TransferInfo{Agent: "d0", From: kv.Endpoint{IP: "127.0.0.1", Port: 9000},
		DstPages: []int32{100, 101, 102}, DstAux: 1, Required: 1, PrefixLen: prefix}
}

// TestShmRoomLifecycle drives a room through the ring and reads every status
// from the table: open, decode's transfer info, init, two chunks, success,
// clear; the engine's own poll agrees with the table.
// It runs with the records handed over one call each and as a drain's batch
// (BatchEngine, as the daemon's engine takes them).
func TestShmRoomLifecycle(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) { testShmRoomLifecycle(t, batched) })
	}
}

func testShmRoomLifecycle(t *testing.T, batched bool) {
	eng := newEngine(t)
	var srvEng Engine = eng
	if batched {
		srvEng = batchedEngine{eng}
	}
	srv := startServer(t, srvEng, nil)
	s := attach(t, srv.Endpoint(), ShmOptions{})
	const id = 1<<62 + 7
	if err := s.Open(id); err != nil {
		t.Fatal(err)
	}
	shmUntil(t, s, id, kv.StatusBootstrapping)
	eng.TransferInfo(id, info(16))
	if r := shmUntil(t, s, id, kv.StatusWaitingForInput); r.PrefixLen != 16 {
		t.Fatalf("ready room: %+v", r)
	}
	if err := s.Init(id, 3, 5); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(id, []int32{7, 8}, [][]int32{{1}, nil}); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(id, []int32{9}, nil); err != nil {
		t.Fatal(err)
	}
	r := shmUntil(t, s, id, kv.StatusSuccess)
	if e := eng.PollSync([]uint64{id}, nil)[0]; e != r {
		t.Fatalf("table %+v, engine %+v", r, e)
	}
	if err := s.Clear(id); err != nil {
		t.Fatal(err)
	}
	testrig.Eventually(t, hangLimit, "the cleared room retired from the engine", func() bool { return eng.Stats().LiveRooms == 0 })
	if st := srv.ShmStats(); st.Sessions != 1 || st.Records != 5 || st.DroppedBad != 0 || st.InvalidSends != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// recEngine records what the consumer applies, and can hold it (gate).
type recEngine struct {
	realEngine
	mu    sync.Mutex
	sends map[uint64][][]int32
	ops   []string
	gate  chan struct{} // when set, Open waits for it
}

func (e *recEngine) Open(id uint64) {
	if g := e.gate; g != nil {
		<-g
	}
	e.mu.Lock()
	e.ops = append(e.ops, "open "+strconv.FormatUint(id, 10))
	e.mu.Unlock()
	e.Engine.Open(id)
}

func (e *recEngine) Send(id uint64, pages []int32, state [][]int32) {
	e.mu.Lock()
	if e.sends == nil {
		e.sends = map[uint64][][]int32{}
	}
	e.sends[id] = append(e.sends[id], pages)
	e.ops = append(e.ops, "send "+strconv.FormatUint(id, 10))
	e.mu.Unlock()
	e.Engine.Send(id, pages, state)
}

// TestShmRingWraparound pushes far more records and index words than an
// 8-record ring with a 64-word index area holds: every send arrives whole and
// in order (blobs that would straddle the end start at the wrap).
func TestShmRingWraparound(t *testing.T) {
	eng := &recEngine{realEngine: newEngine(t)}
	srv := startServer(t, eng, nil)
	s := attach(t, srv.Endpoint(), ShmOptions{RingEntries: 8, Slots: 4, IndexWords: 64})
	want := map[uint64][][]int32{}
	for r := uint64(1); r <= 200; r++ {
		if err := s.Open(r); err != nil {
			t.Fatal(err)
		}
		for c := 0; c < 3; c++ {
			pages := make([]int32, int(r+uint64(c))%29)
			for i := range pages {
				pages[i] = int32(r*1000) + int32(c*100+i)
			}
			if err := s.Send(r, pages, nil); err != nil {
				t.Fatal(err)
			}
			want[r] = append(want[r], pages)
		}
		if err := s.Clear(r); err != nil {
			t.Fatal(err)
		}
	}
	testrig.Eventually(t, hangLimit, "all 200×5 records consumed", func() bool { return srv.ShmStats().Records == 200*5 })
	eng.mu.Lock()
	defer eng.mu.Unlock()
	for r, w := range want {
		got := eng.sends[r]
		for i := range got {
			if len(got[i]) == 0 {
				got[i] = []int32{}
			}
		}
		for i := range w {
			if len(w[i]) == 0 {
				w[i] = []int32{}
			}
		}
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("room %d: sent %v, engine got %v", r, w, got)
		}
	}
	if st := srv.ShmStats(); st.DroppedBad != 0 || st.InvalidSends != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestShmRingFull: while kvxferd cannot consume (its engine call blocks), a
// full ring makes the client wait, then ErrRingFull; nothing is dropped:
// once kvxferd goes on, every accepted record is applied, in order.
func TestShmRingFull(t *testing.T) {
	eng := &recEngine{realEngine: newEngine(t), gate: make(chan struct{})}
	srv := startServer(t, eng, nil)
	s := attach(t, srv.Endpoint(), ShmOptions{RingEntries: 4, Slots: 16})
	s.FullWait = 20 * time.Millisecond
	accepted := 0
	var err error
	for r := uint64(1); r <= 16; r++ {
		if err = s.Open(r); err != nil {
			break
		}
		accepted++
	}
	// The consumer is blocked in the first record's Open: it has not released
	// any of the four the ring holds.
	if !errors.Is(err, ErrRingFull) || accepted != 4 {
		t.Fatalf("accepted %d, then %v; want 4 then ErrRingFull", accepted, err)
	}
	if st, ss := srv.ShmStats(), srv.ShmSessions(); st.FullWaits != 1 || len(ss) != 1 || ss[0].Tail != 4 || ss[0].Head != 0 || ss[0].FullWaits != 1 || ss[0].RingEntries != 4 {
		t.Fatalf("a full ring: stats %+v, sessions %+v", st, ss)
	}
	close(eng.gate)
	testrig.Eventually(t, hangLimit, "the accepted records consumed once the engine runs again", func() bool { return srv.ShmStats().Records == uint64(accepted) })
	if err := s.Open(99); err != nil {
		t.Fatalf("after the ring drained: %v", err)
	}
	testrig.Eventually(t, hangLimit, "the open after the ring drained consumed", func() bool { return srv.ShmStats().Records == uint64(accepted+1) })
	if st := srv.ShmStats(); st.FullWaits != 1 {
		t.Fatalf("a stale head is no full wait: stats %+v", st)
	}
	s.Close()
	if st := srv.ShmStats(); st.FullWaits != 1 || st.Sessions != 0 {
		t.Fatalf("an ended session's full waits are kept: stats %+v", st)
	}
	eng.mu.Lock()
	defer eng.mu.Unlock()
	want := []string{"open 1", "open 2", "open 3", "open 4", "open 99"}
	if !reflect.DeepEqual(eng.ops, want) {
		t.Fatalf("applied %v, want %v", eng.ops, want)
	}
}

// TestShmDoorbellWakeCounted: a record submitted while the consumer sleeps
// rings the doorbell, and the wake-up is counted as the client's (Wakes),
// not as a missed one.
func TestShmDoorbellWakeCounted(t *testing.T) {
	eng := newEngine(t)
	srv := startServer(t, eng, nil)
	s := attach(t, srv.Endpoint(), ShmOptions{})
	for i := uint64(1); i <= 3; i++ {
		testrig.Eventually(t, hangLimit, "the server's session asleep", func() bool { ss := srv.ShmSessions(); return len(ss) == 1 && ss[0].Sleeping })
		if err := s.Open(i); err != nil {
			t.Fatal(err)
		}
		testrig.Eventually(t, hangLimit, fmt.Sprintf("wake-up %d counted", i), func() bool { return srv.ShmStats().Wakes == i })
	}
	if st := srv.ShmStats(); st.Records != 3 || st.Sleeps < 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestShmProducerConsumerRace runs a producer, the consumer, room actors
// publishing and decode infos from another goroutine at once (run with
// -race): 1,000 rooms through a 16-record ring all end Success in the table.
func TestShmProducerConsumerRace(t *testing.T) {
	eng := newEngine(t)
	srv := startServer(t, eng, nil)
	s := attach(t, srv.Endpoint(), ShmOptions{RingEntries: 16, Slots: 64, IndexWords: 256})
	const n = 1000
	opened := make(chan uint64, n)
	var infos sync.WaitGroup
	infos.Add(1)
	go func() {
		defer infos.Done()
		for id := range opened {
			eng.TransferInfo(id, info(0))
		}
	}()
	live := map[uint64]bool{}
	next := uint64(1)
	var out []kv.Reply
	var ids []uint64
	deadline := time.Now().Add(60 * time.Second)
	for done := 0; done < n; {
		for next <= n && len(live) < 48 {
			if err := s.Open(next); err != nil {
				t.Fatal(err)
			}
			live[next] = false
			opened <- next
			next++
		}
		ids = ids[:0]
		for id := range live {
			ids = append(ids, id)
		}
		var err error
		if out, err = s.Poll(ids, out); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			switch st := out[i].Status; {
			case st == kv.StatusWaitingForInput && !live[id]:
				live[id] = true
				if err := s.Init(id, 2, 0); err != nil {
					t.Fatal(err)
				}
				if err := s.Send(id, []int32{1, 2}, nil); err != nil {
					t.Fatal(err)
				}
			case st == kv.StatusSuccess:
				if err := s.Clear(id); err != nil {
					t.Fatal(err)
				}
				delete(live, id)
				done++
			case st == kv.StatusFailed:
				t.Fatalf("room %d failed: %+v", id, out[i])
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rooms done", done, n)
		}
	}
	close(opened)
	infos.Wait()
}

// TestShmTornRead: a slot whose seq is odd (a write in progress), or changed
// between the two reads, is reported torn; concurrent writes never yield a
// mixed slot.
func TestShmTornRead(t *testing.T) {
	g := shmGeometry{entries: 8, slots: 2, words: 64}
	r := &region{mem: make([]byte, g.size()), g: g}
	r.writeSlot(1, 42, packSlotWord(7, kv.StatusSuccess, 0, true), 9)
	if v, ok := r.readSlot(1); !ok || v.Room != 42 || v.Gen != 7 || v.Status != kv.StatusSuccess || !v.Written || v.PrefixLen != 9 {
		t.Fatalf("read %+v %v", v, ok)
	}
	seq := r.u64(g.tableOff() + SlotSize + slotSeq)
	seq.Add(1) // a writer is mid-way
	if _, ok := r.readSlot(1); ok {
		t.Fatal("a slot with an odd seq read as whole")
	}
	seq.Add(1)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for v := uint64(0); !stop.Load(); v++ {
			r.writeSlot(0, v, packSlotWord(uint32(v), kv.Status(v%5), uint8(v), true), int64(v))
		}
	}()
	torn, whole := 0, 0
	for whole < 20000 {
		v, ok := r.readSlot(0)
		if !ok {
			torn++
			continue
		}
		whole++
		if uint64(v.Gen) != v.Room&0xffffffff || uint64(v.PrefixLen) != v.Room || v.Status != kv.Status(v.Room%5) {
			t.Fatalf("mixed slot %+v", v)
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d torn reads retried", torn)
}

// TestShmSlotReuseNoStale: a slot freed by clear and reused at once shows
// the new room Bootstrapping, never the old room's Success, even while
// kvxferd has consumed neither the clear nor the open; the same room opened
// again in the same slot is not shown its old status either.
func TestShmSlotReuseNoStale(t *testing.T) {
	eng := &recEngine{realEngine: newEngine(t), gate: make(chan struct{})}
	srv := startServer(t, eng, nil)
	s := attach(t, srv.Endpoint(), ShmOptions{Slots: 1})
	if err := s.Open(1); err != nil {
		t.Fatal(err)
	}
	eng.gate <- struct{}{}
	eng.TransferInfo(1, info(0))
	shmUntil(t, s, 1, kv.StatusWaitingForInput)
	s.Init(1, 1, 0)
	s.Send(1, []int32{3}, nil)
	shmUntil(t, s, 1, kv.StatusSuccess)
	// From here the consumer blocks in each open until the test lets it go.
	if err := s.Clear(1); err != nil {
		t.Fatal(err)
	}
	for _, next := range []uint64{2, 1} {
		if err := s.Open(next); err != nil {
			t.Fatal(err)
		}
		if rs, _ := s.Poll([]uint64{next}, nil); rs[0] != (kv.Reply{Status: kv.StatusBootstrapping}) {
			t.Fatalf("reused slot shows %+v for room %d", rs[0], next)
		}
		eng.gate <- struct{}{}
		shmUntil(t, s, next, kv.StatusBootstrapping)
		if rs, _ := s.Poll([]uint64{next}, nil); rs[0].Status != kv.StatusBootstrapping {
			t.Fatalf("room %d after its open: %+v", next, rs[0])
		}
		if err := s.Clear(next); err != nil {
			t.Fatal(err)
		}
	}
}

// TestShmGarbageDropsOnlyThatClient: a record that does not decode drops its
// session (its open rooms fail client_lost), and another client's session
// and rooms carry on.
func TestShmGarbageDropsOnlyThatClient(t *testing.T) {
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) { testShmGarbageDropsOnlyThatClient(t, batched) })
	}
}

func testShmGarbageDropsOnlyThatClient(t *testing.T, batched bool) {
	eng := newEngine(t)
	var srvEng Engine = eng
	if batched {
		srvEng = batchedEngine{eng}
	}
	srv := startServer(t, srvEng, nil)
	good := attach(t, srv.Endpoint(), ShmOptions{})
	bad := attach(t, srv.Endpoint(), ShmOptions{})
	if err := good.Open(1); err != nil {
		t.Fatal(err)
	}
	if err := bad.Open(2); err != nil {
		t.Fatal(err)
	}
	shmUntil(t, bad, 2, kv.StatusBootstrapping)
	testrig.Eventually(t, hangLimit, "both good records consumed", func() bool { return srv.ShmStats().Records == 2 })
	bad.put(Record{Op: 77, Room: 3})
	bad.publish()
	testrig.Eventually(t, hangLimit, "the session dropped for garbage", func() bool { return bad.Dropped() == DropGarbage })
	if r := shmUntil(t, bad, 2, kv.StatusFailed); r.Reason != kv.ReasonClientLost {
		t.Fatalf("dropped client's room: %+v", r)
	}
	if err := bad.Open(4); !errors.Is(err, ErrDropped) {
		t.Fatalf("open after drop: %v", err)
	}
	if e := eng.PollSync([]uint64{2}, nil)[0]; e.Status != kv.StatusFailed || e.Reason != kv.ReasonClientLost {
		t.Fatalf("engine's view of the lost room: %+v", e)
	}
	eng.TransferInfo(1, info(0))
	shmUntil(t, good, 1, kv.StatusWaitingForInput)
	if st := srv.ShmStats(); st.DroppedBad != 1 || st.Sessions != 1 || st.RoomsLost != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestShmClientCrash: a client process killed with rooms open is noticed
// through its pidfd: its non-terminal rooms fail client_lost (in the table
// and in the engine), every room it had is cleared, its session and
// file are gone.
func TestShmClientCrash(t *testing.T) {
	eng := newEngine(t)
	srv := startServer(t, eng, nil)
	cmd := exec.Command(os.Args[0], "-test.run=^TestShmCrashHelper$")
	cmd.Env = append(os.Environ(), "KVXFER_SHM_HELPER="+srv.Endpoint())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("helper: %q %v", line, err)
	}
	rooms := []uint64{501, 502, 503}
	testrig.Eventually(t, hangLimit, "the helper's 3 records consumed", func() bool { return srv.ShmStats().Records == 3 })
	for _, r := range rooms {
		if e := eng.PollSync([]uint64{r}, nil)[0]; e.Status != kv.StatusBootstrapping {
			t.Fatalf("room %d: %+v", r, e)
		}
	}
	if st := srv.ShmStats(); st.Sessions != 1 {
		t.Fatalf("stats %+v", st)
	}
	cmd.Process.Kill()
	cmd.Wait()
	testrig.Eventually(t, hangLimit, "the dead client's session gone", func() bool { return srv.ShmStats().Sessions == 0 })
	for _, r := range rooms {
		if e := eng.PollSync([]uint64{r}, nil)[0]; e.Status != kv.StatusFailed || e.Reason != kv.ReasonClientLost {
			t.Fatalf("room %d after its client died: %+v", r, e)
		}
	}
	testrig.Eventually(t, hangLimit, "the dead client's rooms retired", func() bool { return eng.Stats().LiveRooms == 0 })
	if st := srv.ShmStats(); st.DroppedDead != 1 || st.RoomsLost != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestShmCrashHelper is the client process of TestShmClientCrash.
func TestShmCrashHelper(t *testing.T) {
	ep := os.Getenv("KVXFER_SHM_HELPER")
	if ep == "" {
		t.Skip("helper process of TestShmClientCrash")
	}
	c, err := Dial(ep)
	if err != nil {
		t.Fatal(err)
	}
	s, err := AttachShm(c, ShmOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []uint64{501, 502, 503} {
		if err := s.Open(r); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
}

// TestShmAttachRefusals: bad sizes, a pid that does not exist.
func TestShmAttachRefusals(t *testing.T) {
	eng := newEngine(t)
	srv := startServer(t, eng, nil)
	c := dial(t, srv.Endpoint())
	for _, f := range []map[string]any{
		{}, {"pid": int64(os.Getpid()), "ring_entries": int64(3)}, {"pid": int64(os.Getpid()), "slots": int64(MaxSlots + 1)},
		{"pid": int64(os.Getpid()), "index_words": int64(1 << 30)}, {"pid": int64(1 << 30)},
	} {
		var e *Error
		if _, err := c.Call(OpShmAttach, f); !errors.As(err, &e) || e.Code != CodeBadRequest {
			t.Fatalf("shm_attach %v: %v", f, err)
		}
	}
	if _, err := c.Call(OpShmDetach, map[string]any{"session": int64(12345)}); err == nil {
		t.Fatal("detach of an unknown session succeeded")
	}
}

// TestShmSendBlobRoundTrip: the index-area encoding of pages and state.
func TestShmSendBlobRoundTrip(t *testing.T) {
	for _, c := range []struct {
		pages []int32
		state [][]int32
	}{{[]int32{}, nil}, {[]int32{1, -2, 3}, [][]int32{{4}, nil, {}}}, {nil, [][]int32{}}} {
		b := appendSendBlob(nil, c.pages, c.state)
		if len(b) != sendBlobWords(c.pages, c.state) {
			t.Fatalf("%d words, sendBlobWords says %d", len(b), sendBlobWords(c.pages, c.state))
		}
		p, s, err := decodeSendBlob(b)
		if err != nil || len(p) != len(c.pages) || len(s) != len(c.state) || (c.state == nil) != (s == nil) {
			t.Fatalf("%v %v -> %v %v %v", c.pages, c.state, p, s, err)
		}
	}
	for _, bad := range [][]int32{{}, {5, 1}, {0}, {0, -2}, {0, 1, 7}, {0, -1, 9}} {
		if _, _, err := decodeSendBlob(bad); err == nil {
			t.Fatalf("blob %v decoded", bad)
		}
	}
}

// FuzzShmRecord feeds arbitrary bytes to the record and send-blob decoders:
// they never panic, and what decodes re-encodes to the same bytes.
// fuzz-smoke: 50000x
func FuzzShmRecord(f *testing.F) {
	g := shmGeometry{entries: 8, slots: 16, words: 64}
	var b [RecordSize]byte
	putRecord(b[:], Record{Op: RecOpen, Slot: 3, Room: 9, A: 1})
	f.Add(b[:], []byte{2, 0, 0, 0, 1, 0, 0, 0, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, rec []byte, blob []byte) {
		if len(rec) >= RecordSize {
			if r, err := decodeRecord(rec[:RecordSize], g); err == nil {
				var back [RecordSize]byte
				putRecord(back[:], r)
				if string(back[:]) != string(rec[:RecordSize]) {
					t.Fatalf("record %x re-encodes to %x", rec[:RecordSize], back)
				}
			}
		}
		words := make([]int32, len(blob)/4)
		for i := range words {
			words[i] = int32(binary.LittleEndian.Uint32(blob[4*i:]))
		}
		if p, s, err := decodeSendBlob(words); err == nil {
			if back := appendSendBlob(nil, p, s); !reflect.DeepEqual(back, words) {
				t.Fatalf("blob %v re-encodes to %v", words, back)
			}
		}
		if tp, ok := decodeTraceparent(words); ok {
			if back := appendTraceparent(nil, tp); !reflect.DeepEqual(back, words) {
				t.Fatalf("traceparent words %v re-encode to %v", words, back)
			}
		}
	})
}

// FuzzShmSession writes arbitrary bytes into a live session's ring and index
// area: the server either applies the records or drops that session, and
// another client's session on the same server keeps working.
// fuzz-smoke: 3000x
func FuzzShmSession(f *testing.F) {
	eng := newEngine(f)
	srv := startServer(f, eng, nil)
	good := attach(f, srv.Endpoint(), ShmOptions{Slots: 4})
	var b [2 * RecordSize]byte
	putRecord(b[:], Record{Op: RecOpen, Slot: 1, Room: 5, A: 1})
	putRecord(b[RecordSize:], Record{Op: RecSend, Room: 5, A: 0, B: 3})
	f.Add(b[:], []byte{1, 0, 0, 0, 9, 0, 0, 0, 255, 255, 255, 255})
	f.Add([]byte("garbage garbage garbage garbage garbage"), []byte{})
	var tb [RecordSize]byte // a traced open: its traceparent at index position 0
	tw := appendTraceparent(nil, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	putRecord(tb[:], Record{Op: RecOpen, Flags: uint8(len(tw)), Slot: 2, Room: 6, A: 1})
	ti := make([]byte, 4*len(tw))
	for i, w := range tw {
		binary.LittleEndian.PutUint32(ti[4*i:], uint32(w))
	}
	f.Add(tb[:], ti)
	f.Fuzz(shmSessionFuzzer(srv, good))
}

func shmSessionFuzzer(srv *Server, good *ShmClient) func(t *testing.T, recs, index []byte) {
	next := uint64(1 << 62)
	return func(t *testing.T, recs, index []byte) {
		c := dial(t, srv.Endpoint())
		s, err := AttachShm(c, ShmOptions{RingEntries: 8, Slots: 8, IndexWords: 64})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		copy(s.r.mem[s.r.g.indexOff():s.r.g.indexOff()+4*64], index)
		n := min(len(recs)/RecordSize, 8)
		off := s.r.g.ringOff()
		copy(s.r.mem[off:off+n*RecordSize], recs[:n*RecordSize])
		s.tail = uint64(n)
		s.publish()
		testrig.Eventually(t, hangLimit, "the fuzzed records consumed or the session dropped", func() bool { return s.r.u64(hdrHead).Load() == uint64(n) || s.Dropped() != DropNone })
		next++
		if err := good.Open(next); err != nil {
			t.Fatal(err)
		}
		if r := shmUntil(t, good, next, kv.StatusBootstrapping); r.Status != kv.StatusBootstrapping || good.Dropped() != DropNone {
			t.Fatalf("the other client's room: %+v, dropped %d", r, good.Dropped())
		}
		if err := good.Clear(next); err != nil {
			t.Fatal(err)
		}
	}
}

// TestShmReopenSameRoom: a room id opened again after clear (SGLang's
// revived room) gets a fresh slot generation that shows the new open's
// status, Bootstrapping then WaitingForInput, never the old Success, and the
// room keeps publishing to it.
func TestShmReopenSameRoom(t *testing.T) {
	eng := newEngine(t)
	srv := startServer(t, eng, nil)
	s := attach(t, srv.Endpoint(), ShmOptions{Slots: 2})
	const id = 77
	for round := 0; round < 3; round++ {
		if err := s.Open(id); err != nil {
			t.Fatal(err)
		}
		if rs, _ := s.Poll([]uint64{id}, nil); rs[0].Status != kv.StatusBootstrapping {
			t.Fatalf("round %d: a reopened room shows %+v", round, rs[0])
		}
		// The decode's info must reach the engine after the clear and the
		// open (else it lands in the old incarnation): wait for the ring.
		if err := s.Barrier(); err != nil {
			t.Fatal(err)
		}
		eng.TransferInfo(id, info(round))
		if r := shmUntil(t, s, id, kv.StatusWaitingForInput); r.PrefixLen != round {
			t.Fatalf("round %d: %+v", round, r)
		}
		s.Init(id, 1, 0)
		s.Send(id, []int32{4}, nil)
		shmUntil(t, s, id, kv.StatusSuccess)
		if err := s.Clear(id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestShmBadStreams: each kind of record the consumer cannot trust drops the
// session that sent it (dropped = DropGarbage), and only that session.
func TestShmBadStreams(t *testing.T) {
	eng := newEngine(t)
	srv := startServer(t, eng, nil)
	for name, write := range map[string]func(s *ShmClient){
		"reserved bytes": func(s *ShmClient) {
			off := s.r.g.ringOff() + int(s.tail&uint64(s.r.g.entries-1))*RecordSize
			putRecord(s.r.mem[off:off+RecordSize], Record{Op: RecAbort, Room: 1})
			s.r.mem[off+2] = 1
			s.tail++
		},
		"flags on abort":          func(s *ShmClient) { s.put(Record{Op: RecAbort, Flags: 1, Room: 1}) },
		"traceparent out of step": func(s *ShmClient) { s.put(Record{Op: RecOpen, Flags: 15, Slot: 0, Room: 1, A: 1, B: 3}) },
		"traceparent beyond area": func(s *ShmClient) { s.put(Record{Op: RecOpen, Flags: 65, Slot: 0, Room: 1, A: 1}) },
		"room of 2^63":            func(s *ShmClient) { s.put(Record{Op: RecAbort, Room: 1 << 63}) },
		"slot out of range":       func(s *ShmClient) { s.put(Record{Op: RecOpen, Slot: 8, Room: 1, A: 1}) },
		"slot on abort":           func(s *ShmClient) { s.put(Record{Op: RecAbort, Slot: 1, Room: 1}) },
		"send out of step":        func(s *ShmClient) { s.put(Record{Op: RecSend, Room: 1, A: 5, B: 2}) },
		"clear of another room": func(s *ShmClient) {
			s.put(Record{Op: RecOpen, Slot: 0, Room: 1, A: 1})
			s.put(Record{Op: RecClear, Slot: 0, Room: 2})
		},
		"tail a ring ahead": func(s *ShmClient) { s.tail += uint64(s.r.g.entries) + 1 },
	} {
		t.Run(name, func(t *testing.T) {
			s := attach(t, srv.Endpoint(), ShmOptions{RingEntries: 8, Slots: 8, IndexWords: 64})
			write(s)
			s.publish()
			testrig.Eventually(t, hangLimit, "the session dropped for garbage", func() bool { return s.Dropped() == DropGarbage })
		})
	}
	if st := srv.ShmStats(); st.DroppedBad != 10 {
		t.Fatalf("stats %+v", st)
	}
}

// TestShmSessionCap: a server holds at most MaxShmSessions sessions; a
// detach makes room for another.
func TestShmSessionCap(t *testing.T) {
	eng := newEngine(t)
	srv := startServer(t, eng, nil)
	c := dial(t, srv.Endpoint())
	small := ShmOptions{RingEntries: 8, Slots: 1, IndexWords: 64}
	var all []*ShmClient
	for range MaxShmSessions {
		s, err := AttachShm(c, small)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, s)
	}
	var e *Error
	if _, err := AttachShm(c, small); !errors.As(err, &e) || e.Code != CodeBusy {
		t.Fatalf("attach beyond the cap: %v", err)
	}
	if err := all[0].Close(); err != nil {
		t.Fatal(err)
	}
	s, err := AttachShm(c, small)
	if err != nil {
		t.Fatalf("attach after a detach: %v", err)
	}
	all = append(all[1:], s)
	for _, s := range all {
		s.Close()
	}
	if st := srv.ShmStats(); st.Sessions != 0 || st.Attached != MaxShmSessions+1 {
		t.Fatalf("stats %+v", st)
	}
	// The bytes cap: the largest regions run into it before the count does.
	big := ShmOptions{RingEntries: MaxRingEntries, Slots: MaxSlots, IndexWords: MaxIndexWords}
	var held []*ShmClient
	defer func() {
		for _, s := range held {
			s.Close()
		}
	}()
	for i := 0; ; i++ {
		s, err := AttachShm(c, big)
		if err != nil {
			if !errors.As(err, &e) || e.Code != CodeBusy || i*(MaxRingEntries*RecordSize+MaxIndexWords*4+MaxSlots*SlotSize) > MaxShmBytes {
				t.Fatalf("attach %d of the largest: %v", i, err)
			}
			break
		}
		held = append(held, s)
	}
}

// TestShmSafetyWake: a record published without ringing the doorbell while
// kvxferd sleeps (a lost wake-up) is still consumed, by the sleep's safety
// timeout, and counted as a missed wake.
func TestShmSafetyWake(t *testing.T) {
	eng := newEngine(t)
	srv := startServer(t, eng, nil)
	s := attach(t, srv.Endpoint(), ShmOptions{RingEntries: 8, Slots: 2, IndexWords: 64})
	// Wait for a sleep that begins after now (its 100 ms have just started),
	// then publish without the doorbell.
	k := srv.ShmStats().Sleeps
	for srv.ShmStats().Sleeps == k || s.r.u32(hdrSleeping).Load() != 1 {
		runtime.Gosched()
	}
	s.put(Record{Op: RecOpen, Slot: 0, Room: 9, A: 1})
	s.r.u64(hdrTail).Store(s.tail) // no doorbell
	testrig.Eventually(t, hangLimit, "the record without a doorbell consumed", func() bool { return srv.ShmStats().Records == 1 })
	if st := srv.ShmStats(); st.MissedWakes != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestShmNextSpin pins the consumer's spin window policy: a doorbell that
// ended a sleep less than the session's most after the ring went empty grows
// the window to twice that gap (at most most, never shrinking it); a gap of
// 4 × most or more sets it back to shmSpin; a gap in between keeps it; a most
// of shmSpin or less never grows it.
func TestShmNextSpin(t *testing.T) {
	us := time.Microsecond
	for _, c := range []struct{ spin, idle, most, want time.Duration }{
		{shmSpin, 100 * us, shmSpinMax, 200 * us},
		{shmSpin, 10 * us, shmSpinMax, shmSpin}, // twice the gap is below the window: kept
		{200 * us, 600 * us, shmSpinMax, shmSpinMax},
		{800 * us, 100 * us, shmSpinMax, 800 * us}, // a short gap never shrinks it
		{shmSpinMax, 999 * us, shmSpinMax, shmSpinMax},
		{shmSpinMax, shmSpinMax, shmSpinMax, shmSpinMax}, // ambiguous: kept
		{shmSpin, 3 * shmSpinMax, shmSpinMax, shmSpin},
		{shmSpinMax, 4*shmSpinMax - 1, shmSpinMax, shmSpinMax},
		{shmSpinMax, 4 * shmSpinMax, shmSpinMax, shmSpin},
		{400 * us, time.Second, shmSpinMax, shmSpin},
		{shmSpin, 3 * time.Millisecond, 10 * time.Millisecond, 6 * time.Millisecond}, // a session's own most
		{6 * time.Millisecond, 20 * time.Millisecond, 10 * time.Millisecond, 6 * time.Millisecond},
		{6 * time.Millisecond, 40 * time.Millisecond, 10 * time.Millisecond, shmSpin},
		{shmSpin, 10 * us, shmSpin, shmSpin}, // spin_max_us 50: never grows
		{shmSpin, 10 * us, 0, shmSpin},
	} {
		if got := nextSpin(c.spin, c.idle, c.most); got != c.want {
			t.Errorf("nextSpin(%v, %v, %v) = %v, want %v", c.spin, c.idle, c.most, got, c.want)
		}
	}
}

// TestShmAttachSpinMax: shm_attach takes spin_max_us in 0..MaxShmSpin and
// answers the window's most it will use (the default without the field);
// outside the range it is bad_request and nothing is attached.
func TestShmAttachSpinMax(t *testing.T) {
	eng := newEngine(t)
	srv := startServer(t, eng, nil)
	c := dial(t, srv.Endpoint())
	for _, tc := range []struct {
		fields map[string]any
		want   int64 // answered spin_max_us; -1: bad_request
	}{
		{map[string]any{}, shmSpinMax.Microseconds()},
		{map[string]any{"spin_max_us": int64(0)}, 0},
		{map[string]any{"spin_max_us": int64(250)}, 250},
		{map[string]any{"spin_max_us": MaxShmSpin.Microseconds()}, MaxShmSpin.Microseconds()},
		{map[string]any{"spin_max_us": MaxShmSpin.Microseconds() + 1}, -1},
		{map[string]any{"spin_max_us": int64(-1)}, -1},
	} {
		tc.fields["pid"] = int64(os.Getpid())
		res, err := c.Call(OpShmAttach, tc.fields)
		if tc.want < 0 {
			var e *Error
			if !errors.As(err, &e) || e.Code != CodeBadRequest || srv.ShmStats().Sessions != 0 {
				t.Fatalf("%v: %v, %v, %+v", tc.fields, res, err, srv.ShmStats())
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.fields, err)
		}
		m := res.(map[string]any)
		if got, _ := m["spin_max_us"].(int64); got != tc.want {
			t.Fatalf("%v: spin_max_us %v, want %d", tc.fields, m["spin_max_us"], tc.want)
		}
		if _, err := c.Call(OpShmDetach, map[string]any{"session": m["session"]}); err != nil {
			t.Fatal(err)
		}
		os.Remove(m["path"].(string))
	}
	// The Go client sends ShmOptions.SpinMax.
	s, err := AttachShm(c, ShmOptions{SpinMax: 300 * time.Microsecond, Slots: 4, RingEntries: 8, IndexWords: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv.shm.mu.Lock()
	got := srv.shm.sessions[s.Session()].spinMax
	srv.shm.mu.Unlock()
	if got != 300*time.Microsecond {
		t.Fatalf("session's most %v", got)
	}
}

// TestShmSpinInProcessClient: a client in kvxferd's own process keeps the
// shortest spin window whatever its doorbells' timing (a consumer spinning
// on takes the Ps that client and the engine run on), and /debug/shm's
// spin_us says so. Here the doorbell comes right after the consumer went to
// sleep, which would grow the window of a client in another process.
func TestShmSpinInProcessClient(t *testing.T) {
	eng := newEngine(t)
	srv := startServer(t, eng, nil)
	s := attach(t, srv.Endpoint(), ShmOptions{RingEntries: 8, Slots: 4, IndexWords: 64})
	for i := uint64(1); i <= 3; i++ {
		st := srv.ShmStats()
		for srv.ShmStats().Sleeps == st.Sleeps || s.r.u32(hdrSleeping).Load() != 1 {
			runtime.Gosched()
		}
		if err := s.Open(i); err != nil { // rings the doorbell
			t.Fatal(err)
		}
		for srv.ShmStats().Records == st.Records {
			runtime.Gosched()
		}
	}
	st := srv.ShmStats()
	ss := srv.ShmSessions()
	if st.Wakes < 3 || len(ss) != 1 || ss[0].SpinMicros != shmSpin.Microseconds() {
		t.Fatalf("stats %+v sessions %+v", st, ss)
	}
}

// batchedEngine is realEngine taking a drain's records as one batch, as the
// daemon's engine does.
type batchedEngine struct{ realEngine }

func (e batchedEngine) NewRecordBatch() RecordBatch { return e.Engine.NewBatch() }

// batchStub is a BatchEngine over stubEngine: its batch logs each operation
// and each flush in the stub's log, so the order of both is checked.
type batchStub struct{ *stubEngine }

func (e batchStub) OpenTraced(r uint64, tp string) { e.log("open %d traced %s", r, tp) }

func (e batchStub) NewRecordBatch() RecordBatch { return stubBatch{e.stubEngine} }

func (batchStub) SetStatusSink(StatusSink) {} // rooms publish nothing: never terminal

type stubBatch struct{ e *stubEngine }

func (b stubBatch) Open(r uint64)                         { b.e.log("batch open %d", r) }
func (b stubBatch) OpenTraced(r uint64, tp string)        { b.e.log("batch open %d traced %s", r, tp) }
func (b stubBatch) Init(r uint64, n, a int)               { b.e.log("batch init %d %d %d", r, n, a) }
func (b stubBatch) Send(r uint64, p []int32, _ [][]int32) { b.e.log("batch send %d %d", r, len(p)) }
func (b stubBatch) Abort(r uint64)                        { b.e.log("batch abort %d", r) }
func (b stubBatch) Fail(r uint64, why kv.Reason)          { b.e.log("batch fail %d %v", r, why) }
func (b stubBatch) Clear(r uint64)                        { b.e.log("batch clear %d", r) }
func (b stubBatch) Flush()                                { b.e.log("flush") }

// TestShmBatchEngine: records published together are drained together and
// reach a BatchEngine through its batch, flushed once at the end of the drain
// (before the opens are polled); a session dropped for a bad record in the
// middle of a drain still flushes the records before it, then its teardown's
// clears, in that order. Nothing goes to the engine directly.
func TestShmBatchEngine(t *testing.T) {
	stub := newStub()
	srv := startServer(t, batchStub{stub}, nil)
	s := attach(t, srv.Endpoint(), ShmOptions{})
	s.put(Record{Op: RecOpen, Slot: 0, Room: 11, A: 1})
	s.put(Record{Op: RecOpen, Slot: 1, Room: 12, A: 1})
	s.put(Record{Op: RecInit, Room: 11, A: 4, B: 2})
	s.publish()
	testrig.Eventually(t, hangLimit, "3 records consumed", func() bool { return srv.ShmStats().Records == 3 })
	want := []string{"batch open 11", "batch open 12", "batch init 11 4 2", "flush"}
	if got := stub.callLog(); !reflect.DeepEqual(got, want) {
		t.Fatalf("one drain: calls %q, want %q", got, want)
	}
	s.put(Record{Op: RecAbort, Room: 12})
	s.put(Record{Op: 77, Room: 13})
	s.publish()
	testrig.Eventually(t, hangLimit, "the session dropped for garbage", func() bool { return s.Dropped() == DropGarbage })
	got := stub.callLog()[len(want):]
	want = []string{"batch abort 12", "batch clear 11", "batch clear 12", "flush"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("drain ended by a bad record: calls %q, want %q", got, want)
	}
}
