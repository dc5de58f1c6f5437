//go:build linux

package zmqio

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// TestFDWaitWakesOnMessages: the netpoller wait (the ingest's, instead of a
// blocking zmq_poll) returns once a message reaches a watched socket and
// names that socket; once a receive on it came back empty, the next message
// wakes the wait again, for every message of a run of them. (A wake may also
// come for libzmq's own commands, a connection's among them, with nothing to
// read: the reader then waits again, as the ingest does.)
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
		woke := make(chan error, 1)
		go func() {
			for {
				fired, err := fw.wait()
				if err != nil {
					woke <- err
					return
				}
				if fired&^3 != 0 {
					woke <- fmt.Errorf("wait names sockets %b of 2", fired)
					return
				}
				if fired&2 == 0 {
					continue
				}
				if _, err := pull.RecvMessageBytes(zmq.DONTWAIT); zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
					continue // a command, not the message
				} else if err != nil {
					woke <- err
					return
				}
				_, err = pull.RecvMessageBytes(zmq.DONTWAIT)
				if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
					err = fmt.Errorf("a second message or another error: %v", err)
				} else {
					err = nil
				}
				woke <- err
				return
			}
		}()
		if _, err := push.SendMessage("m", i); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-woke:
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: no wake-up for a message", i)
		}
	}
}
