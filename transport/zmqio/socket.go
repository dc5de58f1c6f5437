package zmqio

import (
	"fmt"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// The socket start-up both socket owners (Ingest's PULL, PushLink's PUSH) share:
// a context of their own unless given one, a socket with its options applied in
// order, and a socket monitor read on an inproc PAIR socket.

// ownContext returns shared, or a new context and the func that terminates it
// (after every socket on it is closed).
func ownContext(shared *zmq.Context) (*zmq.Context, func(), error) {
	if shared != nil {
		return shared, func() {}, nil
	}
	c, err := zmq.NewContext()
	if err != nil {
		return nil, nil, fmt.Errorf("transport: zmq context: %w", err)
	}
	return c, func() { _ = c.Term() }, nil
}

// sockOpt is one socket option, named for the error it may cause.
type sockOpt struct {
	name string
	set  func(*zmq.Socket) error
}

// newSocket creates a socket of type t and applies opts in order; the first
// failure closes it. role names it in errors ("PULL", "PUSH").
func newSocket(zctx *zmq.Context, t zmq.Type, role string, opts ...sockOpt) (*zmq.Socket, error) {
	sock, err := zctx.NewSocket(t)
	if err != nil {
		return nil, fmt.Errorf("transport: %s socket: %w", role, err)
	}
	for _, o := range opts {
		if err := o.set(sock); err != nil {
			_ = sock.Close()
			return nil, fmt.Errorf("transport: %s set %s: %w", role, o.name, err)
		}
	}
	return sock, nil
}

var monitorSeq atomic.Uint64

// monitorPair starts a monitor of events on sock and returns the PAIR socket
// they arrive on (linger 0; rcvTimeout, if positive, bounds each receive).
func monitorPair(zctx *zmq.Context, sock *zmq.Socket, role string, events zmq.Event, rcvTimeout time.Duration) (*zmq.Socket, error) {
	addr := fmt.Sprintf("inproc://kvxfer-%s-monitor-%d", role, monitorSeq.Add(1))
	if err := sock.Monitor(addr, events); err != nil {
		return nil, fmt.Errorf("transport: %s monitor: %w", role, err)
	}
	mon, err := newSocket(zctx, zmq.PAIR, role+" monitor",
		sockOpt{"LINGER", func(s *zmq.Socket) error { return s.SetLinger(0) }},
		sockOpt{"RCVTIMEO", func(s *zmq.Socket) error {
			if rcvTimeout > 0 {
				return s.SetRcvtimeo(rcvTimeout)
			}
			return nil
		}})
	if err != nil {
		return nil, err
	}
	if err := mon.Connect(addr); err != nil {
		_ = mon.Close()
		return nil, fmt.Errorf("transport: %s monitor: %w", role, err)
	}
	return mon, nil
}
