package control

import (
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"sync"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// pythonWithZMQ returns an interpreter that has pyzmq and msgpack: $KVXFER_PYTHON
// when set (e.g. a virtualenv), else /usr/bin/python3 (Debian's python3-zmq and
// python3-msgpack); "" when neither has both.
func pythonWithZMQ() string {
	py := os.Getenv("KVXFER_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if exec.Command(py, "-c", "import zmq, msgpack").Run() != nil {
		return ""
	}
	return py
}

// TestPythonInterop runs python/kvxfer/control.py, the reference Python client,
// against a server and checks both what the engine saw and what Python decoded.
func TestPythonInterop(t *testing.T) {
	py := pythonWithZMQ()
	if py == "" {
		t.Skip("no python3 with zmq and msgpack (apt install python3-zmq python3-msgpack, or set KVXFER_PYTHON)")
	}
	const big = 1<<63 - 5 // the largest rooms: 2^63 and above are refused
	stub := newStub()
	stub.replies[big] = kv.Reply{Status: kv.StatusWaitingForInput, PrefixLen: 48}
	stub.replies[1] = kv.Reply{Status: kv.StatusFailed, Reason: kv.ReasonDecodeAbort}
	var mu sync.Mutex
	var regs []*MemoryRegistration
	s := startServer(t, tracedStub{stub}, func(c *Config) {
		c.Memory = func(r *MemoryRegistration) error {
			mu.Lock()
			defer mu.Unlock()
			regs = append(regs, r)
			return nil
		}
	})
	cmd := exec.Command(py, "../../python/kvxfer/control.py", s.Endpoint())
	cmd.Stderr = os.Stderr
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("python client: %v", err)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("python output %q: %v", raw, err)
	}
	t.Logf("python: batched poll of 1000 rooms: %.0f µs per round trip", got["poll1000_us"])
	delete(got, "poll1000_us")
	hello := got["hello"].(map[string]any)
	delete(hello, "pid")
	delete(hello, "max_message")
	want := map[string]any{
		"hello":      map[string]any{"version": 1.0, "server": "kvxferd", "rank": 3.0, "pp_rank": 0.0, "dp_rank": 1.0, "name": "prefill-3"},
		"wrong_rank": CodeWrongRank,
		"register":   map[string]any{"kind": "kv", "buffers": 2.0, "slots": 256.0},
		"traced":     true,
		"poll":       []any{[]any{2.0, 0.0, 0.0}, []any{"", "decode_abort", "invalid_request"}, []any{48.0, 0.0, 0.0}},
		"failure":    []any{[]any{0.0, "decode_abort", "Aborted by decode."}},
		"prefix":     []any{48.0},
		"batch": []any{map[string]any{"ok": true, "result": map[string]any{"n": 1.0}},
			map[string]any{"ok": false, "code": CodeUnknownOp, "error": `unknown op "bogus"`}},
		"bad_pages": CodeBadRequest,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("python saw\n%v\nwant\n%v", got, want)
	}
	calls := stub.callLog()
	wantCalls := []string{"open 9223372036854775803 traced 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"init 9223372036854775803 3 7", "send 9223372036854775803 3", "send 9223372036854775803 0",
		"clear 1", "abort 1", "abort 2", "clear 9223372036854775803"}
	if !reflect.DeepEqual(calls, wantCalls) {
		t.Errorf("engine calls\n%q\nwant\n%q", calls, wantCalls)
	}
	stub.mu.Lock()
	if !reflect.DeepEqual(stub.sends[big], [][]int32{{1, 2, -3}, {}}) || !reflect.DeepEqual(stub.states[big], [][][]int32{{{4, 5}, nil}, nil}) {
		t.Errorf("sends %v states %v", stub.sends[big], stub.states[big])
	}
	stub.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if len(regs) != 1 || regs[0].Buffers[0].Path() != "/dev/shm/psm_abc" || regs[0].Buffers[1].Offset != 4096 || regs[0].NumSlots() != 256 {
		t.Errorf("registrations %+v", regs)
	}
}
