package zmqio

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

	"github.com/kvxfer/kvxfer/transport/loglimit"
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
	// the queue with blocking sends and lingers for libzmq to hand them to the
	// peer (a graceful shutdown's last KV_STATUS), all within FlushTimeout
	// overall, not per message. 0 keeps upstream's linger 0: queued messages
	// are dropped. CloseBy sets the bound explicitly.
	FlushTimeout time.Duration
	// OnDisconnect, when set, is called each time an established connection to
	// decode's PULL socket is lost (a ZMQ socket monitor sees the TCP
	// connection close: a decode process that died, SIGKILL included). It runs
	// on the link's monitor goroutine and must not block.
	OnDisconnect func()
	Logger       *slog.Logger
}

// PushStats are cumulative counters; read them from any goroutine.
type PushStats struct {
	Sent    uint64 // handed to libzmq
	Dropped uint64 // refused by Send (queue full) or discarded at Close
	Failed  uint64 // libzmq send errors (timeout, ...)
	// Discarded counts the part of Dropped that was still queued when the
	// close's flush deadline passed.
	Discarded uint64
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
	discarded             atomic.Uint64
	closing               atomic.Bool
	flushBy               atomic.Int64     // unix nanos: the close's flush deadline (0: no flush)
	logs                  loglimit.Limiter // the link goroutine's per-message warnings
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
		stop: make(chan struct{}), done: make(chan struct{}), logs: loglimit.New(time.Second, nil)}
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

// Close stops the link: with FlushTimeout 0, messages already queued are handed
// to libzmq without waiting and the socket is closed with linger 0; with
// FlushTimeout > 0 it is CloseBy(now + FlushTimeout). Idempotent.
func (l *PushLink) Close() {
	var by time.Time
	if l.cfg.FlushTimeout > 0 {
		by = time.Now().Add(l.cfg.FlushTimeout)
	}
	l.CloseBy(by)
}

// CloseBy stops the link and delivers what is still queued until deadline, and
// no later: blocking sends bounded by the time left, then a linger of the time
// left; whatever is still queued at the deadline is dropped (Stats.Dropped). A
// zero or past deadline drops without waiting. It returns once the socket is
// closed, which is bounded by the deadline (plus the monitor's 250 ms poll);
// with a shared Context the linger runs on in libzmq until Context.Term, which
// it bounds the same way. Only the first Close or CloseBy sets the deadline.
func (l *PushLink) CloseBy(deadline time.Time) {
	l.stopOnce.Do(func() {
		if !deadline.IsZero() {
			l.flushBy.Store(deadline.UnixNano())
		}
		close(l.stop)
	})
	<-l.done
}

// Stats returns a snapshot of the counters.
func (l *PushLink) Stats() PushStats {
	return PushStats{Sent: l.sent.Load(), Dropped: l.dropped.Load(), Failed: l.failed.Load(), Discarded: l.discarded.Load()}
}

func (l *PushLink) run(ready chan<- error) {
	defer close(l.done)
	zctx, term, err := ownContext(l.cfg.Context)
	if err != nil {
		ready <- err
		return
	}
	defer term()
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
	stopWatch := func() {
		l.closing.Store(true) // our own close is not a lost decode
		// Stopping the monitor sends MONITOR_STOPPED (it is in the event
		// mask), which ends the watcher's blocking receive; libzmq 4.3 sends
		// none when the socket closes.
		_ = sock.Monitor("", 0)
		_ = sock.Close()
		<-watched // the watcher closes its socket before the context ends
	}
	if err := sock.Connect(l.cfg.Endpoint); err != nil {
		stopWatch()
		ready <- fmt.Errorf("transport: PUSH connect %s: %w", l.cfg.Endpoint, err)
		return
	}
	defer stopWatch()
	ready <- nil
	for {
		select {
		case frames := <-l.queue:
			l.sendUntil(sock, frames, time.Now().Add(l.cfg.SendTimeout))
		case <-l.stop:
			l.flush(sock)
			return
		}
	}
}

