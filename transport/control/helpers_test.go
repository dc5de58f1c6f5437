package control

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// The control server must be able to drive the real engine, traces and the
// status table included.
var (
	_ Engine       = realEngine{}
	_ TracedOpener = realEngine{}
	_ SinkEngine   = realEngine{}
)

// realEngine is the actors' engine as the daemon hands it to the server: the
// room ops as they are, the status sink adapted to this package's interfaces
// (daemon/ctlengine.go does the same; this package cannot import the daemon).
type realEngine struct{ *actors.Engine }

func (e realEngine) SetStatusSink(s StatusSink) {
	if s == nil {
		e.Engine.SetStatusSink(nil)
		return
	}
	e.Engine.SetStatusSink(actorsSink{s})
}

type actorsSink struct{ s StatusSink }

func (a actorsSink) Claim(roomID uint64) actors.StatusSlot {
	if slot := a.s.Claim(roomID); slot != nil {
		return slot
	}
	return nil
}

// instantTransfers completes every posted write at once: a test double of the NIXL
// pool, as in actors/engine_test.go.
type instantTransfers struct{}

func (instantTransfers) Post(_ kv.Transfer, done kv.DoneFunc) { done(kv.ReasonNone, nil) }

// newEngine starts a real engine on a fake clock; it is closed after the test (and
// after any server started later, since cleanups run last-in first-out).
func newEngine(t testing.TB) realEngine {
	t.Helper()
	eng, err := actors.New(actors.Config{Transfers: instantTransfers{}, Clock: clock.NewFake(time.Unix(0, 0)), Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Close(ctx)
	})
	return realEngine{eng}
}

func ipcEndpoint(t testing.TB) string {
	return "ipc://" + filepath.Join(t.TempDir(), "ctl.sock")
}

// startServer starts a server on a fresh ipc endpoint (unless mod sets one).
func startServer(t testing.TB, eng Engine, mod func(*Config)) *Server {
	t.Helper()
	cfg := Config{Endpoint: ipcEndpoint(t), Engine: eng, PollInterval: 5 * time.Millisecond,
		Identity: Identity{Rank: 3, PPRank: 0, DPRank: 1, Name: "prefill-3"}}
	if mod != nil {
		mod(&cfg)
	}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

func dial(t testing.TB, ep string) *Client {
	t.Helper()
	c, err := Dial(ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawClient sends hand-made messages on a DEALER, for the malformed-request tests.
type rawClient struct {
	t    testing.TB
	zctx *zmq.Context
	sock *zmq.Socket
}

func newRaw(t testing.TB, ep string) *rawClient {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	sock, err := zctx.NewSocket(zmq.DEALER)
	if err != nil {
		t.Fatal(err)
	}
	sock.SetLinger(0)
	sock.SetRcvtimeo(10 * time.Second)
	if err := sock.Connect(ep); err != nil {
		t.Fatal(err)
	}
	rc := &rawClient{t: t, zctx: zctx, sock: sock}
	t.Cleanup(func() { sock.Close(); zctx.Term() })
	return rc
}

// roundTrip sends frames and returns the reply's decoded body and its frame count.
func (rc *rawClient) roundTrip(frames ...[]byte) (map[string]any, int) {
	rc.t.Helper()
	parts := make([]any, len(frames))
	for i, f := range frames {
		parts[i] = f
	}
	if _, err := rc.sock.SendMessage(parts...); err != nil {
		rc.t.Fatal(err)
	}
	got, err := rc.sock.RecvMessageBytes(0)
	if err != nil {
		rc.t.Fatalf("no reply: %v", err)
	}
	v, err := decodeValue(got[len(got)-1])
	if err != nil {
		rc.t.Fatalf("reply is not msgpack: %v", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		rc.t.Fatalf("reply is %T", v)
	}
	return m, len(got)
}

// enc encodes a generic value for raw requests.
func enc(t testing.TB, v any) []byte {
	t.Helper()
	b, ok := appendValue(nil, v)
	if !ok {
		t.Fatalf("cannot encode %#v", v)
	}
	return b
}

// stubEngine records calls and answers polls from a table. Block, when set, makes
// Poll wait for it to be closed.
type stubEngine struct {
	mu      sync.Mutex
	calls   []string
	sends   map[uint64][][]int32
	states  map[uint64][][][]int32
	replies map[uint64]kv.Reply
	block   chan struct{}
}

func newStub() *stubEngine {
	return &stubEngine{sends: map[uint64][][]int32{}, states: map[uint64][][][]int32{}, replies: map[uint64]kv.Reply{}}
}

func (e *stubEngine) log(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, sprintf(format, args...))
}

func (e *stubEngine) Open(r uint64) { e.log("open %d", r) }
func (e *stubEngine) Init(r uint64, n, a int) {
	e.log("init %d %d %d", r, n, a)
}
func (e *stubEngine) Send(r uint64, pages []int32, state [][]int32) {
	e.mu.Lock()
	e.sends[r] = append(e.sends[r], pages)
	e.states[r] = append(e.states[r], state)
	e.mu.Unlock()
	e.log("send %d %d", r, len(pages))
}
func (e *stubEngine) Abort(r uint64) { e.log("abort %d", r) }
func (e *stubEngine) Clear(r uint64) { e.log("clear %d", r) }
func (e *stubEngine) Poll(rooms []uint64, out []kv.Reply) []kv.Reply {
	if e.block != nil {
		<-e.block
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out = out[:0]
	for _, r := range rooms {
		rep, ok := e.replies[r]
		if !ok {
			rep = kv.Reply{Status: kv.StatusFailed, Reason: kv.ReasonInvalidRequest}
		}
		out = append(out, rep)
	}
	return out
}

func (e *stubEngine) callLog() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.calls...)
}

// tracedStub also implements TracedOpener.
type tracedStub struct{ *stubEngine }

func (e tracedStub) OpenTraced(r uint64, tp string) { e.log("open %d traced %s", r, tp) }
