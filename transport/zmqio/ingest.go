package zmqio

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/transport/loglimit"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// Sink receives what the ingest loop decodes. Every method is called from the ingest
// goroutine, one message at a time, in arrival order; it must not block (hand the message
// to an actor mailbox and return). A panic in a Sink method is recovered, counted and
// logged, and the loop goes on.
type Sink interface {
	Registration(*wire.Registration)
	TransferInfo(*wire.TransferInfo)
	Abort(*wire.Abort)
	// Staging gets WATERMARK and STAGING_RSP (*Watermark, *StagingRsp). kvxfer does not do
	// staging, so callers drop them; they are passed on only to be counted or logged.
	Staging(wire.Inbound)
	// BadFrame gets every message that failed to decode: a *FrameError, errors.Is
	// ErrUnknownTag for an unknown tag. FrameError.HasRoom tells when the room is known.
	BadFrame(err error)
}

// BatchSink is a Sink that also takes transfer infos in runs: when the Sink implements
// it, the ingest hands every run of consecutive transfer infos of one drained batch (up to
// 512 messages) to TransferInfos in one call, in arrival order, instead of one
// TransferInfo call each; any other message ends the run first, so the order across kinds
// is kept. The slice is the ingest's and is reused: keep the messages, not the slice.
type BatchSink interface {
	TransferInfos(ts []*wire.TransferInfo)
}

// RegistrationFramesSink is a Sink that also wants a registration's frames as received:
// when the Sink implements it, registrations go to RegistrationFrames instead of
// Registration (kvxferd keeps accepted ones to replay after a restart). The frames are
// the socket's; r aliases them.
type RegistrationFramesSink interface {
	RegistrationFrames(r *wire.Registration, frames [][]byte)
}

// IngestConfig configures the prefill-side PULL socket.
type IngestConfig struct {
	// Context to create the socket in; nil: the ingest creates (and terminates) its own.
	Context *zmq.Context
	// Host is the IP to bind (the rank IP published via PUT /route). IPv6 literals are
	// fine; "" or "*" binds every interface.
	Host string
	// Port to bind; 0 picks a random free port (upstream bind_to_random_port). See Port().
	Port int
	// PollInterval is the pause after a socket error before the loop tries
	// again: 0 means 50 ms. The loop blocks without a timeout otherwise (Stop
	// wakes it), so an idle ingest costs no CPU.
	PollInterval time.Duration
	// RcvBuf sets SO_RCVBUF when > 0 (upstream uses 512 MiB on large hosts).
	RcvBuf int
	// Logger for bad frames and socket errors; nil discards. Bad-frame lines are rate
	// limited to one per LogEvery (0: 1 s), with a count of the suppressed ones.
	Logger   *slog.Logger
	LogEvery time.Duration
	// MaxFrame caps one frame (ZMQ_MAXMSGSIZE): libzmq reads a frame's length first and
	// drops the connection of a peer that announces more, before allocating it (counted in
	// IngestStats.Disconnects; the peer's PUSH socket reconnects). 0: DefaultMaxFrame;
	// negative: no cap (upstream).
	MaxFrame int64
	// RcvHWM bounds the messages queued per connection before libzmq stops reading it
	// (TCP then pushes back on the sender). 0: DefaultRcvHWM; negative: unbounded, as
	// upstream's RCVHWM 0.
	RcvHWM int
	// Before, when set, runs once on the loop goroutine after the socket is bound and
	// before anything is read from it: work that must come before the first decode frame
	// and may touch what only the Sink's goroutine touches (kvxferd replays remembered
	// registrations there). A panic in it is recovered and counted as a Sink panic.
	Before func()
	// KeepAlive, when set, turns TCP keepalive on for every decode connection: the
	// kernel closes a connection whose peer acknowledged nothing for about Idle +
	// Interval×Count, and data that peer's kernel retransmits afterwards is refused
	// (RST), never read. kvxferd sets it below decode's heartbeat budget, so that
	// frames decode sent before it gave its rooms up cannot arrive after a long
	// link outage (docs/kvxferd.md, decode liveness). nil: the OS default (off).
	KeepAlive *KeepAlive
}