// flushDeadline is the close's flush deadline (zero: no flush).
func (l *PushLink) flushDeadline() time.Time {
	if n := l.flushBy.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// flush sends what is queued within the close's deadline and sets the linger
// to the time then left; the rest is dropped.
func (l *PushLink) flush(sock *zmq.Socket) {
	by := l.flushDeadline()
	dropped := 0
	for {
		var frames [][]byte
		select {
		case frames = <-l.queue:
		default:
			if dropped > 0 {
				l.log.Warn("transport: PUSH link closed; queued messages dropped at the flush deadline",
					"endpoint", l.cfg.Endpoint, "dropped", dropped)
			}
			_ = sock.SetLinger(max(time.Until(by), 0))
			return
		}
		left := time.Until(by)
		switch {
		case len(frames) == 0:
			continue
		case by.IsZero():
			l.sendNow(sock, frames)
			continue
		case left <= 0:
			l.dropped.Add(1)
			l.discarded.Add(1)
			dropped++
			continue
		}
		l.sendUntil(sock, frames, by)
	}
}

// sendStep is the longest one blocking send waits before sendUntil looks
// again whether the link is closing.
const sendStep = 100 * time.Millisecond

// sendUntil sends one message, blocking until limit at most. It blocks in
// steps of sendStep so that a Close is noticed: from then on the limit is the
// close's flush deadline if that is sooner (no flush: now).
func (l *PushLink) sendUntil(sock *zmq.Socket, frames [][]byte, limit time.Time) {
	if len(frames) == 0 {
		return
	}
	// Most messages find room in libzmq's queue at once: try without waiting
	// first, which needs no send timeout set (a setsockopt, one more cgo
	// call, per message). A closing link takes the timed path, which applies
	// the close's deadline.
	select {
	case <-l.stop:
	default:
		first, err := sendParts(sock, frames, zmq.DONTWAIT)
		if err == nil {
			l.sent.Add(1)
			return
		}
		if !first || zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
			l.failed.Add(1)
			l.warn(err)
			return
		}
	}
	for {
		select {
		case <-l.stop:
			if by := l.flushDeadline(); by.Before(limit) {
				limit = by
			}
		default:
		}
		left := time.Until(limit)
		if left <= 0 {
			l.failed.Add(1)
			l.warn(zmq.Errno(syscall.EAGAIN))
			return
		}
		_ = sock.SetSndtimeo(max(min(left, sendStep), time.Millisecond))
		first, err := sendParts(sock, frames, 0)
		if err == nil {
			l.sent.Add(1)
			return
		}
		if first && zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
			continue // nothing was queued: try again until the limit
		}
		l.failed.Add(1)
		l.warn(err)
		return
	}
}

// sendParts sends a multipart message part by part. Only the first part can
// time out (first reports it): libzmq takes the rest of a message whose first
// part it accepted, so a first part refused left nothing queued.
func sendParts(sock *zmq.Socket, frames [][]byte, flags zmq.Flag) (first bool, err error) {
	for i, f := range frames {
		opt := flags
		if i < len(frames)-1 {
			opt |= zmq.SNDMORE
		}
		if _, err := sock.SendBytes(f, opt); err != nil {
			return i == 0, err
		}
	}
	return false, nil
}

// warn logs a failed send, at most one line a second (the link goroutine's).
func (l *PushLink) warn(err error) {
	if ok, suppressed := l.logs.Allow(); ok {
		l.log.Warn("transport: PUSH send failed", "endpoint", l.cfg.Endpoint, "err", err, "suppressed", suppressed)
	}
}

func (l *PushLink) open(zctx *zmq.Context) (*zmq.Socket, error) {
	opts := []sockOpt{
		{"LINGER", func(s *zmq.Socket) error { return s.SetLinger(0) }},
		{"SNDTIMEO", func(s *zmq.Socket) error { return s.SetSndtimeo(l.cfg.SendTimeout) }},
		{"TCP_KEEPALIVE", func(s *zmq.Socket) error { return s.SetTcpKeepalive(1) }},
		{"TCP_KEEPALIVE_IDLE", func(s *zmq.Socket) error { return s.SetTcpKeepaliveIdle(30) }},
		{"TCP_KEEPALIVE_INTVL", func(s *zmq.Socket) error { return s.SetTcpKeepaliveIntvl(5) }},
		{"TCP_KEEPALIVE_CNT", func(s *zmq.Socket) error { return s.SetTcpKeepaliveCnt(3) }},
	}
	if strings.Contains(l.cfg.Endpoint, "[") { // tcp://[v6]:port
		opts = append(opts, sockOpt{"IPV6", func(s *zmq.Socket) error { return s.SetIpv6(true) }})
	}
	return newSocket(zctx, zmq.PUSH, "PUSH", opts...)
}

// monitor starts a ZMQ socket monitor on sock (before it connects) and returns
// the PAIR socket its events arrive on.
func (l *PushLink) monitor(zctx *zmq.Context, sock *zmq.Socket) (*zmq.Socket, bool) {
	if l.cfg.OnDisconnect == nil {
		return nil, false
	}
	// No receive timeout: the watcher blocks until an event, and the link's
	// close sends it MONITOR_STOPPED (an idle link costs no CPU, and no
	// sockets or fds beyond the monitor's).
	mon, err := monitorPair(zctx, sock, "PUSH", zmq.EVENT_CONNECTED|zmq.EVENT_DISCONNECTED|zmq.EVENT_MONITOR_STOPPED, 0)
	if err != nil {
		l.log.Warn("transport: PUSH monitor; decode loss will not be detected on this link", "endpoint", l.cfg.Endpoint, "err", err)
		return nil, false
	}
	return mon, true
}

// watch owns the monitor socket: every loss of an established connection calls
// OnDisconnect. It ends when the link stops the monitor (MONITOR_STOPPED).
func (l *PushLink) watch(mon *zmq.Socket, done chan<- struct{}) {
	defer close(done)
	defer func() { _ = mon.Close() }()
	connected := false
	for {
		ev, _, _, err := mon.RecvEvent(0)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			return // ETERM: the context is ending
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

// sendNow hands one message to libzmq without waiting; refused, it is dropped.
func (l *PushLink) sendNow(sock *zmq.Socket, frames [][]byte) {
	if len(frames) == 0 {
		return
	}
	if _, err := sendParts(sock, frames, zmq.DONTWAIT); err != nil {
		l.dropped.Add(1)
		l.warn(err)
		return
	}
	l.sent.Add(1)
}
