package dict

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// Variant selects the rules.
type Variant uint8

const (
	// Upstream is SGLang's NIXL prefill at the spec baseline, bugs included.
	Upstream Variant = iota
	// Fixed is the best repair that keeps the shared dicts.
	Fixed
)

func (v Variant) String() string {
	if v == Fixed {
		return "fixed"
	}
	return "upstream"
}

// Config configures an Engine. Transfers is required; the rest has defaults.
type Config struct {
	Variant   Variant
	Transfers actors.Transfers
	// Waiter, if set, is where a transfer worker waits for the writes it just
	// posted through Transfers (Direct: upstream's busy-wait on the NIXL
	// handles). Unset, the worker blocks until Transfers reports them.
	Waiter Waiter
	// Notifier tells decode of failures and ABORT_ACKs. Only Fixed uses it:
	// upstream never tells decode anything (spec §6.3 P4).
	Notifier actors.Notifier
	Clock    clock.Clock // default the wall clock
	Hooks    *Hooks      // nil: no hooks
	// Workers is SGLANG_DISAGGREGATION_QUEUE_SIZE, default 4.
	Workers int
	// Inbox is the capacity of the channel standing in for the PULL socket
	// (upstream's is unbounded, RCVHWM=0); default 4096.
	Inbox int
	// NonStickyFailed restores the status rule from before #30352 (spec §6.3
	// P7), where a later Transferring or Success overwrote Failed. Upstream only.
	NonStickyFailed bool
	// RequireRegistration makes a transfer to a decode agent that never sent
	// its registration frame fail the room, as upstream's KeyError on
	// decode_kv_args_table does. Off by default: the transfer layer owns peers.
	RequireRegistration bool
	// Fixed only.
	BootstrapTimeout time.Duration // SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, default 300 s
	TombstoneTTL     time.Duration // default 600 s, as the actor engine's
	SweepInterval    time.Duration // expiry of tombstones and orphan infos, default 10 s
}

func (c Config) withDefaults() (Config, error) {
	if c.Transfers == nil {
		return c, errors.New("dict: Config.Transfers is required")
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Workers <= 0 {
		c.Workers = 4
	}
	if c.Inbox <= 0 {
		c.Inbox = 4096
	}
	if c.BootstrapTimeout <= 0 {
		c.BootstrapTimeout = 300 * time.Second
	}
	if c.TombstoneTTL <= 0 {
		c.TombstoneTTL = 600 * time.Second
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = 10 * time.Second
	}
	if c.Notifier == nil {
		c.Notifier = dropNotices{}
	}
	return c, nil
}

type dropNotices struct{}

func (dropNotices) Notify(uint64, room.Notice) {}

// failure is a failure_records entry: upstream keeps the message; the reason
// is kept beside it so Poll can answer with a kv.Reason.
type failure struct {
	reason kv.Reason
	msg    string
}

// infoEntry is one transfer_infos[room][agent] value; n keeps the insertion
// order Python dicts have (the first prefix length wins).
type infoEntry struct {
	ti room.TransferInfo
	n  int
}

// sender is a NixlKVSender: owned by the scheduler upstream, so it is not one
// of the shared dicts; smu only makes the Go API safe for concurrent callers.
type sender struct {
	numPages int // -1 until init
	auxIndex int
	curr     int
	chunkID  int
	failed   bool // _send_failed, latched by failure_exception
	born     time.Time
}

// Engine is the dict-based prefill manager with its senders. Its methods are
// safe for concurrent use; each scheduler method runs in the caller's
// goroutine, as upstream's scheduler thread calls the sender directly.
type Engine struct {
	cfg   Config
	fixed bool
	hooks *Hooks
	clk   clock.Clock

	// Upstream's shared dicts (spec §7).
	status     *table[uint64, kv.Status]                 // request_status
	infos      *table[uint64, *table[string, infoEntry]] // transfer_infos
	prefix     *table[uint64, int]                       // req_to_decode_prefix_len
	failures   *table[uint64, failure]                   // failure_records
	exceptions *table[uint64, error]                     // exceptions
	peers      *table[string, struct{}]                  // decode_kv_args_table
	infoSeq    atomic.Int64

	smu     sync.Mutex
	senders map[uint64]*sender

	inbox  chan inbound
	queues []*fifo
	seq    atomic.Uint32

	// Fixed only.
	tombs   *table[uint64, tomb]
	dmu     sync.Mutex
	drains  map[uint64]*drain
	omu     sync.Mutex
	orphans map[uint64]time.Time // first seen without a status, by the sweeper
	sweeper clock.Timer

	closeOnce sync.Once
	stopped   atomic.Bool
	wg        sync.WaitGroup
}

// New starts an engine: the bootstrap goroutine, the workers and (Fixed) the
// sweeper.
func New(cfg Config) (*Engine, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	e := &Engine{
		cfg: c, fixed: c.Variant == Fixed, hooks: c.Hooks, clk: c.Clock,
		status: newTable[uint64, kv.Status](), infos: newTable[uint64, *table[string, infoEntry]](),
		prefix: newTable[uint64, int](), failures: newTable[uint64, failure](),
		exceptions: newTable[uint64, error](), peers: newTable[string, struct{}](),
		senders: map[uint64]*sender{}, inbox: make(chan inbound, c.Inbox),
		tombs: newTable[uint64, tomb](), drains: map[uint64]*drain{}, orphans: map[uint64]time.Time{},
	}
	e.wg.Add(1)
	go e.bootstrapLoop()
	for i := 0; i < c.Workers; i++ {
		q := newFifo()
		e.queues = append(e.queues, q)
		e.wg.Add(1)
		go e.workerLoop(q)
	}
	if e.fixed {
		e.armSweep()
	}
	return e, nil
}

// Variant returns the engine's rules.
func (e *Engine) Variant() Variant { return e.cfg.Variant }

// Hooks returns the engine's hooks (nil when it has none).
func (e *Engine) Hooks() *Hooks { return e.hooks }

// SettleBootstrap returns once the bootstrap goroutine handled every message
// delivered before the call (at once after Close).
func (e *Engine) SettleBootstrap() {
	done := make(chan struct{})
	if e.deliver(inbound{barrier: done}) {
		<-done
	}
}

// SettleWorkers returns once every worker handled every chunk enqueued before
// the call. A worker waiting on a write that never completes blocks it.
func (e *Engine) SettleWorkers() {
	var dones []chan struct{}
	for _, q := range e.queues {
		d := make(chan struct{})
		q.push(item{barrier: d})
		dones = append(dones, d)
	}
	for _, d := range dones {
		<-d
	}
}

// Settle is SettleBootstrap then SettleWorkers.
func (e *Engine) Settle() {
	e.SettleBootstrap()
	e.SettleWorkers()
}

// Close stops the bootstrap goroutine, the workers and the sweeper, and waits
// for them until ctx ends. A worker blocked on a write that never completes
// keeps Close waiting, as upstream's would.
func (e *Engine) Close(ctx context.Context) error {
	first := false
	e.closeOnce.Do(func() {
		first = true
		e.stopped.Store(true)
		close(e.inbox)
		for _, q := range e.queues {
			q.close()
		}
		e.omu.Lock()
		if e.sweeper != nil {
			e.sweeper.Stop()
		}
		e.omu.Unlock()
	})
	if !first {
		return errors.New("dict: engine already closed")
	}
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
