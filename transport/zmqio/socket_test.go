package zmqio

import (
	"errors"
	"strings"
	"testing"

	zmq "github.com/pebbe/zmq4"
)

// TestNewSocketNamesTheFailingOption: options apply in order, the first failure
// stops the rest and is reported by name, and a shared context is not ours to end.
func TestNewSocketNamesTheFailingOption(t *testing.T) {
	zctx, term, err := ownContext(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer term()
	var applied []string
	opt := func(name string, err error) sockOpt {
		return sockOpt{name, func(*zmq.Socket) error { applied = append(applied, name); return err }}
	}
	_, err = newSocket(zctx, zmq.PUSH, "PUSH", opt("A", nil), opt("B", errors.New("boom")), opt("C", nil))
	if err == nil || !strings.Contains(err.Error(), "PUSH set B: boom") || strings.Join(applied, "") != "AB" {
		t.Fatalf("err %v, applied %v", err, applied)
	}
	sock, err := newSocket(zctx, zmq.PULL, "PULL", opt("D", nil))
	if err != nil {
		t.Fatal(err)
	}
	mon, err := monitorPair(zctx, sock, "PULL", zmq.EVENT_DISCONNECTED, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = mon.Close()
	_ = sock.Close()
	same, noop, err := ownContext(zctx)
	if err != nil || same != zctx {
		t.Fatalf("shared context: %v %v", same, err)
	}
	noop() // must leave the shared context alone
	s2, err := newSocket(zctx, zmq.PUSH, "PUSH")
	if err != nil {
		t.Fatalf("the shared context was terminated: %v", err)
	}
	_ = s2.Close()
}
