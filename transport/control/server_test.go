package control

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
)

var sprintf = fmt.Sprintf

// pollUntil polls one room over the wire until it reports want. Each poll is a
// round trip through the room's mailbox, so this waits on the engine, not on time;
// the deadline only turns a hang into a failure.
func pollUntil(t *testing.T, c *Client, id uint64, want kv.Status) kv.Reply {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rs, err := c.Poll([]uint64{id}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rs[0].Status == want {
			return rs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("room %d: %+v, want %v", id, rs[0], want)
		}
	}
}

// TestRoomLifecycle drives a real engine through the scheduler's calls: open, the
// decode's transfer info (delivered to the engine directly), pop_decode_prefix_len,
// init, two chunks, success, clear.
func TestRoomLifecycle(t *testing.T) {
	eng := newEngine(t)
	s := startServer(t, eng, nil)
	c := dial(t, s.Endpoint())

	h, err := c.Hello(&Identity{Rank: 3, DPRank: 1})
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != Version || h.Identity.Rank != 3 || h.Identity.DPRank != 1 || h.Identity.Name != "prefill-3" || h.PID != os.Getpid() || h.Server != "kvxferd" {
		t.Fatalf("hello: %+v", h)
	}

	const id = 1<<62 + 7
	traced, err := c.Open(id, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if err != nil || !traced {
		t.Fatalf("open: traced %v, %v (actors.Engine has OpenTraced)", traced, err)
	}
	if r := pollUntil(t, c, id, kv.StatusBootstrapping); r.Reason != kv.ReasonNone {
		t.Fatalf("bootstrapping room: %+v", r)
	}
	eng.TransferInfo(id, room.TransferInfo{Agent: "d0", From: kv.Endpoint{IP: "127.0.0.1", Port: 9000},
		DstPages: []int32{100, 101, 102}, DstAux: 1, Required: 1, PrefixLen: 16})
	if r := pollUntil(t, c, id, kv.StatusWaitingForInput); r.PrefixLen != 16 {
		t.Fatalf("ready room: %+v", r)
	}
	if pl, err := c.PopDecodePrefixLen([]uint64{id}); err != nil || !reflect.DeepEqual(pl, []int{16}) {
		t.Fatalf("pop_decode_prefix_len: %v, %v", pl, err)
	}
	if err := c.Init(id, 3, 5); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(id, []int32{7, 8}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(id, []int32{9}, [][]int32{}); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, c, id, kv.StatusSuccess)
	if f, err := c.Failure([]uint64{id}, false); err != nil || f[0] != (Failure{Status: kv.StatusSuccess}) {
		t.Fatalf("failure of a successful room: %+v, %v", f, err)
	}
	if err := c.Clear(id); err != nil {
		t.Fatal(err)
	}
	eng.Poll([]uint64{id}, nil) // settle: the clear went through the same mailbox
	if st := eng.Stats(); st.LiveRooms != 0 || st.Tombstones != 1 {
		t.Fatalf("after clear: %+v", st)
	}
	if st := s.Stats(); st.Errors != 0 || st.SendErrors != 0 || st.Panics != 0 {
		t.Fatalf("server stats: %+v", st)
	}
}

// TestAbortAndBatchedPoll aborts one of several rooms and reads everything back in
// single batched requests, as the scheduler's loop does.
func TestAbortAndBatchedPoll(t *testing.T) {
	eng := newEngine(t)
	s := startServer(t, eng, nil)
	c := dial(t, s.Endpoint())
	rooms := []uint64{11, 12, 13}
	for _, r := range rooms {
		if _, err := c.Open(r, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Abort(12); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, c, 12, kv.StatusFailed)
	all := append(rooms, 99) // 99 was never opened
	rs, err := c.Poll(all, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []kv.Reply{{Status: kv.StatusBootstrapping}, {Status: kv.StatusFailed, Reason: kv.ReasonClientAbort},
		{Status: kv.StatusBootstrapping}, {Status: kv.StatusFailed, Reason: kv.ReasonInvalidRequest}}
	if !reflect.DeepEqual(rs, want) {
		t.Fatalf("poll: %+v, want %+v", rs, want)
	}
	f, err := c.Failure([]uint64{12}, true)
	if err != nil {
		t.Fatal(err)
	}
	if f[0].Status != kv.StatusFailed || f[0].Reason != kv.ReasonClientAbort || f[0].Message != "Aborted by AbortReq." {
		t.Fatalf("failure: %+v", f)
	}
	eng.Poll([]uint64{12}, nil)
	if st := eng.Stats(); st.LiveRooms != 2 {
		t.Fatalf("failure with clear should retire room 12: %+v", st)
	}
	if err := c.Clear(11, 13); err != nil {
		t.Fatal(err)
	}
}

// TestBatchOp mixes ops in one batch request; a bad sub-request fails alone.
func TestBatchOp(t *testing.T) {
	stub := newStub()
	stub.replies[1] = kv.Reply{Status: kv.StatusWaitingForInput, PrefixLen: 32}
	s := startServer(t, stub, nil)
	c := dial(t, s.Endpoint())
	res, err := c.Call(OpBatch, map[string]any{"reqs": []any{
		map[string]any{"op": "open", "room": int64(1)},
		map[string]any{"op": "init", "room": int64(1), "num_pages": int64(-1), "aux_index": int64(0)},
		map[string]any{"op": "nope"},
		map[string]any{"op": "poll", "rooms": []any{int64(1)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	reps := res.(map[string]any)["replies"].([]any)
	codes := []any{}
	for _, r := range reps {
		m := r.(map[string]any)
		codes = append(codes, m["code"])
		if _, has := m["id"]; has {
			t.Errorf("sub-reply has an id: %v", m)
		}
	}
	if !reflect.DeepEqual(codes, []any{nil, CodeBadRequest, CodeUnknownOp, nil}) {
		t.Fatalf("sub-reply codes %v in %v", codes, reps)
	}
	poll := reps[3].(map[string]any)["result"].(map[string]any)
	if !reflect.DeepEqual(poll, map[string]any{"status": []any{int64(2)}, "reason": []any{""}, "prefix_len": []any{int64(32)}}) {
		t.Fatalf("poll in batch: %v", poll)
	}
	if got := stub.callLog(); !reflect.DeepEqual(got, []string{"open 1"}) {
		t.Fatalf("engine calls %v", got)
	}
	res, err = c.Call(OpBatch, map[string]any{"reqs": []any{map[string]any{"op": "batch", "reqs": []any{}}}})
	if err != nil {
		t.Fatal(err)
	}
	if sub := res.(map[string]any)["replies"].([]any)[0].(map[string]any); sub["code"] != CodeBadRequest {
		t.Fatalf("nested batch: %v", sub)
	}
}

// TestSendWire checks that pages and state survive the packed-int32 encoding.
func TestSendWire(t *testing.T) {
	stub := newStub()
	s := startServer(t, stub, nil)
	c := dial(t, s.Endpoint())
	pages := []int32{0, 1, 1 << 30, -5}
	state := [][]int32{{3, 4}, nil, {}}
	if err := c.Send(5, pages, state); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(5, nil, nil); err != nil {
		t.Fatal(err)
	}
	stub.mu.Lock()
	defer stub.mu.Unlock()
	if !reflect.DeepEqual(stub.sends[5], [][]int32{pages, {}}) {
		t.Fatalf("pages %v", stub.sends[5])
	}
	if st := stub.states[5]; !reflect.DeepEqual(st[0], [][]int32{{3, 4}, nil, {}}) || st[1] != nil {
		t.Fatalf("state %#v", st)
	}
}

func TestTracedOpen(t *testing.T) {
	stub := newStub()
	s := startServer(t, tracedStub{stub}, nil)
	c := dial(t, s.Endpoint())
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if traced, err := c.Open(1, tp); err != nil || !traced {
		t.Fatalf("valid traceparent: %v %v", traced, err)
	}
	if traced, err := c.Open(2, "00-00000000000000000000000000000000-00f067aa0ba902b7-01"); err != nil || traced {
		t.Fatalf("all-zero trace id: %v %v", traced, err)
	}
	want := []string{"open 1 traced " + tp, "open 2"}
	if got := stub.callLog(); !reflect.DeepEqual(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
}

func TestTraceparentValidation(t *testing.T) {
	ok := []string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra",
	}
	bad := []string{"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	for _, s := range ok {
		if !validTraceparent(s) {
			t.Errorf("rejected %q", s)
		}
	}
	for _, s := range bad {
		if validTraceparent(s) {
			t.Errorf("accepted %q", s)
		}
	}
}

// TestBadRequests sends malformed and invalid requests; each gets an error reply with
// the right code (and the id when it could be read), and the loop keeps serving.
func TestBadRequests(t *testing.T) {
	stub := newStub()
	s := startServer(t, stub, nil)
	rc := newRaw(t, s.Endpoint())
	m := func(kv ...any) []byte {
		x := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			x[kv[i].(string)] = kv[i+1]
		}
		return enc(t, x)
	}
	id := int64(42)
	cases := []struct {
		name   string
		body   []byte
		code   string
		echoID bool
	}{
		{"not msgpack", []byte{0xc1}, CodeBadRequest, false},
		{"empty body", []byte{}, CodeBadRequest, false},
		{"truncated", m("id", id, "op", "hello")[:5], CodeBadRequest, false},
		{"array", enc(t, []any{"hello"}), CodeBadRequest, false},
		{"trailing", append(m("id", id, "op", "hello"), 0xc0), CodeBadRequest, false},
		{"missing id", m("op", "hello"), CodeBadRequest, false},
		{"negative id", m("id", int64(-1), "op", "hello"), CodeBadRequest, false},
		{"missing op", m("id", id), CodeBadRequest, true},
		{"unknown op", m("id", id, "op", "frobnicate"), CodeUnknownOp, true},
		{"op not str", m("id", id, "op", int64(3)), CodeBadRequest, true},
		{"open without room", m("id", id, "op", "open"), CodeBadRequest, true},
		{"room as str", m("id", id, "op", "open", "room", "7"), CodeBadRequest, true},
		{"init negative", m("id", id, "op", "init", "room", int64(1), "num_pages", int64(-1), "aux_index", int64(0)), CodeBadRequest, true},
		{"init huge", m("id", id, "op", "init", "room", int64(1), "num_pages", int64(1<<40), "aux_index", int64(0)), CodeBadRequest, true},
		{"init missing aux", m("id", id, "op", "init", "room", int64(1), "num_pages", int64(1)), CodeBadRequest, true},
		{"send odd bin", m("id", id, "op", "send", "room", int64(1), "pages", []byte{1, 2, 3, 4, 5}), CodeBadRequest, true},
		{"send pages as list", m("id", id, "op", "send", "room", int64(1), "pages", []any{int64(1)}), CodeBadRequest, true},
		{"send no pages", m("id", id, "op", "send", "room", int64(1)), CodeBadRequest, true},
		{"send bad state", m("id", id, "op", "send", "room", int64(1), "pages", []byte{}, "state", []any{int64(1)}), CodeBadRequest, true},
		{"poll room and rooms", m("id", id, "op", "poll", "room", int64(1), "rooms", []any{}), CodeBadRequest, true},
		{"poll no rooms", m("id", id, "op", "poll"), CodeBadRequest, true},
		{"poll negative room", m("id", id, "op", "poll", "rooms", []any{int64(-3)}), CodeBadRequest, true},
		{"hello v2", m("id", id, "op", "hello", "version", int64(2)), CodeUnsupportedVersion, true},
		{"hello wrong rank", m("id", id, "op", "hello", "rank", int64(0)), CodeWrongRank, true},
		{"hello wrong dp", m("id", id, "op", "hello", "rank", int64(3), "dp_rank", int64(0)), CodeWrongRank, true},
		{"memory without callback", m("id", id, "op", "register_memory", "kind", "aux", "buffers",
			[]any{map[string]any{"shm": "x", "length": int64(64), "item_len": int64(8), "mem": "DRAM"}}), CodeUnsupported, true},
		{"batch without reqs", m("id", id, "op", "batch"), CodeBadRequest, true},
	}
	for _, c := range cases {
		rep, _ := rc.roundTrip([]byte{}, c.body)
		if rep["ok"] != false || rep["code"] != c.code {
			t.Errorf("%s: reply %v, want code %s", c.name, rep, c.code)
			continue
		}
		if msg, _ := rep["error"].(string); msg == "" {
			t.Errorf("%s: no error message", c.name)
		}
		if wantID := any(nil); c.echoID {
			wantID = id
			if rep["id"] != wantID {
				t.Errorf("%s: id %v, want %v", c.name, rep["id"], wantID)
			}
		} else if rep["id"] != nil {
			t.Errorf("%s: id %v, want nil", c.name, rep["id"])
		}
	}
	// Two body frames: answered, not dropped. A DEALER without the empty delimiter
	// gets its reply without one.
	if rep, n := rc.roundTrip([]byte{}, m("id", id, "op", "hello"), []byte("x")); rep["code"] != CodeBadRequest || n != 2 {
		t.Errorf("two body frames: %v (%d frames)", rep, n)
	}
	if rep, n := rc.roundTrip(m("id", id, "op", "hello")); rep["ok"] != true || n != 1 {
		t.Errorf("no delimiter: %v (%d frames)", rep, n)
	}
	// Unknown fields are ignored (forward compatibility).
	if rep, _ := rc.roundTrip([]byte{}, m("id", id, "op", "hello", "future", map[string]any{"x": []any{1.5}})); rep["ok"] != true {
		t.Errorf("unknown field: %v", rep)
	}
	st := s.Stats()
	if st.Errors != uint64(len(cases)+1) || st.Dropped != 0 || st.Panics != 0 {
		t.Errorf("stats %+v", st)
	}
	if got := stub.callLog(); len(got) != 0 {
		t.Errorf("bad requests reached the engine: %v", got)
	}
}

// TestRegisterMemory covers validation, the callback's errors and a panic in it.
func TestRegisterMemory(t *testing.T) {
	var (
		mu   sync.Mutex
		got  []*MemoryRegistration
		fail error
	)
	s := startServer(t, newStub(), func(c *Config) {
		c.Memory = func(reg *MemoryRegistration) error {
			if reg.StateType == "boom" {
				panic("callback bug")
			}
			mu.Lock()
			defer mu.Unlock()
			got = append(got, reg)
			return fail
		}
	})
	setFail := func(err error) { mu.Lock(); fail = err; mu.Unlock() }
	snapshot := func() []*MemoryRegistration {
		mu.Lock()
		defer mu.Unlock()
		return append([]*MemoryRegistration(nil), got...)
	}
	c := dial(t, s.Endpoint())
	kv := &MemoryRegistration{Kind: KindKV, Buffers: []Region{
		{Shm: "psm_k0", Length: 4096, ItemLen: 256, Mem: nixl.DRAM},
		{Shm: "/dev/shm/kv/v0", Offset: 8192, Length: 4096, ItemLen: 256, Mem: nixl.DRAM},
	}}
	slots, err := c.RegisterMemory(kv)
	if err != nil || slots != 16 {
		t.Fatalf("register kv: %d, %v", slots, err)
	}
	if got := snapshot(); len(got) != 1 || !reflect.DeepEqual(got[0], kv) || got[0].Buffers[0].Path() != "/dev/shm/psm_k0" || got[0].Buffers[1].Path() != "/dev/shm/kv/v0" {
		t.Fatalf("callback got %+v", got)
	}
	ipc := &MemoryRegistration{Kind: KindState, Component: 1, StateType: "mamba",
		Buffers: []Region{{CUDAIPC: make([]byte, 64), Length: 64, ItemLen: 64, Mem: nixl.VRAM, Dev: 2}}}
	if _, err := c.RegisterMemory(ipc); err != nil {
		t.Fatalf("register state with a cuda ipc handle: %v", err)
	}
	if got := snapshot(); len(got) != 2 || !reflect.DeepEqual(got[1], ipc) {
		t.Fatalf("callback got %+v", got)
	}
	bad := map[string]*MemoryRegistration{
		"kind":         {Kind: "weights", Buffers: kv.Buffers},
		"none":         {Kind: KindKV},
		"mixed":        {Kind: KindKV, Buffers: []Region{kv.Buffers[0], {Shm: "b", Length: 4096, ItemLen: 256, Mem: nixl.VRAM}}},
		"slots":        {Kind: KindKV, Buffers: []Region{kv.Buffers[0], {Shm: "b", Length: 2048, ItemLen: 256, Mem: nixl.DRAM}}},
		"partial item": {Kind: KindKV, Buffers: []Region{{Shm: "b", Length: 100, ItemLen: 64, Mem: nixl.DRAM}}},
		"aux vram":     {Kind: KindAux, Buffers: []Region{{Shm: "b", Length: 64, ItemLen: 64, Mem: nixl.VRAM}}},
		"dotdot":       {Kind: KindAux, Buffers: []Region{{Shm: "../etc/passwd", Length: 64, ItemLen: 64, Mem: nixl.DRAM}}},
		"unclean":      {Kind: KindAux, Buffers: []Region{{Shm: "/dev/shm/../x", Length: 64, ItemLen: 64, Mem: nixl.DRAM}}},
		"no source":    {Kind: KindAux, Buffers: []Region{{Length: 64, ItemLen: 64, Mem: nixl.DRAM}}},
		"ipc on dram":  {Kind: KindAux, Buffers: []Region{{CUDAIPC: []byte{1}, Length: 64, ItemLen: 64, Mem: nixl.DRAM}}},
		"short ipc":    {Kind: KindKV, Buffers: []Region{{CUDAIPC: make([]byte, 63), Length: 64, ItemLen: 64, Mem: nixl.VRAM}}},
		"dram dev":     {Kind: KindKV, Buffers: []Region{{Shm: "b", Length: 64, ItemLen: 64, Mem: nixl.DRAM, Dev: 1}}},
		"overflow":     {Kind: KindKV, Buffers: []Region{{Shm: "b", Offset: 1 << 63, Length: 1 << 63, ItemLen: 64, Mem: nixl.DRAM}}},
		"state on kv":  {Kind: KindKV, StateType: "mamba", Buffers: kv.Buffers},
	}
	for name, reg := range bad {
		var ce *Error
		if _, err := c.RegisterMemory(reg); !errors.As(err, &ce) || ce.Code != CodeInvalidMemory {
			t.Errorf("%s: %v, want %s", name, err, CodeInvalidMemory)
		}
	}
	setFail(errors.New("no such file"))
	if _, err := c.RegisterMemory(kv); err == nil || err.(*Error).Code != CodeRejected {
		t.Errorf("callback error: %v", err)
	}
	setFail(errorf(CodeUnsupported, "cuda ipc not yet"))
	if _, err := c.RegisterMemory(kv); err == nil || err.(*Error).Code != CodeUnsupported {
		t.Errorf("callback *Error: %v", err)
	}
	boom := &MemoryRegistration{Kind: KindState, StateType: "boom", Buffers: kv.Buffers}
	if _, err := c.RegisterMemory(boom); err == nil || err.(*Error).Code != CodeInternal {
		t.Errorf("callback panic: %v", err)
	}
	if _, err := c.Hello(nil); err != nil {
		t.Fatalf("server after a callback panic: %v", err)
	}
	if st := s.Stats(); st.Panics != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSocketFile checks the 0600 mode, that a live server's path is not stolen, that a
// stale socket is replaced, that other files are left alone, and removal on Stop.
func TestSocketFile(t *testing.T) {
	ep := ipcEndpoint(t)
	path := strings.TrimPrefix(ep, "ipc://")
	s := startServer(t, newStub(), func(c *Config) { c.Endpoint = ep })
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket file mode %v, want socket 0600", fi.Mode())
	}
	if _, err := Start(Config{Endpoint: ep, Engine: newStub()}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second server on a live path: %v", err)
	}
	if _, err := dial(t, ep).Hello(nil); err != nil {
		t.Fatalf("the first server must survive the second's attempt: %v", err)
	}
	entries, _ := os.ReadDir(strings.TrimSuffix(path, "/ctl.sock"))
	if len(entries) != 1 {
		t.Fatalf("leftovers next to the socket: %v", entries)
	}
	s.Stop()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("socket file after Stop: %v", err)
	}

	// A regular file at the path is not ours to replace.
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(Config{Endpoint: ep, Engine: newStub()}); err == nil {
		t.Fatal("started over a regular file")
	}
	os.Remove(path)
}

func TestStaleSocketReplaced(t *testing.T) {
	ep := ipcEndpoint(t)
	path := strings.TrimPrefix(ep, "ipc://")
	s1 := startServer(t, newStub(), func(c *Config) { c.Endpoint = ep })
	s1.ipc = nil // simulate a crash: the file stays behind
	s1.Stop()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("stale file should remain: %v", err)
	}
	s2 := startServer(t, newStub(), func(c *Config) { c.Endpoint = ep })
	if _, err := dial(t, s2.Endpoint()).Hello(nil); err != nil {
		t.Fatal(err)
	}
}

func TestEndpoints(t *testing.T) {
	s := startServer(t, newStub(), func(c *Config) { c.Endpoint = "tcp://127.0.0.1:0" })
	if !strings.HasPrefix(s.Endpoint(), "tcp://127.0.0.1:") || strings.HasSuffix(s.Endpoint(), ":0") {
		t.Fatalf("tcp endpoint %q", s.Endpoint())
	}
	if _, err := dial(t, s.Endpoint()).Hello(nil); err != nil {
		t.Fatal(err)
	}
	for _, ep := range []string{"tcp://0.0.0.0:0", "tcp://10.0.0.1:5000", "tcp://127.0.0.1", "ipc://rel/path",
		"ipc://@abstract", "ipc:///a/../b", "inproc://x", "ipc:///" + strings.Repeat("x", 120)} {
		if _, err := Start(Config{Endpoint: ep, Engine: newStub()}); err == nil {
			t.Errorf("%s accepted", ep)
		}
	}
	if _, err := Start(Config{}); err == nil {
		t.Error("no engine accepted")
	}
	if ep := DefaultEndpoint(5); !strings.HasPrefix(ep, "ipc:///") || !strings.HasSuffix(ep, "-rank5.sock") {
		t.Errorf("default endpoint %q", ep)
	}
}

// TestClientTimeout: a call that times out leaves the client usable; the late reply
// is discarded by id.
func TestClientTimeout(t *testing.T) {
	stub := newStub()
	stub.block = make(chan struct{})
	s := startServer(t, stub, nil)
	c := dial(t, s.Endpoint())
	if err := c.SetTimeout(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Poll([]uint64{1}, nil); !errors.Is(err, ErrTimeout) {
		t.Fatalf("blocked poll: %v", err)
	}
	close(stub.block)
	if err := c.SetTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if h, err := c.Hello(nil); err != nil || h.Version != Version {
		t.Fatalf("after a timeout: %+v, %v", h, err)
	}
}

// TestConcurrentClients: many clients at once, served one request at a time.
func TestConcurrentClients(t *testing.T) {
	eng := newEngine(t)
	s := startServer(t, eng, nil)
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		c := dial(t, s.Endpoint())
		go func(base uint64) {
			for i := uint64(0); i < 50; i++ {
				if _, err := c.Open(base+i, ""); err != nil {
					errs <- err
					return
				}
			}
			rooms := make([]uint64, 50)
			for i := range rooms {
				rooms[i] = base + uint64(i)
			}
			if err := c.Abort(rooms...); err != nil {
				errs <- err
				return
			}
			_, err := c.Poll(rooms, nil)
			errs <- err
		}(uint64(g) * 1000)
	}
	for g := 0; g < 4; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestStopNoLeak starts and stops servers and checks that none of this package's
// goroutines is left. It counts goroutines whose stack runs Server or Client code,
// not all goroutines: the runtime, the race detector and zmq4 start and retire
// their own on their own schedule, which made a global count flaky on loaded CI.
func TestStopNoLeak(t *testing.T) {
	for i := 0; i < 5; i++ {
		s, err := Start(Config{Endpoint: ipcEndpoint(t), Engine: newStub(), PollInterval: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		c, err := Dial(s.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Hello(nil); err != nil {
			t.Fatal(err)
		}
		c.Close()
		s.Stop()
		s.Stop() // idempotent
		<-s.Done()
	}
	// The loop goroutine closes Done as its last act; give the scheduler a moment
	// to retire it (bounded spin on the condition, no sleeping).
	var left []string
	for i := 0; i < 100000; i++ {
		if left = ownGoroutines(); len(left) == 0 {
			return
		}
		runtime.Gosched()
	}
	t.Fatalf("%d goroutines of this package left after Stop:\n%s", len(left), strings.Join(left, "\n\n"))
}

// ownGoroutines returns the stacks of goroutines running Server or Client methods.
func ownGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var own []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "control.(*Server)") || strings.Contains(g, "control.(*Client)") {
			own = append(own, g)
		}
	}
	return own
}

// TestREQClient: a plain REQ socket (what a minimal Python client might use) works.
func TestREQClient(t *testing.T) {
	s := startServer(t, newStub(), nil)
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	req, err := zctx.NewSocket(zmq.REQ)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { req.Close(); zctx.Term() }()
	req.SetLinger(0)
	req.SetRcvtimeo(10 * time.Second)
	if err := req.Connect(s.Endpoint()); err != nil {
		t.Fatal(err)
	}
	for id := int64(1); id <= 2; id++ {
		if _, err := req.SendBytes(enc(t, map[string]any{"id": id, "op": "hello"}), 0); err != nil {
			t.Fatal(err)
		}
		frames, err := req.RecvMessageBytes(0)
		if err != nil {
			t.Fatal(err)
		}
		v, err := decodeValue(frames[len(frames)-1])
		if m, _ := v.(map[string]any); err != nil || len(frames) != 1 || m["ok"] != true || m["id"] != id {
			t.Fatalf("REQ reply %v (%d frames), %v", v, len(frames), err)
		}
	}
}

// lost hands the rooms to the daemon's callback and returns what it told; a
// server without one, or a list past MaxLost, answers a clear error.
func TestLostOp(t *testing.T) {
	var got []uint64
	s := startServer(t, newEngine(t), func(c *Config) {
		c.Lost = func(rooms []uint64) int { got = append(got, rooms...); return 3 }
	})
	c := dial(t, s.Endpoint())
	told, err := c.Lost(5, 6)
	if err != nil || told != 3 || !reflect.DeepEqual(got, []uint64{5, 6}) {
		t.Fatalf("lost: told %d, err %v, callback got %v", told, err, got)
	}
	var ce *Error
	if _, err := c.Lost(make([]uint64, MaxLost+1)...); !errors.As(err, &ce) || ce.Code != CodeBadRequest {
		t.Fatalf("past the cap: %v", err)
	}
	if len(got) != 2 {
		t.Fatalf("refused requests reached the callback: %v", got)
	}
	plain := startServer(t, newEngine(t), nil)
	if _, err := dial(t, plain.Endpoint()).Lost(5); !errors.As(err, &ce) || ce.Code != CodeUnsupported {
		t.Fatalf("no callback: %v", err)
	}
}
