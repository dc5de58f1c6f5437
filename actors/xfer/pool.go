package xfer

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/internal/dispatch"
	"github.com/kvxfer/kvxfer/internal/mailbox"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// Config configures a Pool.
type Config struct {
	Agent nixl.Agent
	Local *sglang.Local
	// Actors is the pool size (SGLANG_DISAGGREGATION_QUEUE_SIZE, default 4).
	Actors int
	// QuarantineAfter moves a job still in flight after this long to the
	// quarantine list (default 75 s: past the default transfer and drain deadlines).
	QuarantineAfter time.Duration
	// MaxInFlight bounds the NIXL requests each pool actor keeps posted; later
	// transfers wait in the actor's FIFO (default 64). Polling costs a status
	// check per request in flight, so an unbounded window makes every poll
	// tick grow with the load while the transfers themselves go no faster.
	MaxInFlight int
	// Clock decides quarantine: a transfer in flight longer than
	// QuarantineAfter on it is quarantined, and quarantined transfers are
	// polled every second on it (default the wall clock). Give it the
	// engine's clock so a fake one drives both. Waiting for completions
	// decides nothing: the pool spins, then parks on the agent's wake-up
	// (nixl.Waker) and the due times it reports (nixl.Dueer); an agent
	// without a wake-up is polled every millisecond of wall time.
	Clock  clock.Clock
	Logger *slog.Logger
	// SignalFailed hears of a room's completion notifications that could
	// not be sent (Signal); by default they are logged.
	SignalFailed func(room uint64, agent string, err error)
}

// Stats are the pool's counters.
type Stats struct {
	Posted      int64 // transfers accepted
	Requests    int64 // NIXL requests posted
	Failed      int64 // transfers that ended with a failure
	InFlight    int64 // transfers not yet reported done (the queue depth)
	Quarantined int64 // transfers whose requests never completed in time
	Withdrawn   int64 // transfers of failed rooms ended before they started (Withdraw)
}

// Pool implements actors.Transfers over a NIXL agent.
type Pool struct {
	cfg    Config
	system *actor.ActorSystem
	pids   []*actor.PID
	loops  []*dispatch.Loop // the workers' mailbox goroutines, ended by Close
	localL nixl.ListID

	posted, requests, failed, inflight, quarantined, withdrawn atomic.Int64
}

// New starts a pool in its own actor system. The local KV descriptors are
// prepared once here.
func New(cfg Config) (*Pool, error) {
	if cfg.Agent == nil || cfg.Local == nil {
		return nil, errors.New("xfer: Config.Agent and Config.Local are required")
	}
	if cfg.Actors <= 0 {
		cfg.Actors = 4
	}
	if cfg.QuarantineAfter <= 0 {
		cfg.QuarantineAfter = 75 * time.Second
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.SignalFailed == nil {
		log := cfg.Logger
		cfg.SignalFailed = func(room uint64, agent string, err error) {
			log.Warn("completion notification dropped", "room", room, "agent", agent, "err", err)
		}
	}
	l, err := sglang.PrepLocalKV(cfg.Agent, cfg.Local)
	if err != nil {
		return nil, fmt.Errorf("xfer: preparing local KV descriptors: %w", err)
	}
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	p := &Pool{cfg: cfg, system: system, localL: l}
	for range cfg.Actors {
		// One long-lived goroutine per worker (dispatch.Loop): a worker
		// goes idle and busy at every park, and a new goroutine per wake-up
		// would grow its stack again each time.
		loop := dispatch.NewLoop(300)
		p.loops = append(p.loops, loop)
		p.pids = append(p.pids, system.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return newWorker(p) },
			actor.WithMailbox(mailbox.Unbounded()), actor.WithDispatcher(loop))))
	}
	return p, nil
}

// AddPeer validates a decode peer against the local geometry, prepares its KV
// descriptors once and hands it to every pool actor. The peer's metadata must
// already be loaded into the agent. Transfers posted after AddPeer returns see it.
func (p *Pool) AddPeer(g sglang.PeerGeometry) error {
	peer, err := sglang.NewPeer(p.cfg.Local, g)
	if err != nil {
		return err
	}
	list, err := sglang.PrepPeerKV(p.cfg.Agent, p.cfg.Local, peer)
	if err != nil {
		return fmt.Errorf("xfer: preparing KV descriptors of %s: %w", g.Agent, err)
	}
	for _, pid := range p.pids {
		p.system.Root.Send(pid, &addPeer{peer: peer, list: list})
	}
	return nil
}