// KeepAlive is TCP keepalive on a socket's connections, in whole seconds (libzmq's
// unit; anything below a second is a second).
type KeepAlive struct {
	Idle, Interval time.Duration
	Count          int
}

func (k *KeepAlive) opts() []sockOpt {
	secs := func(d time.Duration) int { return max(int(d/time.Second), 1) }
	return []sockOpt{
		{"TCP_KEEPALIVE", func(s *zmq.Socket) error { return s.SetTcpKeepalive(1) }},
		{"TCP_KEEPALIVE_IDLE", func(s *zmq.Socket) error { return s.SetTcpKeepaliveIdle(secs(k.Idle)) }},
		{"TCP_KEEPALIVE_INTVL", func(s *zmq.Socket) error { return s.SetTcpKeepaliveIntvl(secs(k.Interval)) }},
		{"TCP_KEEPALIVE_CNT", func(s *zmq.Socket) error { return s.SetTcpKeepaliveCnt(min(max(k.Count, 1), 127)) }}, // Linux's bound
	}
}

// The largest legal frame. A transfer info's dst_kv_indices is 4 bytes a page and is the
// largest frame any decode sends: MaxTransferInfoPages pages (a 4M-token request at page
// size 1) make 16 MiB. A registration's frames are far smaller: the NIXL agent metadata
// (connection info plus one descriptor per registered region: tens to hundreds of KiB) and
// pointer arrays of 8 bytes a buffer (a few thousand at most). The other frames are a
// room id, an address, small integers and an agent name.
const (
	MaxTransferInfoPages = 1 << 22
	DefaultMaxFrame      = 4 * MaxTransferInfoPages
	// DefaultRcvHWM is libzmq's own default. The loop drains the socket without
	// blocking (the Sink only hands messages to mailboxes), so the queue fills only
	// while kvxferd is overwhelmed, and then the senders wait instead of kvxferd's
	// memory growing.
	DefaultRcvHWM = 1000
)

// IngestStats are cumulative counters; read them from any goroutine.
type IngestStats struct {
	Messages      uint64 // every multipart message received
	Registrations uint64
	TransferInfos uint64
	Aborts        uint64
	Staging       uint64 // WATERMARK + STAGING_RSP, accepted and dropped
	BadFrames     uint64 // failed to decode, unknown tags included
	UnknownTags   uint64
	SinkPanics    uint64
	RecvErrors    uint64 // socket errors other than EAGAIN/EINTR
	// Disconnects counts peer connections libzmq closed: a frame over MaxFrame (the
	// frame is never read, the peer reconnects), or the peer going away.
	Disconnects uint64
}

// useRx selects the batch receiver (rx.go); tests turn it off to cover zmq4's
// per-frame path, which is also the fallback when the socket handle cannot be read.
var useRx = true

// drainBatch bounds how many messages are drained between stop checks.
const drainBatch = 4096

// Ingest owns the PULL socket: one goroutine creates, binds, reads and closes it (zmq
// sockets are not goroutine safe). It decodes every message with DecodeInbound and hands
// the result to the Sink; no input can stop it, only Stop.
type Ingest struct {
	cfg      IngestConfig
	sink     Sink
	raw      func(frames [][]byte) // StartPull: frames go here undecoded
	log      *slog.Logger
	endpoint string
	port     int

	stop     chan struct{}
	done     chan struct{} // closed when the loop has exited and the socket is closed
	stopOnce sync.Once
	waker    *Waker // Stop wakes the loop's poll

	messages, registrations, transferInfos, aborts, staging atomic.Uint64
	badFrames, unknownTags, sinkPanics, recvErrors          atomic.Uint64
	disconnects                                             atomic.Uint64

	limiter loglimit.Limiter     // owner goroutine only
	tiRun   []*wire.TransferInfo // owner goroutine only: the BatchSink run
	dec     wire.Decoder         // owner goroutine only
}

