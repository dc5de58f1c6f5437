package control

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// Config configures a Server. Engine is required.
type Config struct {
	// Endpoint is ipc:///abs/path (default DefaultEndpoint(Identity.Rank)) or
	// tcp://127.0.0.1:port (a loopback address; port 0 picks one, see Endpoint()).
	// The API has no authentication: the ipc socket file is made 0600 and tcp is
	// restricted to loopback.
	Endpoint string
	Identity Identity
	Engine   Engine
	Memory   MemoryFunc // nil: register_memory answers CodeUnsupported
	// Lost receives the rooms of a lost predecessor (op lost) and returns how many
	// decode endpoints it told. nil: lost answers CodeUnsupported.
	Lost func(rooms []uint64) (told int)
	// PollInterval is unused: the loop blocks without a timeout while idle and
	// Stop wakes it (an idle server costs no CPU). Kept for compatibility.
	PollInterval time.Duration
	// MaxMessage caps one request (ZMQ_MAXMSGSIZE); libzmq disconnects a client that
	// sends more, without a reply. 0 means 64 MiB.
	MaxMessage int64
	// Slice is how many room operations one client's turn serves before the next
	// client's (fair.go); 0 means DefaultSlice.
	Slice int
	// Context to create the socket in; nil: the server creates and terminates its own.
	Context *zmq.Context
	Logger  *slog.Logger
}

// Stats are cumulative counters, readable from any goroutine.
type Stats struct {
	Messages   uint64 // multipart messages received
	Errors     uint64 // error replies (batch sub-replies included)
	Dropped    uint64 // messages that could not be framed, so got no reply
	SendErrors uint64 // replies that could not be sent (client gone, HWM)
	RecvErrors uint64 // socket errors other than EAGAIN
	Panics     uint64 // recovered panics in the engine or the memory callback
}

// drainBatch bounds how many messages are served between stop checks.
const drainBatch = 1024

// Server owns the ROUTER socket of one kvxferd: a single goroutine creates, binds,
// reads, writes and closes it (zmq sockets are not goroutine safe). Each client's
// requests are served one at a time in arrival order; clients take turns, and a big
// batched op is served in slices between other clients' requests (fair.go). No input
// stops it; only Stop does.
type Server struct {
	cfg      Config
	log      *slog.Logger
	endpoint string
	ipc      *ipcFile

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	waker    *zmqio.Waker // Stop wakes the loop's poll

	messages, errors, dropped, sendErrors, recvErrors, panics atomic.Uint64

	// Owned by the loop goroutine.
	replies []kv.Reply         // reused across polls
	clients map[string]*client // by ROUTER identity, those with queued requests
	ring    []*client          // the same, in turn order
	queued  int
	sendMsg func(parts []any) error
	shm     shmHub // shared-memory sessions (shm_server.go)
}

// Start binds the socket and starts serving. It returns once the socket is bound (or
// failed to bind), so Endpoint is valid on return.
func Start(cfg Config) (*Server, error) {
	if cfg.Engine == nil {
		return nil, errors.New("control: Config.Engine is required")
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = DefaultEndpoint(cfg.Identity.Rank)
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if cfg.MaxMessage <= 0 {
		cfg.MaxMessage = 64 << 20
	}
	if cfg.Slice <= 0 {
		cfg.Slice = DefaultSlice
	}
	s := &Server{cfg: cfg, log: cfg.Logger, stop: make(chan struct{}), done: make(chan struct{}),
		clients: map[string]*client{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	ep, err := parseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	ready := make(chan error, 1)
	go s.run(ep, ready)
	if err := <-ready; err != nil {
		<-s.done
		return nil, err
	}
	return s, nil
}

// Endpoint is where clients connect: the ipc endpoint as configured, or the tcp
// endpoint with the port that was picked.
func (s *Server) Endpoint() string { return s.endpoint }

// Done is closed once the loop has exited, the socket is closed and the ipc file is
// gone.
func (s *Server) Done() <-chan struct{} { return s.done }

// Stop ends the loop and waits for it (its poll is woken; it stops after the
// request being served). It is idempotent. Stop the server before closing the Engine,
// so that clients lose the socket rather than see every room fail: a poll served while
// the engine closes answers Failed (shutdown) once its shards have stopped, or
// internal_error after the engine's PollTimeout.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		close(s.stop)
		s.waker.Wake()
	})
	<-s.done
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	return Stats{
		Messages: s.messages.Load(), Errors: s.errors.Load(), Dropped: s.dropped.Load(),
		SendErrors: s.sendErrors.Load(), RecvErrors: s.recvErrors.Load(), Panics: s.panics.Load(),
	}
}