// RemovePeer forgets a peer in every pool actor; its later transfers fail as
// an unknown agent.
func (p *Pool) RemovePeer(agent string) {
	for _, pid := range p.pids {
		p.system.Root.Send(pid, &removePeer{agent: agent})
	}
}

// Post implements actors.Transfers. A room's transfers all go to one actor, so
// they are posted in the order the room emitted them.
func (p *Pool) Post(t kv.Transfer, done kv.DoneFunc) {
	p.posted.Add(1)
	p.inflight.Add(1)
	p.system.Root.Send(p.worker(t.Room), &job{t: t, done: done})
}

// worker is the actor every transfer of room goes to.
func (p *Pool) worker(room uint64) *actor.PID {
	return p.pids[int((room*0x9E3779B97F4A7C15)>>33)%len(p.pids)]
}

// Withdraw implements actors.Withdrawer: the transfers of a failed room that
// still wait for the in-flight window (Config.MaxInFlight) end unwritten,
// reported done with transfer_error, so that the room drains only what was
// started. A failed room's writes are wasted bytes, and its terminal status
// waits for every transfer it posted.
func (p *Pool) Withdraw(roomID uint64, _ []string) {
	p.system.Root.Send(p.worker(roomID), withdraw{room: roomID})
}

// Signal sends completion notifications held back from a room's last chunk
// (kv.Transfer.HoldSignal) to a decode agent, in order. They go through the
// worker that owns the room's transfers, once it has handled the message at
// hand: the notifications of every room that completed in one poll reach
// each agent in one call (nixl.SendNotifs: one datagram with loopback, one
// hop onto libnixl's owner thread), and the room's step never waits for a
// decode. Signals that fail go to Config.SignalFailed, one per room.
func (p *Pool) Signal(room uint64, agent string, msgs [][]byte) {
	p.system.Root.Send(p.worker(room), &signal{room: room, agent: agent, msgs: msgs})
}

// Notify makes the pool an actors.Notifier for in-process decodes: it sends a
// Completion's held notifications (see Signal) and drops every other notice,
// which travels over ZMQ in a deployment (daemon.Notify).
func (p *Pool) Notify(roomID uint64, n room.Notice) {
	if n.Kind == room.Completion && len(n.Signal) > 0 {
		p.Signal(roomID, n.Agent, n.Signal)
	}
}

// Stats returns the counters.
func (p *Pool) Stats() Stats {
	return Stats{Posted: p.posted.Load(), Requests: p.requests.Load(), Failed: p.failed.Load(),
		InFlight: p.inflight.Load(), Quarantined: p.quarantined.Load(), Withdrawn: p.withdrawn.Load()}
}

// closeSignalWait bounds how long Close waits for a worker to take the
// signals queued to it (a send waits at most a few milliseconds per decode).
const closeSignalWait = 5 * time.Second

// Close stops the pool actors, after each has taken the completion
// notifications queued to it (Signal) and sent them: a stop overtakes
// queued messages. Requests still in flight are abandoned to the agent
// (which keeps their memory valid until it closes).
func (p *Pool) Close() {
	for _, pid := range p.pids {
		_ = p.system.Root.RequestFuture(pid, &actor.Touch{}, closeSignalWait).Wait()
		_ = p.system.Root.StopFuture(pid).Wait()
	}
	for _, l := range p.loops {
		l.Close()
	}
}

// classify maps a NIXL error to the room's failure reason.
func classify(err error) kv.Reason {
	switch {
	case errors.Is(err, nixl.ErrRemoteDisconnect), errors.Is(err, nixl.ErrPeerUnknown):
		return kv.ReasonPeerLost
	case errors.Is(err, nixl.ErrInvalid):
		return kv.ReasonInvalidRequest
	}
	return kv.ReasonTransferError
}