// StartIngest binds the PULL socket and starts the loop. It returns once the socket is
// bound (or failed to), so Port() is valid on return.
func StartIngest(cfg IngestConfig, sink Sink) (*Ingest, error) {
	if sink == nil {
		return nil, errors.New("transport: StartIngest needs a Sink")
	}
	return start(cfg, &Ingest{sink: sink})
}

// StartPull is StartIngest without the decoding: every multipart message goes to h as it
// was received. The decode emulator uses it for its own PULL socket (prefill->decode
// messages, see DecodeOutbound). h runs on the socket's goroutine and must not block; a
// panic in h is recovered and counted. Only Messages and SinkPanics are counted.
func StartPull(cfg IngestConfig, h func(frames [][]byte)) (*Ingest, error) {
	if h == nil {
		return nil, errors.New("transport: StartPull needs a handler")
	}
	return start(cfg, &Ingest{raw: h})
}

func start(cfg IngestConfig, in *Ingest) (*Ingest, error) {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	if cfg.LogEvery <= 0 {
		cfg.LogEvery = time.Second
	}
	if cfg.MaxFrame == 0 {
		cfg.MaxFrame = DefaultMaxFrame
	}
	if cfg.RcvHWM == 0 {
		cfg.RcvHWM = DefaultRcvHWM
	}
	in.cfg, in.log, in.stop, in.done = cfg, cfg.Logger, make(chan struct{}), make(chan struct{})
	if in.log == nil {
		in.log = slog.New(slog.DiscardHandler)
	}
	in.limiter = loglimit.New(cfg.LogEvery, time.Now)
	ready := make(chan error, 1)
	go in.run(ready)
	if err := <-ready; err != nil {
		<-in.done
		return nil, err
	}
	return in, nil
}

// Endpoint is the bound endpoint as ZMQ reports it, e.g. tcp://10.0.0.7:41235.
func (in *Ingest) Endpoint() string { return in.endpoint }

// Port is the bound TCP port: the rank_port to publish with PUT /route.
func (in *Ingest) Port() int { return in.port }

// Stop ends the loop, closes the socket (in its owner goroutine) and waits for that. It is
// idempotent and returns once the loop has seen the stop: its poll is woken, and it
// stops after the batch being handled.
func (in *Ingest) Stop() {
	in.stopOnce.Do(func() {
		close(in.stop)
		in.waker.Wake()
	})
	<-in.done
}

// Stats returns a snapshot of the counters.
func (in *Ingest) Stats() IngestStats {
	return IngestStats{
		Messages: in.messages.Load(), Registrations: in.registrations.Load(),
		TransferInfos: in.transferInfos.Load(), Aborts: in.aborts.Load(), Staging: in.staging.Load(),
		BadFrames: in.badFrames.Load(), UnknownTags: in.unknownTags.Load(),
		SinkPanics: in.sinkPanics.Load(), RecvErrors: in.recvErrors.Load(), Disconnects: in.disconnects.Load(),
	}
}

func (in *Ingest) run(ready chan<- error) {
	defer close(in.done)
	zctx, term, err := ownContext(in.cfg.Context)
	if err != nil {
		ready <- err
		return
	}
	defer term() // runs after the sockets are closed below
	sock, err := in.open(zctx)
	if err != nil {
		ready <- err
		return
	}
	defer func() { _ = sock.Close() }()
	// The monitor reports closed connections (an oversize frame among them); the
	// loop polls it with sock.
	mon, err := monitorPair(zctx, sock, "PULL", zmq.EVENT_DISCONNECTED, 0)
	if err != nil {
		ready <- err
		return
	}
	defer func() { _ = mon.Close() }() // before the socket: deferred calls run in reverse
	if in.waker, err = NewWaker(zctx); err != nil {
		ready <- err
		return
	}
	defer in.waker.Close()
	ready <- nil
	if in.cfg.Before != nil {
		in.before()
	}
	in.loop(sock, mon)
}

