package zmqio

import (
	"errors"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// recSink records everything and signals each delivery on a channel.
type recSink struct {
	mu          sync.Mutex
	got         []any
	events      chan struct{}
	panicOnRoom uint64
}

func newRecSink() *recSink { return &recSink{events: make(chan struct{}, 1024)} }

func (s *recSink) add(v any) {
	s.mu.Lock()
	s.got = append(s.got, v)
	s.mu.Unlock()
	s.events <- struct{}{}
}
func (s *recSink) Registration(r *wire.Registration) { s.add(r) }
func (s *recSink) TransferInfo(t *wire.TransferInfo) {
	if s.panicOnRoom != 0 && t.Room == s.panicOnRoom {
		s.events <- struct{}{}
		panic("sink bug")
	}
	s.add(t)
}
func (s *recSink) Abort(a *wire.Abort)    { s.add(a) }
func (s *recSink) Staging(m wire.Inbound) { s.add(m) }
func (s *recSink) BadFrame(err error)     { s.add(err) }

// wait blocks until n deliveries happened. The timeout only turns a hang into a failure;
// the test does not depend on timing.
func (s *recSink) wait(t *testing.T, n int) []any {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for range n {
		select {
		case <-s.events:
		case <-deadline:
			t.Fatalf("timed out waiting for %d deliveries", n)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]any(nil), s.got...)
}

// testPush is a decode-side PUSH peer, owned by the test goroutine.
func testPush(t *testing.T, zctx *zmq.Context, endpoint string) *zmq.Socket {
	t.Helper()
	sock, err := zctx.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	if err := sock.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := sock.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	return sock
}

func sendFrames(t *testing.T, sock *zmq.Socket, frames [][]byte) {
	t.Helper()
	if _, err := sock.SendMessage(frames); err != nil {
		t.Fatal(err)
	}
}

func TestIngestOverTCP(t *testing.T) {
	before := runtime.NumGoroutine()
	sink := newRecSink()
	sink.panicOnRoom = 666
	in, err := StartIngest(IngestConfig{Host: "127.0.0.1", PollInterval: 10 * time.Millisecond}, sink)
	if err != nil {
		t.Fatal(err)
	}
	if in.Port() <= 0 || in.Endpoint() != TCPEndpoint("127.0.0.1", in.Port()) {
		t.Fatalf("endpoint %q port %d", in.Endpoint(), in.Port())
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	push := testPush(t, zctx, in.Endpoint())

	panicky := goldenTransferInfoFrames()
	panicky[1] = []byte("666")
	msgs := [][][]byte{
		goldenRegistrationFrames(),
		fr("garbage"),           // unknown tag
		{{}},                    // one empty frame
		fr("NixlMsgGuard", "x"), // bad room
		panicky,                 // sink panics: recovered, loop goes on
		fr("WATERMARK", "1", "2", "s"),
		goldenTransferInfoFrames(),
		fr("ABORT", "42", "10.0.0.7", "41235"),
	}
	for _, m := range msgs {
		sendFrames(t, push, m)
	}
	got := sink.wait(t, len(msgs))
	if r, ok := got[0].(*wire.Registration); !ok || r.AgentName != agentUUID {
		t.Fatalf("got[0] = %#v", got[0])
	}
	for i := 1; i <= 3; i++ {
		if _, ok := got[i].(error); !ok {
			t.Fatalf("got[%d] = %#v, want error", i, got[i])
		}
	}
	if !errors.Is(got[1].(error), wire.ErrUnknownTag) || !errors.Is(got[2].(error), wire.ErrUnknownTag) {
		t.Fatalf("unknown tags: %v / %v", got[1], got[2])
	}
	if _, ok := got[4].(*wire.Watermark); !ok {
		t.Fatalf("got[4] = %#v", got[4])
	}
	if ti, ok := got[5].(*wire.TransferInfo); !ok || ti.Room != 12345678901234 {
		t.Fatalf("got[5] = %#v", got[5])
	}
	if a, ok := got[6].(*wire.Abort); !ok || a.Room != 42 {
		t.Fatalf("got[6] = %#v", got[6])
	}
	st := in.Stats()
	want := IngestStats{Messages: 8, Registrations: 1, TransferInfos: 2, Aborts: 1, Staging: 1,
		BadFrames: 3, UnknownTags: 2, SinkPanics: 1}
	if st != want {
		t.Fatalf("stats %+v\nwant  %+v", st, want)
	}

	_ = push.Close()
	_ = zctx.Term()
	in.Stop()
	in.Stop() // idempotent
	select {
	case <-in.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	waitGoroutines(t, before)
}

// waitGoroutines checks for leaks with a bounded poll: goroutines of a stopped ingest may
// take a scheduler tick to disappear.
func waitGoroutines(t *testing.T, want int) {
	t.Helper()
	for range 200 {
		if runtime.NumGoroutine() <= want {
			return
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("goroutine leak: %d > %d", runtime.NumGoroutine(), want)
}

func TestIngestSharedContextAndFixedPortConflict(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	a, err := StartIngest(IngestConfig{Context: zctx, Host: "127.0.0.1"}, newRecSink())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	// Binding the same port again fails cleanly, without leaking the goroutine.
	if _, err := StartIngest(IngestConfig{Context: zctx, Host: "127.0.0.1", Port: a.Port()}, newRecSink()); err == nil {
		t.Fatal("second bind on the same port succeeded")
	}
	if _, err := StartIngest(IngestConfig{}, nil); err == nil {
		t.Fatal("nil sink accepted")
	}
}

func TestPushLinkToPull(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	// Decode's PULL socket, owned by the test goroutine.
	pull, err := zctx.NewSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	_ = pull.SetLinger(0)
	if err := pull.Bind("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	ep, _ := pull.GetLastEndpoint()
	port, err := endpointPort(ep)
	if err != nil {
		t.Fatal(err)
	}
	link, err := DialPush(PushConfig{Endpoint: TCPEndpoint("127.0.0.1", port), SendTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := []wire.Outbound{
		&wire.KVStatus{Room: 42, Status: kv.StatusFailed, PrefillRank: 1, Reason: "boom"},
		&wire.AbortAck{Room: 42, PrefillRank: 1},
	}
	for _, m := range want {
		if err := link.Send(m.Encode()); err != nil {
			t.Fatal(err)
		}
	}
	_ = pull.SetRcvtimeo(20 * time.Second) // a hang guard, not a timing assumption
	for _, w := range want {
		frames, err := pull.RecvMessageBytes(0)
		if err != nil {
			t.Fatal(err)
		}
		got, err := wire.DecodeOutbound(frames)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Encode(), w.Encode()) {
			t.Fatalf("got %+v want %+v", got, w)
		}
	}
	link.Close()
	link.Close()
	if err := link.Send(fr("x")); !errors.Is(err, ErrLinkClosed) {
		t.Fatalf("send after close: %v", err)
	}
	if st := link.Stats(); st.Sent != 2 || st.Failed != 0 {
		t.Fatalf("stats %+v", st)
	}
	_ = pull.Close()
	_ = zctx.Term()
}

func TestPushLinkQueueFull(t *testing.T) {
	// Nobody listens on the endpoint and the queue holds one message, so a burst overflows
	// it. Which sends are refused depends on scheduling, so the test only checks that Send
	// never blocks and that every message is accounted for exactly once.
	link, err := DialPush(PushConfig{Endpoint: "tcp://127.0.0.1:1", QueueSize: 1, SendTimeout: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var full int
	for range 5000 {
		if err := link.Send(fr("KV_STATUS", "1", "0", "0", "")); errors.Is(err, ErrLinkFull) {
			full++
		}
	}
	link.Close()
	st := link.Stats()
	if int(st.Dropped) < full || st.Sent+st.Dropped+st.Failed != 5000 {
		t.Fatalf("full=%d stats=%+v", full, st)
	}
}

func TestIngestIPv6(t *testing.T) {
	sink := newRecSink()
	in, err := StartIngest(IngestConfig{Host: "::1"}, sink)
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	defer in.Stop()
	if in.Endpoint() != TCPEndpoint("::1", in.Port()) || in.Endpoint()[:7] != "tcp://[" {
		t.Fatalf("endpoint %q", in.Endpoint())
	}
	link, err := DialPush(PushConfig{Endpoint: in.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	if err := link.Send(fr("ABORT", "7")); err != nil {
		t.Fatal(err)
	}
	if got := sink.wait(t, 1); got[0].(*wire.Abort).Room != 7 {
		t.Fatalf("got %#v", got[0])
	}
}

// The decode emulator's side: a raw PULL loop receiving what a PushLink sends.
func TestStartPullWithPushLink(t *testing.T) {
	got := make(chan [][]byte, 4)
	pull, err := StartPull(IngestConfig{Host: "127.0.0.1"}, func(f [][]byte) {
		if string(f[0]) == "boom" {
			panic("handler bug")
		}
		got <- f
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pull.Stop()
	link, err := DialPush(PushConfig{Endpoint: pull.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	for _, m := range [][][]byte{fr("boom"), (&wire.AbortAck{Room: 9, PrefillRank: 2}).Encode()} {
		if err := link.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case f := <-got:
		m, err := wire.DecodeOutbound(f)
		if err != nil || *m.(*wire.AbortAck) != (wire.AbortAck{Room: 9, PrefillRank: 2}) {
			t.Fatalf("%+v %v", m, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("timed out")
	}
	if st := pull.Stats(); st.Messages != 2 || st.SinkPanics != 1 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := StartPull(IngestConfig{}, nil); err == nil {
		t.Fatal("nil handler accepted")
	}
}

func TestSinkFuncs(t *testing.T) {
	var n int
	s := SinkFuncs{OnAbort: func(*wire.Abort) { n++ }, OnBadFrame: func(error) { n++ }}
	s.Abort(&wire.Abort{})
	s.BadFrame(nil)
	s.Registration(&wire.Registration{}) // nil field: dropped
	s.TransferInfo(&wire.TransferInfo{})
	s.Staging(&wire.Watermark{})
	if n != 2 {
		t.Fatal(n)
	}
	var _ Sink = SinkFuncs{}
}

// A decode whose PULL socket goes away (its process died) is noticed by the
// link's monitor; closing the link ourselves is not a loss.
func TestPushLinkNoticesPeerLoss(t *testing.T) {
	got := make(chan struct{}, 1)
	pull, err := StartPull(IngestConfig{Host: "127.0.0.1"}, func([][]byte) { got <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan struct{}, 4)
	link, err := DialPush(PushConfig{Endpoint: pull.Endpoint(), OnDisconnect: func() { lost <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	if err := link.Send(fr("hello")); err != nil {
		t.Fatal(err)
	}
	<-got // connected and delivered
	pull.Stop()
	select {
	case <-lost:
	case <-time.After(20 * time.Second):
		t.Fatal("the decode's PULL socket closed and the link never noticed")
	}

	quiet := make(chan struct{}, 4)
	pull2, err := StartPull(IngestConfig{Host: "127.0.0.1"}, func([][]byte) { got <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer pull2.Stop()
	link2, err := DialPush(PushConfig{Endpoint: pull2.Endpoint(), OnDisconnect: func() { quiet <- struct{}{} }})
	if err != nil {
		t.Fatal(err)
	}
	if err := link2.Send(fr("hello")); err != nil {
		t.Fatal(err)
	}
	<-got
	link2.Close()
	if len(quiet) != 0 {
		t.Fatal("closing our own link was reported as a lost decode")
	}
}

// A frame over MaxFrame never reaches kvxferd: libzmq drops the sender's
// connection (counted as a disconnect) before allocating it, and the ingest
// goes on serving that peer (it reconnects) and every other one. A frame of
// exactly MaxFrame is legal.
func TestIngestOversizeFrameDropped(t *testing.T) {
	const maxFrame = 4096
	sink := newRecSink()
	in, err := StartIngest(IngestConfig{Host: "127.0.0.1", PollInterval: 10 * time.Millisecond, MaxFrame: maxFrame}, sink)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	pages := func(n int) [][]byte {
		f := goldenTransferInfoFrames()
		f[5] = make([]byte, n)
		return f
	}
	flooder := testPush(t, zctx, in.Endpoint())
	defer func() { _ = flooder.Close() }()
	sendFrames(t, flooder, pages(maxFrame+4))
	deadline := time.Now().Add(20 * time.Second) // turns a hang into a failure only
	for in.Stats().Disconnects == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("oversize frame not dropped: %+v", in.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	honest := testPush(t, zctx, in.Endpoint())
	defer func() { _ = honest.Close() }()
	sendFrames(t, honest, pages(maxFrame))
	sendFrames(t, flooder, goldenTransferInfoFrames()) // the flooder reconnected
	got := sink.wait(t, 2)
	for i, g := range got {
		if _, ok := g.(*wire.TransferInfo); !ok {
			t.Fatalf("got[%d] = %#v", i, g)
		}
	}
	if st := in.Stats(); st.Messages != 2 || st.TransferInfos != 2 || st.Disconnects != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// The defaults: the largest legal transfer info fits, and the queue is bounded.
func TestIngestDefaultLimits(t *testing.T) {
	if mf, hwm := int64(DefaultMaxFrame), DefaultRcvHWM; mf != 16<<20 || hwm <= 0 {
		t.Fatalf("max frame %d, rcvhwm %d", DefaultMaxFrame, DefaultRcvHWM)
	}
	in, err := StartIngest(IngestConfig{Host: "127.0.0.1"}, newRecSink())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop()
	if in.cfg.MaxFrame != DefaultMaxFrame || in.cfg.RcvHWM != DefaultRcvHWM {
		t.Fatalf("config %+v", in.cfg)
	}
}
