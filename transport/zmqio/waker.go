package zmqio

import (
	"fmt"
	"sync"
	"sync/atomic"

	zmq "github.com/pebbe/zmq4"
)

var wakerSeq atomic.Uint64

// Waker lets any goroutine wake a goroutine blocked in zmq_poll, so that a
// poll loop can block without a timeout while idle: an inproc PAIR pair in
// the poller's context. The polling goroutine adds Socket() to its Poller
// (POLLIN) and calls Drain when it is readable; Wake is safe from any
// goroutine and costs one non-blocking send (none while a wake-up is already
// pending). A goroutine blocked in a cgo call with no timeout is what lets an
// idle process sleep: every poll that times out wakes Go's sysmon thread,
// which then polls at 20 µs for about a millisecond (docs/benchmarks.md, idle
// CPU).
//
// Protocol: the waking side makes its news visible (closes a channel, stores
// a flag), then calls Wake; the polled side calls Drain before it looks for
// news. A news published after that look is followed by a Wake that is not
// yet drained, so the next poll returns at once.
type Waker struct {
	rx      *zmq.Socket // the polling goroutine's
	mu      sync.Mutex  // guards tx, used by any goroutine
	tx      *zmq.Socket // nil once closed
	pending atomic.Bool // a wake-up was sent and not yet drained
}

// NewWaker creates the pair in zctx.
func NewWaker(zctx *zmq.Context) (*Waker, error) {
	addr := fmt.Sprintf("inproc://kvxfer-waker-%d", wakerSeq.Add(1))
	linger0 := sockOpt{"LINGER", func(s *zmq.Socket) error { return s.SetLinger(0) }}
	rx, err := newSocket(zctx, zmq.PAIR, "waker", linger0)
	if err != nil {
		return nil, err
	}
	if err := rx.Bind(addr); err != nil {
		_ = rx.Close()
		return nil, fmt.Errorf("transport: waker bind: %w", err)
	}
	tx, err := newSocket(zctx, zmq.PAIR, "waker", linger0)
	if err != nil {
		_ = rx.Close()
		return nil, err
	}
	if err := tx.Connect(addr); err != nil {
		_ = tx.Close()
		_ = rx.Close()
		return nil, fmt.Errorf("transport: waker connect: %w", err)
	}
	return &Waker{rx: rx, tx: tx}, nil
}

// Socket is the end to poll for POLLIN.
func (w *Waker) Socket() *zmq.Socket { return w.rx }

// Wake makes the next (or current) poll of Socket return. It never blocks and
// does nothing after Close.
func (w *Waker) Wake() {
	if w.pending.Swap(true) {
		return // one is queued and not yet drained: the poll returns anyway
	}
	w.mu.Lock()
	if w.tx != nil {
		// Refused only when the pipe is full (then wake-ups are queued) or
		// the context is ending (then the poll returns ETERM).
		_, _ = w.tx.SendBytes(nil, zmq.DONTWAIT)
	}
	w.mu.Unlock()
}

// Drain consumes the queued wake-ups; the polling goroutine calls it before
// it looks for news.
func (w *Waker) Drain() {
	w.pending.Store(false)
	for {
		if _, err := w.rx.RecvBytes(zmq.DONTWAIT); err != nil {
			return
		}
	}
}

// Close closes both ends. Call it once the polling goroutine no longer polls
// Socket, before the context is terminated; later Wakes do nothing.
func (w *Waker) Close() {
	w.mu.Lock()
	if w.tx != nil {
		_ = w.tx.Close()
		w.tx = nil
		_ = w.rx.Close()
	}
	w.mu.Unlock()
}