func (in *Ingest) open(zctx *zmq.Context) (*zmq.Socket, error) {
	host := in.cfg.Host
	if host == "" {
		host = "*"
	}
	// A bounded queue and frame size (upstream: RCVHWM 0, no MAXMSGSIZE, so a peer could
	// make kvxferd hold whatever it sent); linger 0 so a Stop never waits on the network.
	opts := []sockOpt{
		{"RCVHWM", func(s *zmq.Socket) error { return s.SetRcvhwm(max(in.cfg.RcvHWM, 0)) }},
		{"MAXMSGSIZE", func(s *zmq.Socket) error { return s.SetMaxmsgsize(max(in.cfg.MaxFrame, -1)) }},
		{"LINGER", func(s *zmq.Socket) error { return s.SetLinger(0) }},
	}
	if isIPv6(host) {
		opts = append(opts, sockOpt{"IPV6", func(s *zmq.Socket) error { return s.SetIpv6(true) }})
	}
	if in.cfg.RcvBuf > 0 {
		opts = append(opts, sockOpt{"RCVBUF", func(s *zmq.Socket) error { return s.SetRcvbuf(in.cfg.RcvBuf) }})
	}
	if in.cfg.KeepAlive != nil {
		opts = append(opts, in.cfg.KeepAlive.opts()...)
	}
	sock, err := newSocket(zctx, zmq.PULL, "PULL", opts...)
	if err != nil {
		return nil, err
	}
	fail := func(what string, err error) (*zmq.Socket, error) {
		_ = sock.Close()
		return nil, fmt.Errorf("transport: PULL %s: %w", what, err)
	}
	bindTo := TCPEndpoint(host, in.cfg.Port)
	if host == "*" {
		bindTo = fmt.Sprintf("tcp://*:%d", in.cfg.Port)
	}
	if err := sock.Bind(bindTo); err != nil {
		return fail("bind "+bindTo, err)
	}
	ep, err := sock.GetLastEndpoint()
	if err != nil {
		return fail("last endpoint", err)
	}
	port, err := endpointPort(ep)
	if err != nil {
		return fail("last endpoint", err)
	}
	in.endpoint, in.port = ep, port
	in.log.Info("transport: PULL bound", "endpoint", ep)
	return sock, nil
}

func (in *Ingest) stopping() bool {
	select {
	case <-in.stop:
		return true
	default:
		return false
	}
}

func (in *Ingest) loop(sock, mon *zmq.Socket) {
	var x *rx // nil: zmq4's per-frame receive
	if useRx {
		x = newRx(sock)
	}
	if x != nil {
		defer x.close()
	}
	// The wait parks in Go's netpoller (fdWait); zmq_poll is the fallback.
	if fw, err := newFDWait(sock, mon, in.waker.Socket()); err == nil {
		defer fw.close()
		in.loopFD(sock, mon, x, fw)
		return
	}
	poller := zmq.NewPoller()
	poller.Add(sock, zmq.POLLIN)
	poller.Add(mon, zmq.POLLIN)
	poller.Add(in.waker.Socket(), zmq.POLLIN)
	for !in.stopping() {
		// No timeout: a message, a monitor event or Stop's wake-up ends it.
		polled, err := poller.Poll(-1)
		if err != nil {
			if in.fatal(err, "poll") {
				return
			}
			continue
		}
		if len(polled) == 0 {
			continue
		}
		in.waker.Drain()
		in.drainMon(mon)
		if _, end := in.drainSock(sock, x); end {
			return
		}
	}
}

