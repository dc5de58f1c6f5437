package control

import (
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/kv"
)

// pollLog is a stub engine that also logs polls ("poll <first room> x<n>").
type pollLog struct{ *stubEngine }

func (e pollLog) Poll(rooms []uint64, out []kv.Reply) []kv.Reply {
	if len(rooms) > 0 {
		e.log("poll %d x%d", rooms[0], len(rooms))
	}
	return e.stubEngine.Poll(rooms, out)
}

type sent struct {
	client string
	reply  map[string]any
}

// fairServer is a Server without a socket: the test feeds it messages and
// runs its turns, so every interleaving is the test's choice.
func fairServer(t *testing.T, eng Engine, slice int) (*Server, *[]sent) {
	s := &Server{cfg: Config{Engine: eng, Slice: slice, MaxMessage: 1 << 20}, log: slog.New(slog.DiscardHandler),
		clients: map[string]*client{}}
	var out []sent
	s.sendMsg = func(parts []any) error {
		v, err := decodeValue(parts[len(parts)-1].([]byte))
		if err != nil {
			t.Fatalf("reply is not msgpack: %v", err)
		}
		out = append(out, sent{client: string(parts[0].([]byte)), reply: v.(map[string]any)})
		return nil
	}
	return s, &out
}

func (s *Server) enqueueReq(t *testing.T, client string, req map[string]any) {
	t.Helper()
	s.enqueue([][]byte{[]byte(client), {}, enc(t, req)})
}

func roomRange(from, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = uint64(from + i)
	}
	return out
}

// A big poll is served in slices, and another client's requests are served
// between them, in that client's order; the big poll's reply is whole and in
// request order.
func TestFairBigPollSlicedAroundOtherClients(t *testing.T) {
	stub := newStub()
	for r := uint64(1); r <= 20; r++ {
		stub.replies[r] = kv.Reply{Status: kv.Status(r % 5), PrefixLen: int(r)}
	}
	s, replies := fairServer(t, pollLog{stub}, 4)
	s.enqueueReq(t, "A", map[string]any{"id": 1, "op": "poll", "rooms": roomRange(1, 20)})
	s.turn()
	s.enqueueReq(t, "B", map[string]any{"id": 7, "op": "poll", "rooms": roomRange(100, 1)})
	s.enqueueReq(t, "B", map[string]any{"id": 8, "op": "open", "room": 101})
	for s.queued > 0 {
		s.turn()
	}
	want := []string{"poll 1 x4", "poll 5 x4", "poll 100 x1", "poll 9 x4", "open 101", "poll 13 x4", "poll 17 x4"}
	if got := stub.callLog(); !reflect.DeepEqual(got, want) {
		t.Fatalf("engine calls\n%q\nwant\n%q", got, want)
	}
	var order []string
	for _, r := range *replies {
		order = append(order, fmt.Sprintf("%s/%v", r.client, r.reply["id"]))
	}
	if !reflect.DeepEqual(order, []string{"B/7", "B/8", "A/1"}) {
		t.Fatalf("replies in order %v", order)
	}
	res := (*replies)[2].reply["result"].(map[string]any)
	st, pl := res["status"].([]any), res["prefix_len"].([]any)
	if len(st) != 20 {
		t.Fatalf("big poll answered %d rooms", len(st))
	}
	for i := range st {
		r := uint64(i + 1)
		if fmt.Sprint(st[i]) != fmt.Sprint(r%5) || fmt.Sprint(pl[i]) != fmt.Sprint(r) {
			t.Fatalf("room %d: status %v prefix %v", r, st[i], pl[i])
		}
	}
}

