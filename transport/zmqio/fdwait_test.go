//go:build linux

package zmqio

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// TestFDWaitWakesOnMessages: the netpoller wait (the ingest's, instead of a
// blocking zmq_poll) returns once a message reaches a watched socket, and
// readable then says so; drained, the socket is not readable and the next
// wait lasts until the next message, for every message of a run of them.
func TestFDWaitWakesOnMessages(t *testing.T) {
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	pull, err := zctx.NewSocket(zmq.PULL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pull.Close() }()
	_ = pull.SetLinger(0)
	if err := pull.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := pull.GetLastEndpoint()
	other, err := zctx.NewSocket(zmq.PULL) // watched, never sent to
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close() }()
	_ = other.SetLinger(0)
	push, err := zctx.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = push.Close() }()
	_ = push.SetLinger(0)
	if err := push.Connect(ep); err != nil {
		t.Fatal(err)
	}
	fw, err := newFDWait(other, pull)
	if err != nil {
		t.Fatal(err)
	}
	defer fw.close()
	for i := range 200 {
		if ok, err := readable(other, pull); err != nil || ok {
			t.Fatalf("round %d: readable %v %v before a send", i, ok, err)
		}
		woke := make(chan error, 1)
		go func() {
			for {
				if ok, err := readable(other, pull); err != nil || ok {
					woke <- err
					return
				}
				if err := fw.wait(); err != nil {
					woke <- err
					return
				}
			}
		}()
		if _, err := push.SendMessage("m", i); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-woke:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: no wake-up for a message", i)
		}
		if _, err := pull.RecvMessageBytes(zmq.DONTWAIT); err != nil {
			t.Fatalf("round %d: woken but nothing to read: %v", i, err)
		}
	}
}