// loopFD is the loop over an fdWait. A socket is read only while it may
// have something: from the start, and from when its ZMQ_FD fired until a
// receive on it comes back empty. That empty receive has libzmq take the
// socket's pending commands, after which its next message signals the fd
// again; a drain cut short by drainBatch leaves the socket marked. So a wake
// for decode frames costs no receive or ZMQ_EVENTS on the monitor and the
// waker (each a getpid and a poll inside libzmq).
func (in *Ingest) loopFD(sock, mon *zmq.Socket, x *rx, fw *fdWait) {
	const (
		frames uint = 1 << iota // the PULL socket, in newFDWait's order
		events
		wake
	)
	maybe := frames | events | wake
	for !in.stopping() {
		if maybe == 0 {
			fired, err := fw.wait()
			if err != nil {
				if in.fatal(err, "poll") {
					return
				}
				maybe = frames | events | wake
			}
			maybe |= fired
			continue
		}
		if maybe&wake != 0 {
			in.waker.Drain()
			maybe &^= wake
		}
		if maybe&events != 0 && in.drainMon(mon) {
			maybe &^= events
		}
		if maybe&frames != 0 {
			empty, end := in.drainSock(sock, x)
			if end {
				return
			}
			if empty {
				maybe &^= frames
			}
		}
	}
}

// drainMon counts the monitor's disconnect events; true once it came back
// empty.
func (in *Ingest) drainMon(mon *zmq.Socket) bool {
	for range drainBatch {
		ev, _, _, err := mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			return true // EAGAIN; any other error ends the drain the same way
		}
		if ev&zmq.EVENT_DISCONNECTED != 0 {
			in.disconnects.Add(1)
		}
	}
	return false
}

// drainSock handles up to drainBatch decode messages: empty says a receive
// came back empty, end that the loop must end.
func (in *Ingest) drainSock(sock *zmq.Socket, x *rx) (empty, end bool) {
	if x != nil {
		return in.drainRx(x)
	}
	for range drainBatch {
		frames, err := sock.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
				return true, false
			}
			return false, in.fatal(err, "recv")
		}
		in.handle(frames)
	}
	return false, false
}

// drainRx drains up to drainBatch messages through the batch receiver: one cgo
// call per batch, frames read in place. It reports as drainSock does.
func (in *Ingest) drainRx(x *rx) (empty, end bool) {
	for got := 0; got < drainBatch; {
		n, full, err := x.recv()
		in.handleBatch(x, n)
		x.release()
		got += n
		if err != nil {
			return false, in.fatal(err, "recv")
		}
		if !full {
			return true, false
		}
	}
	return false, false
}

// handleBatch decodes and dispatches the n messages of the current batch, in
// order. Transfer infos and aborts are decoded from the frames in place (their
// decoded form copies what it keeps); any other message, and every message of
// a StartPull handler, is copied into Go memory first, because it may keep
// its frames (a registration's metadata, RegistrationFrames).
func (in *Ingest) handleBatch(x *rx, n int) {
	bs, _ := in.sink.(BatchSink)
	for m := range n {
		frames, _ := x.message(m)
		if in.raw != nil || !decodedInPlace(frames) {
			in.flushRun(bs)
			in.handle(cloneFrames(frames))
			continue
		}
		in.messages.Add(1)
		if bs != nil && in.appendRun(frames) {
			continue
		}
		in.flushRun(bs)
		in.handleInPlace(frames)
	}
	in.flushRun(bs)
}

// decodedInPlace: a transfer info (GUARD, room) or an ABORT.
func decodedInPlace(frames [][]byte) bool {
	switch {
	case len(frames) == 0:
		return false
	case string(frames[0]) == wire.TagAbort:
		return true
	case string(frames[0]) == wire.TagGuard:
		return len(frames) > 1 && string(frames[1]) != wire.TagNone
	}
	return false
}

