package zmqio

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// within fails the test if f has not returned after a generous bound: a
// guard against a hang, not a latency check.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: still blocked after 20 s", what)
	}
}

// TestWakerWakesBlockedPoll: a poll with no timeout returns once another
// goroutine calls Wake, and reports the waker's socket.
func TestWakerWakesBlockedPoll(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	w, err := NewWaker(zctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	p := zmq.NewPoller()
	p.Add(w.Socket(), zmq.POLLIN)
	polled := make(chan []zmq.Polled, 1)
	go func() {
		got, err := p.Poll(-1)
		if err != nil {
			t.Error(err)
		}
		polled <- got
	}()
	w.Wake()
	var got []zmq.Polled
	within(t, "poll after Wake", func() { got = <-polled })
	if len(got) != 1 || got[0].Socket != w.Socket() {
		t.Fatalf("polled %v, want the waker's socket", got)
	}
}

// TestWakerCoalescesAndDrains: wake-ups before a Drain are one; Drain leaves
// nothing readable; a Wake after Drain is readable again; Wake after Close
// does nothing.
func TestWakerCoalescesAndDrains(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	w, err := NewWaker(zctx)
	if err != nil {
		t.Fatal(err)
	}
	p := zmq.NewPoller()
	p.Add(w.Socket(), zmq.POLLIN)
	readable := func() bool {
		got, err := p.Poll(0)
		if err != nil {
			t.Fatal(err)
		}
		return len(got) == 1
	}
	if readable() {
		t.Fatal("readable before any Wake")
	}
	for range 1000 {
		w.Wake()
	}
	// One message was sent for the 1,000 wakes: one receive empties the pipe.
	if _, err := w.rx.RecvBytes(zmq.DONTWAIT); err != nil {
		t.Fatalf("no wake-up queued: %v", err)
	}
	if _, err := w.rx.RecvBytes(zmq.DONTWAIT); err == nil {
		t.Fatal("1,000 wakes before a drain queued more than one message")
	}
	w.Drain()
	if readable() {
		t.Fatal("readable after Drain")
	}
	w.Wake()
	if !readable() {
		t.Fatal("a Wake after Drain is not readable")
	}
	w.Drain()
	if readable() {
		t.Fatal("readable after the second Drain")
	}
	w.Close()
	w.Wake() // no panic, no send
	w.Close()
}

// TestIngestStopWakesIdlePoll: the ingest loop blocks with no timeout while
// idle (PollInterval only paces retries after socket errors), and Stop wakes
// it: with an hour's PollInterval, Stop still returns.
func TestIngestStopWakesIdlePoll(t *testing.T) {
	in, err := StartIngest(IngestConfig{Host: "127.0.0.1", PollInterval: time.Hour}, newRecSink())
	if err != nil {
		t.Fatal(err)
	}
	within(t, "Ingest.Stop", in.Stop)
}

// TestPushLinkCloseEndsWatcher: a link's disconnect watcher blocks with no
// receive timeout, and the link's close ends it (the monitor's
// MONITOR_STOPPED), so Close returns; connected or not.
func TestPushLinkCloseEndsWatcher(t *testing.T) {
	in, err := StartIngest(IngestConfig{Host: "127.0.0.1"}, newRecSink())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Stop()
	for _, ep := range []string{in.Endpoint(), "tcp://127.0.0.1:1"} {
		l, err := DialPush(PushConfig{Endpoint: ep, OnDisconnect: func() {}})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Send(fr("x")); err != nil {
			t.Fatal(err)
		}
		within(t, "PushLink.Close to "+ep, l.Close)
	}
}
