package zmqio

import (
	"net"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// deadEndpoint is a loopback TCP endpoint nobody listens on.
func deadEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return TCPEndpoint("127.0.0.1", port)
}

// Attack F3 (docs/hostile.md): a link owed 10,000 messages by a dead decode closes by its
// flush deadline, however many are queued and however long one send may
// block, and every message is accounted for. The margin is generous: this
// asserts a bound, not a speed.
func TestPushLinkCloseByBoundsTheFlush(t *testing.T) {
	const n, flush, margin = 10000, 500 * time.Millisecond, 10 * time.Second
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	for _, shared := range []bool{false, true} {
		cfg := PushConfig{Endpoint: deadEndpoint(t), QueueSize: n, FlushTimeout: time.Minute}
		if shared {
			cfg.Context = zctx
		}
		link, err := DialPush(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := link.Send(fr("KV_STATUS", "1", "0", "0", "x")); err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
		}
		start := time.Now()
		link.CloseBy(start.Add(flush))
		if took := time.Since(start); took > flush+margin {
			t.Fatalf("shared=%v: CloseBy took %v, bound %v", shared, took, flush)
		}
		st := link.Stats()
		if st.Sent+st.Dropped+st.Failed != n || st.Discarded == 0 || st.Discarded > st.Dropped {
			t.Fatalf("shared=%v: stats %+v", shared, st)
		}
	}
	// The context's own end is bounded by the linger CloseBy left: none.
	start := time.Now()
	if err := zctx.Term(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > margin {
		t.Fatalf("Term took %v", took)
	}
}

// A send blocked on a full pipe (SendTimeout long) does not hold Close up:
// Close without a flush returns without waiting out the send's timeout.
func TestPushLinkCloseInterruptsABlockedSend(t *testing.T) {
	link, err := DialPush(PushConfig{Endpoint: deadEndpoint(t), QueueSize: 4096, SendTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for range 4096 {
		_ = link.Send(fr("KV_STATUS", "1", "0", "0", "x"))
	}
	// Poll (not sleep) until the link goroutine is stuck behind the pipe's HWM.
	deadline := time.Now().Add(20 * time.Second)
	for link.Stats().Sent < 1000 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	link.Close()
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Close took %v with a send blocked for up to an hour", took)
	}
	if st := link.Stats(); st.Sent+st.Dropped+st.Failed != 4096 {
		t.Fatalf("stats %+v", st)
	}
}
