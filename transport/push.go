package transport

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Errors returned by PushLink.Send.
var (
	ErrLinkFull   = errors.New("transport: push link queue full")
	ErrLinkClosed = errors.New("transport: push link closed")
)

// PushConfig configures a prefill->decode PUSH link (upstream CommonKVManager._connect).
type PushConfig struct {
	// Context to create the socket in; nil: the link creates (and terminates) its own.
	Context *zmq.Context
	// Endpoint of decode's PULL socket, e.g. TCPEndpoint(info.DecodeIP, info.DecodePort).
	Endpoint string
	// SendTimeout bounds one blocking send (upstream SNDTIMEO 30 s): 0 means 30 s.
	SendTimeout time.Duration
	// QueueSize is the number of messages Send may queue ahead of the socket: 0 means 1024.
	QueueSize int
	// FlushTimeout, when > 0, makes Close deliver what is still queued: it sends
	// the queue with blocking sends bounded by FlushTimeout each and lingers up
	// to FlushTimeout for libzmq to hand them to the peer (a graceful shutdown's
	// last KV_STATUS). 0 keeps upstream's linger 0: queued messages are dropped.
	FlushTimeout time.Duration
	// OnDisconnect, when set, is called each time an established connection to
	// decode's PULL socket is lost (a ZMQ socket monitor sees the TCP
	// connection close: a decode process that died, SIGKILL included). It runs
	// on the link's monitor goroutine and must not block.
	OnDisconnect func()
	Logger       *slog.Logger
}

var monitorSeq atomic.Uint64

// PushStats are cumulative counters; read them from any goroutine.
type PushStats struct {
	Sent    uint64 // handed to libzmq
	Dropped uint64 // refused by Send (queue full) or discarded at Close
	Failed  uint64 // libzmq send errors (timeout, ...)
}

// PushLink sends multipart messages to one decode PULL socket. One goroutine owns the
// socket; Send only enqueues, so callers (actors) never block on the network.
//
// Delivery is best effort, as upstream: linger is 0, so messages still queued in libzmq
// when the link closes are dropped. Unlike upstream (RECONNECT_IVL -1 plus a disconnect
// monitor that rebuilds the socket) the link relies on libzmq's own reconnection.
type PushLink struct {
	cfg   PushConfig
	log   *slog.Logger
	queue chan [][]byte

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once

	sent, dropped, failed atomic.Uint64
	closing               atomic.Bool
}

// DialPush creates the socket and connects it (connect is asynchronous in ZMQ: it succeeds
// whether or not decode is listening yet).
func DialPush(cfg PushConfig) (*PushLink, error) {
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = 30 * time.Second
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 1024
	}
	l := &PushLink{cfg: cfg, log: cfg.Logger, queue: make(chan [][]byte, cfg.QueueSize),
		stop: make(chan struct{}), done: make(chan struct{})}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	ready := make(chan error, 1)
	go l.run(ready)
	if err := <-ready; err != nil {
		<-l.done
		return nil, err
	}
	return l, nil
}

// Send queues one multipart message. It never blocks: ErrLinkFull when the queue is full,
// ErrLinkClosed after Close. The frames must not be modified afterwards.
func (l *PushLink) Send(frames [][]byte) error {
	select {
	case <-l.stop:
		return ErrLinkClosed
	default:
	}
	select {
	case l.queue <- frames:
		return nil
	default:
		l.dropped.Add(1)
		return ErrLinkFull
	}
}

// Close stops the link: messages already queued are handed to libzmq without waiting,
// then the socket is closed with linger 0. Idempotent.
func (l *PushLink) Close() {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
}

// Stats returns a snapshot of the counters.
func (l *PushLink) Stats() PushStats {
	return PushStats{Sent: l.sent.Load(), Dropped: l.dropped.Load(), Failed: l.failed.Load()}
}

func (l *PushLink) run(ready chan<- error) {
	defer close(l.done)
	zctx := l.cfg.Context
	if zctx == nil {
		c, err := zmq.NewContext()
		if err != nil {
			ready <- fmt.Errorf("transport: zmq context: %w", err)
			return
		}
		zctx = c
		defer func() { _ = c.Term() }()
	}
	sock, err := l.open(zctx)
	if err != nil {
		ready <- err
		return
	}
	watched := make(chan struct{})
	if mon, ok := l.monitor(zctx, sock); ok {
		go l.watch(mon, watched)
	} else {
		close(watched)
	}
	if err := sock.Connect(l.cfg.Endpoint); err != nil {
		_ = sock.Close()
		<-watched
		ready <- fmt.Errorf("transport: PUSH connect %s: %w", l.cfg.Endpoint, err)
		return
	}
	defer func() {
		l.closing.Store(true)   // our own close is not a lost decode
		_ = sock.Monitor("", 0) // MONITOR_STOPPED ends the watcher (libzmq 4.3 sends none on close)
		_ = sock.Close()
		<-watched // the watcher closes its socket before the context ends
	}()
	ready <- nil
	for {
		select {
		case frames := <-l.queue:
			l.send(sock, frames, 0)
		case <-l.stop:
			flags := zmq.DONTWAIT
			if l.cfg.FlushTimeout > 0 {
				flags = 0
				_ = sock.SetSndtimeo(l.cfg.FlushTimeout)
				_ = sock.SetLinger(l.cfg.FlushTimeout)
			}
			for {
				select {
				case frames := <-l.queue:
					l.send(sock, frames, flags)
				default:
					return
				}
			}
		}
	}
}