// appendRun decodes a transfer info into the BatchSink run; false for
// anything else (including a transfer info that fails to decode).
func (in *Ingest) appendRun(frames [][]byte) bool {
	if string(frames[0]) != wire.TagGuard {
		return false
	}
	msg, err := in.dec.DecodeInbound(frames)
	ti, ok := msg.(*wire.TransferInfo)
	if err != nil || !ok {
		return false
	}
	in.transferInfos.Add(1)
	in.tiRun = append(in.tiRun, ti)
	return true
}

// flushRun hands the pending run of transfer infos to the BatchSink.
func (in *Ingest) flushRun(bs BatchSink) {
	if len(in.tiRun) == 0 {
		return
	}
	defer func() {
		clear(in.tiRun)
		in.tiRun = in.tiRun[:0]
		if r := recover(); r != nil {
			in.sinkPanics.Add(1)
			if ok, n := in.limiter.Allow(); ok {
				in.log.Error("transport: panic while handling transfer infos; continuing", "panic", r, "suppressed", n)
			}
		}
	}()
	bs.TransferInfos(in.tiRun)
}

func cloneFrames(frames [][]byte) [][]byte {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	buf := make([]byte, 0, n)
	out := make([][]byte, len(frames))
	for i, f := range frames {
		buf = append(buf, f...)
		out[i] = buf[len(buf)-len(f) : len(buf) : len(buf)]
	}
	return out
}

// fatal logs a socket error and reports whether the loop must end (context terminated).
// Other errors are counted and retried after a pause, so a broken socket cannot spin.
func (in *Ingest) fatal(err error, op string) bool {
	switch zmq.AsErrno(err) {
	case zmq.ETERM:
		return true
	case zmq.Errno(syscall.EINTR):
		return false
	}
	in.recvErrors.Add(1)
	if ok, n := in.limiter.Allow(); ok {
		in.log.Warn("transport: PULL socket error", "op", op, "err", err, "suppressed", n)
	}
	select {
	case <-in.stop:
	case <-time.After(in.cfg.PollInterval):
	}
	return false
}

func (in *Ingest) before() {
	defer func() {
		if r := recover(); r != nil {
			in.sinkPanics.Add(1)
			in.log.Error("transport: panic in the ingest's Before hook; continuing", "panic", r)
		}
	}()
	in.cfg.Before()
}

// handle decodes and dispatches one message; nothing it receives can escape as a panic.
func (in *Ingest) handle(frames [][]byte) {
	in.messages.Add(1)
	if in.raw != nil {
		defer in.recoverSink()
		in.raw(frames)
		return
	}
	in.handleInPlace(frames)
}

func (in *Ingest) recoverSink() {
	if r := recover(); r != nil {
		in.sinkPanics.Add(1)
		if ok, n := in.limiter.Allow(); ok {
			in.log.Error("transport: panic while handling a message; continuing", "panic", r, "suppressed", n)
		}
	}
}

// handleInPlace decodes and dispatches one message (not counted in Messages).
func (in *Ingest) handleInPlace(frames [][]byte) {
	defer in.recoverSink()
	msg, err := in.dec.DecodeInbound(frames)
	if err != nil {
		in.badFrames.Add(1)
		if errors.Is(err, wire.ErrUnknownTag) {
			in.unknownTags.Add(1)
		}
		if ok, n := in.limiter.Allow(); ok {
			in.log.Warn("transport: dropped malformed message", "err", err, "frames", len(frames), "suppressed", n)
		}
		in.sink.BadFrame(err)
		return
	}
	switch m := msg.(type) {
	case *wire.Registration:
		in.registrations.Add(1)
		if rs, ok := in.sink.(RegistrationFramesSink); ok {
			rs.RegistrationFrames(m, frames)
		} else {
			in.sink.Registration(m)
		}
	case *wire.TransferInfo:
		in.transferInfos.Add(1)
		in.sink.TransferInfo(m)
	case *wire.Abort:
		in.aborts.Add(1)
		in.sink.Abort(m)
	default:
		in.staging.Add(1)
		in.sink.Staging(m)
	}
}