// Sliced service answers exactly what serving at once answers, and drives the
// engine with the same calls in the same order: a batch with big and small
// sub-requests, failure with clear, abort and clear, and errors.
func TestFairSlicedEqualsWhole(t *testing.T) {
	reqs := []map[string]any{
		{"id": 1, "op": "batch", "reqs": []any{
			map[string]any{"op": "poll", "rooms": roomRange(1, 11)},
			map[string]any{"op": "open", "room": 50},
			map[string]any{"op": "failure", "rooms": roomRange(3, 9), "clear": true},
			map[string]any{"op": "abort", "rooms": roomRange(20, 6)},
			map[string]any{"op": "bogus"},
			map[string]any{"op": "poll", "rooms": []any{uint64(1 << 63)}},
			map[string]any{"op": "pop_decode_prefix_len", "rooms": roomRange(1, 5)},
		}},
		{"id": 2, "op": "clear", "rooms": roomRange(30, 10)},
		{"id": 3, "op": "failure", "rooms": roomRange(1, 7)},
		{"op": "poll", "rooms": roomRange(1, 7)}, // no id
	}
	run := func(slice int) ([]string, []sent) {
		stub := newStub()
		for r := uint64(1); r <= 11; r++ {
			stub.replies[r] = kv.Reply{Status: kv.Status(r % 5), Reason: kv.Reason(r % 3), PrefixLen: int(r)}
		}
		s, replies := fairServer(t, pollLog{stub}, slice)
		for _, q := range reqs {
			s.enqueueReq(t, "A", q)
		}
		for s.queued > 0 {
			s.turn()
		}
		return stub.callLog(), *replies
	}
	wholeCalls, wholeReplies := run(1 << 20)
	slicedCalls, slicedReplies := run(2)
	if !reflect.DeepEqual(wholeReplies, slicedReplies) {
		t.Fatalf("replies differ:\nwhole  %v\nsliced %v", wholeReplies, slicedReplies)
	}
	// Polls are split, the rest is the same calls in the same order.
	if got, want := merged(slicedCalls), merged(wholeCalls); !reflect.DeepEqual(got, want) {
		t.Fatalf("engine calls differ:\nwhole  %q\nsliced %q", want, got)
	}
	if len(slicedCalls) <= len(wholeCalls) {
		t.Fatalf("nothing was sliced: %q", slicedCalls)
	}
}

// merged expands "poll <first> x<n>" into one entry per room, so sliced and
// whole logs compare.
func merged(calls []string) []string {
	var out []string
	for _, c := range calls {
		var first, n uint64
		if _, err := fmt.Sscanf(c, "poll %d x%d", &first, &n); err == nil {
			for i := range n {
				out = append(out, fmt.Sprintf("poll %d", first+i))
			}
			continue
		}
		out = append(out, c)
	}
	return out
}

// A client that queues more than maxQueued requests gets busy for the excess;
// the rest is served in order.
func TestFairBusyBeyondQueue(t *testing.T) {
	stub := newStub()
	s, replies := fairServer(t, stub, 4)
	for i := range maxQueued + 2 {
		s.enqueueReq(t, "A", map[string]any{"id": i, "op": "open", "room": i + 1})
	}
	if len(*replies) != 2 {
		t.Fatalf("%d replies before any turn", len(*replies))
	}
	for _, r := range *replies {
		if r.reply["ok"] != false || r.reply["code"] != CodeBusy {
			t.Fatalf("excess request: %v", r.reply)
		}
	}
	for s.queued > 0 {
		s.turn()
	}
	if calls := stub.callLog(); len(calls) != maxQueued || calls[0] != "open 1" || calls[maxQueued-1] != fmt.Sprintf("open %d", maxQueued) {
		t.Fatalf("calls %q", calls)
	}
	if len(s.clients) != 0 || len(s.ring) != 0 {
		t.Fatalf("idle client kept: %d %d", len(s.clients), len(s.ring))
	}
}

// Room ids of 2^63 and above are refused: no decode can name them (F9).
func TestRoomIDsFrom2To63Refused(t *testing.T) {
	stub := newStub()
	s := startServer(t, stub, nil)
	rc := newRaw(t, s.Endpoint())
	for _, req := range []map[string]any{
		{"id": 1, "op": "open", "room": uint64(1 << 63)},
		{"id": 2, "op": "init", "room": uint64(1<<64 - 1), "num_pages": 1, "aux_index": 0},
		{"id": 3, "op": "poll", "rooms": []any{uint64(1), uint64(1 << 63)}},
		{"id": 4, "op": "clear", "rooms": []any{uint64(1<<64 - 1)}},
	} {
		rep, _ := rc.roundTrip([]byte{}, enc(t, req))
		if rep["ok"] != false || rep["code"] != CodeBadRequest {
			t.Fatalf("%v: %v", req, rep)
		}
		if msg, _ := rep["error"].(string); !strings.Contains(msg, "2^63") {
			t.Fatalf("%v: error %q does not say why", req, msg)
		}
	}
	rep, _ := rc.roundTrip([]byte{}, enc(t, map[string]any{"id": 5, "op": "open", "room": uint64(MaxRoom)}))
	if rep["ok"] != true {
		t.Fatalf("room 2^63-1: %v", rep)
	}
	if calls := stub.callLog(); !reflect.DeepEqual(calls, []string{fmt.Sprintf("open %d", uint64(MaxRoom))}) {
		t.Fatalf("engine calls %q", calls)
	}
}