func (l *PushLink) open(zctx *zmq.Context) (*zmq.Socket, error) {
	sock, err := zctx.NewSocket(zmq.PUSH)
	if err != nil {
		return nil, fmt.Errorf("transport: PUSH socket: %w", err)
	}
	opts := []struct {
		name string
		set  func() error
	}{
		{"LINGER", func() error { return sock.SetLinger(0) }},
		{"SNDTIMEO", func() error { return sock.SetSndtimeo(l.cfg.SendTimeout) }},
		{"TCP_KEEPALIVE", func() error { return sock.SetTcpKeepalive(1) }},
		{"TCP_KEEPALIVE_IDLE", func() error { return sock.SetTcpKeepaliveIdle(30) }},
		{"TCP_KEEPALIVE_INTVL", func() error { return sock.SetTcpKeepaliveIntvl(5) }},
		{"TCP_KEEPALIVE_CNT", func() error { return sock.SetTcpKeepaliveCnt(3) }},
	}
	if strings.Contains(l.cfg.Endpoint, "[") { // tcp://[v6]:port
		opts = append(opts, struct {
			name string
			set  func() error
		}{"IPV6", func() error { return sock.SetIpv6(true) }})
	}
	for _, o := range opts {
		if err := o.set(); err != nil {
			_ = sock.Close()
			return nil, fmt.Errorf("transport: PUSH set %s: %w", o.name, err)
		}
	}
	return sock, nil
}

// monitor starts a ZMQ socket monitor on sock (before it connects) and returns
// the PAIR socket its events arrive on.
func (l *PushLink) monitor(zctx *zmq.Context, sock *zmq.Socket) (*zmq.Socket, bool) {
	if l.cfg.OnDisconnect == nil {
		return nil, false
	}
	addr := fmt.Sprintf("inproc://kvxfer-push-monitor-%d", monitorSeq.Add(1))
	if err := sock.Monitor(addr, zmq.EVENT_CONNECTED|zmq.EVENT_DISCONNECTED); err != nil {
		l.log.Warn("transport: PUSH monitor; decode loss will not be detected on this link", "endpoint", l.cfg.Endpoint, "err", err)
		return nil, false
	}
	mon, err := zctx.NewSocket(zmq.PAIR)
	if err == nil {
		_ = mon.SetLinger(0)
		_ = mon.SetRcvtimeo(250 * time.Millisecond) // so a closing link never waits on it for long
		err = mon.Connect(addr)
	}
	if err != nil {
		l.log.Warn("transport: PUSH monitor socket", "endpoint", l.cfg.Endpoint, "err", err)
		if mon != nil {
			_ = mon.Close()
		}
		return nil, false
	}
	return mon, true
}

// watch owns the monitor socket: every loss of an established connection calls
// OnDisconnect. It ends when the monitored socket closes (MONITOR_STOPPED).
func (l *PushLink) watch(mon *zmq.Socket, done chan<- struct{}) {
	defer close(done)
	defer func() { _ = mon.Close() }()
	connected := false
	for {
		ev, _, _, err := mon.RecvEvent(0)
		if err != nil {
			if e := zmq.AsErrno(err); (e == zmq.Errno(syscall.EINTR) || e == zmq.Errno(syscall.EAGAIN)) && !l.closing.Load() {
				continue
			}
			return
		}
		switch ev {
		case zmq.EVENT_CONNECTED:
			connected = true
		case zmq.EVENT_DISCONNECTED:
			if connected && !l.closing.Load() {
				l.cfg.OnDisconnect()
			}
			connected = false
		case zmq.EVENT_MONITOR_STOPPED:
			return
		}
	}
}

func (l *PushLink) send(sock *zmq.Socket, frames [][]byte, flags zmq.Flag) {
	if len(frames) == 0 {
		return
	}
	var err error
	if flags&zmq.DONTWAIT != 0 {
		_, err = sock.SendMessageDontwait(frames)
	} else {
		_, err = sock.SendMessage(frames)
	}
	if err != nil {
		if flags&zmq.DONTWAIT != 0 {
			l.dropped.Add(1)
		} else {
			l.failed.Add(1)
		}
		l.log.Warn("transport: PUSH send failed", "endpoint", l.cfg.Endpoint, "err", err)
		return
	}
	l.sent.Add(1)
}
