package zmqio

import (
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// KeepAlive's options reach the socket (whole seconds, at least 1), and an
// ingest with them binds.
func TestKeepAliveOptions(t *testing.T) {
	zctx, term, err := ownContext(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer term()
	k := &KeepAlive{Idle: 1500 * time.Millisecond, Interval: 10 * time.Millisecond, Count: 4}
	sock, err := newSocket(zctx, zmq.PULL, "PULL", k.opts()...)
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	on, _ := sock.GetTcpKeepalive()
	idle, _ := sock.GetTcpKeepaliveIdle()
	intvl, _ := sock.GetTcpKeepaliveIntvl()
	cnt, _ := sock.GetTcpKeepaliveCnt()
	if on != 1 || idle != 1 || intvl != 1 || cnt != 4 {
		t.Fatalf("keepalive %d idle %d interval %d count %d", on, idle, intvl, cnt)
	}
	big, err := newSocket(zctx, zmq.PULL, "PULL", (&KeepAlive{Count: 500}).opts()...)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	if cnt, _ := big.GetTcpKeepaliveCnt(); cnt != 127 {
		t.Fatalf("count %d: want Linux's bound 127 (a larger one fails every accepted connection)", cnt)
	}
	in, err := StartIngest(IngestConfig{Host: "127.0.0.1", KeepAlive: k}, SinkFuncs{})
	if err != nil {
		t.Fatal(err)
	}
	in.Stop()
}