// Over the socket: while one client polls 2^16 rooms in a loop, another's
// small polls are served between the slices of those big polls (the engine's
// call log shows them inside a big poll), not after them.
func TestFairOverSocket(t *testing.T) {
	const big, slice = 1 << 16, 1024
	stub := newStub()
	s := startServer(t, pollLog{stub}, func(c *Config) { c.Slice = slice })
	flooder, small := dial(t, s.Endpoint()), dial(t, s.Endpoint())
	rooms := make([]uint64, big)
	for i := range rooms {
		rooms[i] = uint64(i)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if _, err := flooder.Poll(rooms, nil); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	// Wait for the flood to be under way (bounded).
	testrig.Eventually(t, hangLimit, "the flood under way", func() bool { return len(stub.callLog()) > 0 })
	const smallRoom = 1 << 40
	// Where a small poll lands depends on the schedule (between two big polls
	// it is served alone), so poll until one is seen inside a big poll; a
	// server that does not slice never serves one there.
	inside := 0
	for round := 0; inside == 0 && round < 100; round++ {
		for range 20 {
			if _, err := small.Poll([]uint64{smallRoom}, nil); err != nil {
				t.Fatal(err)
			}
		}
		inside = servedInside(stub.callLog(), smallRoom, slice)
	}
	stop.Store(true)
	wg.Wait()
	calls := stub.callLog()
	for _, c := range calls {
		var first, n uint64
		if _, err := fmt.Sscanf(c, "poll %d x%d", &first, &n); err == nil && n > slice {
			t.Fatalf("an engine call of %d rooms: not sliced", n)
		}
	}
	if inside == 0 {
		t.Fatalf("no small poll was served inside a big one (%d calls)", len(calls))
	}
	t.Logf("%d small polls served between slices of a big poll", inside)
}

// servedInside counts the small room's polls the log shows between two
// consecutive slices of one big poll.
func servedInside(calls []string, smallRoom, slice uint64) int {
	inside := 0
	for i, c := range calls {
		if c != fmt.Sprintf("poll %d x1", smallRoom) || i == 0 || i == len(calls)-1 {
			continue
		}
		var before, after, n uint64
		_, err1 := fmt.Sscanf(calls[i-1], "poll %d x%d", &before, &n)
		_, err2 := fmt.Sscanf(calls[i+1], "poll %d x%d", &after, &n)
		if err1 == nil && err2 == nil && after == before+slice { // the same big poll goes on
			inside++
		}
	}
	return inside
}

// TestFairnessFigures measures small-poll latency while another client polls
// 2^20 rooms in a loop against the real engine, whole (one turn serves a whole
// request, as before slicing) and sliced. KVXFER_FAIR_FIGURES=1 runs it.
func TestFairnessFigures(t *testing.T) {
	if os.Getenv("KVXFER_FAIR_FIGURES") == "" {
		t.Skip("set KVXFER_FAIR_FIGURES=1")
	}
	for _, tc := range []struct {
		name  string
		slice int
	}{{"whole", 1 << 21}, {"sliced", DefaultSlice}} {
		eng := newEngine(t)
		s := startServer(t, eng, func(c *Config) { c.Slice = tc.slice })
		flooder, small := dial(t, s.Endpoint()), dial(t, s.Endpoint())
		rooms := make([]uint64, 1<<20)
		for i := range rooms {
			rooms[i] = uint64(i + 1)
		}
		var stop atomic.Bool
		var floods atomic.Int64
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if _, err := flooder.Poll(rooms, nil); err != nil {
					t.Error(err)
					return
				}
				floods.Add(1)
			}
		}()
		time.Sleep(500 * time.Millisecond)
		var lat []time.Duration
		for range 200 {
			t0 := time.Now()
			if _, err := small.Poll([]uint64{1 << 40}, nil); err != nil {
				t.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
			time.Sleep(2 * time.Millisecond)
		}
		stop.Store(true)
		wg.Wait()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		t.Logf("%s: small poll median %v p99 %v max %v; %d big polls done", tc.name, lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1], floods.Load())
		s.Stop()
	}
}
