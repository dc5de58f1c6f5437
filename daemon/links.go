package daemon

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// Link limits: a flood of ABORT return addresses must not cost a link, a
// thread and fds each, and a dead decode owed notices must not hold shutdown
// (attacks F2 and F3 of docs/hostile.md).
const (
	// maxLinksCeiling bounds the default cap on live links; each link costs
	// about four fds (TCP, the socket's mailbox, the monitor's two sockets).
	maxLinksCeiling = 512
	minLinks        = 16
	// evictFlush bounds how long an evicted or retired link may take to hand
	// its queue to libzmq (it closes in the background).
	evictFlush = time.Second
	// shutdownFlush bounds the links' flush at shutdown when the context
	// has no deadline of its own.
	shutdownFlush = 5 * time.Second
)

// Errors a notice may be dropped with before any link exists.
var (
	errUnregistered = errors.New("daemon: no registered decode at this endpoint: no link is dialled for it")
	errLinksFull    = errors.New("daemon: every decode link belongs to a registered decode: the cap is reached")
	errLinksClosed  = errors.New("daemon: links closed (shutting down)")
)

// defaultMaxLinks sizes the cap from the fd limit: at most an eighth of it
// goes to links (Go raises the soft limit to the hard one at start-up).
func defaultMaxLinks() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 128
	}
	return int(min(max(rl.Cur/8, minLinks), maxLinksCeiling))
}

// links are the PUSH sockets to decode PULL endpoints, all in one ZMQ context
// (one set of I/O threads). A registered decode's link is dialled at
// registration and pinned: it watches the connection, and a decode whose
// socket goes away (its process died) is reported to lost. Other links are
// dialled on first use, and only to an endpoint known says is a registered
// decode's (a rejected registration's included, so it hears why); an address
// taken from a frame alone never gets a link. At most max links live: past it
// the least recently used unpinned link is evicted (closed in the background,
// its flush bounded by evictFlush). Each link's socket is owned by its own
// goroutine; this map only finds them.
type links struct {
	log   *slog.Logger
	zctx  *zmq.Context
	lost  func(kv.Endpoint)
	known func(kv.Endpoint) bool
	max   int

	// mu guards the index of the ZMQ sockets, an I/O boundary: every room
	// actor's notice looks its link up here (an owner actor would add a hop
	// to every notice), and each socket is owned by its own goroutine.
	mu     sync.Mutex
	by     map[kv.Endpoint]*linkEntry
	tick   uint64
	closed bool
	bg     sync.WaitGroup // evicted and retired links closing

	evicted, refused atomic.Int64
	sendFailed       atomic.Int64 // closed links' libzmq send failures and flush discards
}

type linkEntry struct {
	link   *zmqio.PushLink
	used   uint64
	pinned bool
}

func newLinks(log *slog.Logger, maxLinks int, known func(kv.Endpoint) bool, lost func(kv.Endpoint)) (*links, error) {
	if maxLinks <= 0 {
		maxLinks = defaultMaxLinks()
	}
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, err
	}
	// Each link holds three ZMQ sockets (PUSH, the monitor's PAIR and
	// libzmq's own monitor PAIR); evicted ones may still be closing.
	if err := zctx.SetMaxSockets(8*maxLinks + 64); err != nil {
		_ = zctx.Term()
		return nil, err
	}
	return &links{log: log, zctx: zctx, lost: lost, known: known, max: maxLinks, by: map[kv.Endpoint]*linkEntry{}}, nil
}

// get returns the link to an endpoint, dialling it first if needed. pin marks
// it a registered decode's (its peer actor asks, once loaded): never evicted,
// and dialled without asking known.
func (l *links) get(to kv.Endpoint, pin bool) (*zmqio.PushLink, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errLinksClosed
	}
	l.tick++
	if e, ok := l.by[to]; ok {
		e.used = l.tick
		e.pinned = e.pinned || pin
		return e.link, nil
	}
	if !pin && !l.known(to) {
		l.refused.Add(1)
		return nil, errUnregistered
	}
	if len(l.by) >= l.max && !l.evictLocked() {
		l.refused.Add(1)
		return nil, errLinksFull
	}
	e := &linkEntry{used: l.tick, pinned: pin}
	link, err := zmqio.DialPush(zmqio.PushConfig{
		Context: l.zctx, Endpoint: zmqio.TCPEndpoint(to.IP, to.Port), Logger: l.log,
		// Flush at close (bounded: CloseBy): the last notices of a graceful
		// shutdown must reach decode.
		FlushTimeout: evictFlush,
		OnDisconnect: func() {
			if l.current(to, e) { // not a link already replaced or evicted
				l.lost(to)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	e.link = link
	l.by[to] = e
	return link, nil
}

// evictLocked closes the least recently used unpinned link.
func (l *links) evictLocked() bool {
	var (
		victim kv.Endpoint
		best   *linkEntry
	)
	for ep, e := range l.by {
		if !e.pinned && (best == nil || e.used < best.used) {
			victim, best = ep, e
		}
	}
	if best == nil {
		return false
	}
	delete(l.by, victim)
	l.evicted.Add(1)
	l.closeLater(best)
	return true
}

// closeLater closes a link that is out of the map in the background, its
// flush bounded by evictFlush. l.mu is held or the link is unreachable.
func (l *links) closeLater(e *linkEntry) {
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		e.link.CloseBy(time.Now().Add(evictFlush))
		l.account(e.link)
	}()
}

func (l *links) account(link *zmqio.PushLink) {
	st := link.Stats()
	l.sendFailed.Add(int64(st.Failed + st.Discarded))
}

func (l *links) current(to kv.Endpoint, e *linkEntry) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.by[to] == e
}

// retire closes the link to an endpoint (in the background) so that the next
// use dials a fresh one: a decode re-registered there, or the one there is
// gone. Its monitor no longer reports anything.
func (l *links) retire(to kv.Endpoint) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.by[to]; ok {
		delete(l.by, to)
		l.closeLater(e)
	}
}

// retireAll closes every link in the background (a rolled-back activation);
// the links stay usable.
func (l *links) retireAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ep, e := range l.by {
		delete(l.by, ep)
		l.closeLater(e)
	}
}

func (l *links) send(to kv.Endpoint, frames [][]byte) error {
	link, err := l.get(to, false)
	if err != nil {
		return err
	}
	return link.Send(frames)
}

// len is the number of live links.
func (l *links) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.by)
}

// failed is every libzmq send failure and flush discard of links closed so
// far plus the live links' failures.
func (l *links) failed() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.sendFailed.Load()
	for _, e := range l.by {
		n += int64(e.link.Stats().Failed)
	}
	return n
}

// closeAll flushes every link in parallel, all by one deadline, then ends the
// ZMQ context (whose linger is bounded by the same deadline). It returns by
// the deadline plus the monitors' poll and a second's grace for libzmq.
func (l *links) closeAll(deadline time.Time) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	all := make([]*linkEntry, 0, len(l.by))
	for ep, e := range l.by {
		all = append(all, e)
		delete(l.by, ep)
	}
	l.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.link.CloseBy(deadline)
			l.account(e.link)
		}()
	}
	wg.Wait()
	l.bg.Wait() // evicted links: bounded by evictFlush
	term := make(chan struct{})
	go func() {
		defer close(term)
		_ = l.zctx.Term()
	}()
	select {
	case <-term:
	case <-time.After(max(time.Until(deadline), 0) + time.Second):
		l.log.Warn("ZMQ context of the decode links still terminating after the flush deadline; left to exit")
	}
}