func (s *Server) run(ep endpoint, ready chan<- error) {
	defer close(s.done)
	// Deferred in reverse: close the socket, terminate our context (which waits for
	// libzmq to let go of the listener), then remove the ipc file.
	defer func() {
		if s.ipc != nil {
			s.ipc.remove()
		}
	}()
	zctx := s.cfg.Context
	if zctx == nil {
		var err error
		if zctx, err = zmq.NewContext(); err != nil {
			ready <- err
			return
		}
		defer zctx.Term()
	}
	sock, err := zctx.NewSocket(zmq.ROUTER)
	if err != nil {
		ready <- err
		return
	}
	defer sock.Close()
	if err := s.setup(sock, ep); err != nil {
		ready <- err
		return
	}
	if s.waker, err = zmqio.NewWaker(zctx); err != nil {
		ready <- err
		return
	}
	defer s.waker.Close()
	ready <- nil
	s.sendMsg = func(parts []any) error {
		_, err := sock.SendMessageDontwait(parts...)
		return err
	}
	defer s.closeShm()
	s.loop(sock)
}

func (s *Server) setup(sock *zmq.Socket, ep endpoint) error {
	// Linger 0: replies to a client that went away must not hold up Term. Router
	// mandatory: such replies fail (and are counted) instead of vanishing silently.
	if err := sock.SetLinger(0); err != nil {
		return err
	}
	if err := sock.SetRouterMandatory(1); err != nil {
		return err
	}
	if err := sock.SetMaxmsgsize(s.cfg.MaxMessage); err != nil {
		return err
	}
	if ep.ipcPath != "" {
		f, err := bindIPC(sock, ep.ipcPath)
		if err != nil {
			return err
		}
		s.ipc, s.endpoint = f, "ipc://"+ep.ipcPath
		return nil
	}
	if ep.ipv6 {
		if err := sock.SetIpv6(true); err != nil {
			return err
		}
	}
	if err := sock.Bind(ep.zmq); err != nil {
		return err
	}
	s.endpoint, _ = sock.GetLastEndpoint()
	return nil
}

func (s *Server) loop(sock *zmq.Socket) {
	p := zmq.NewPoller()
	p.Add(sock, zmq.POLLIN)
	p.Add(s.waker.Socket(), zmq.POLLIN)
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		wait := time.Duration(-1) // idle: a request or Stop's wake-up ends the poll
		if s.queued > 0 {
			wait = 0 // requests are waiting for their turn: only look for new ones
		}
		polled, err := p.Poll(wait)
		if err != nil {
			if zmq.AsErrno(err) == zmq.ETERM {
				return
			}
			s.recvErrors.Add(1)
			continue
		}
		for _, q := range polled {
			if q.Socket == s.waker.Socket() {
				s.waker.Drain() // Stop's: the select above sees it
			}
		}
	drain:
		for i := 0; len(polled) > 0 && i < drainBatch; i++ {
			frames, err := sock.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				switch zmq.AsErrno(err) {
				case zmq.Errno(syscall.EAGAIN):
				case zmq.ETERM:
					return
				default:
					s.recvErrors.Add(1)
				}
				break drain
			}
			s.enqueue(frames)
		}
		s.turn()
	}
}

// DefaultEndpoint is the ipc endpoint of a rank's daemon: in $XDG_RUNTIME_DIR (a
// per-user 0700 directory) when set, else the temp directory, named by uid and rank
// so that several users and ranks share a host.
func DefaultEndpoint(rank int) string {
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	return "ipc://" + filepath.Join(dir, "kvxfer-"+strconv.Itoa(os.Getuid())+"-rank"+strconv.Itoa(rank)+".sock")
}
