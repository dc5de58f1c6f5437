package daemon

import (
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/actors"
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
// (one set of I/O threads). Each link's socket is owned by its own goroutine
// (zmqio.PushLink); what is shared is only which link carries the notices to
// an endpoint, and that table has one owner (actors.Owned): every change is
// an edit on the owner, which publishes the table whole, and a notice reads
// the table published last without waiting for anyone.
//
// A registered decode's link is pinned: its peer actor dials it when the
// incarnation is ready, keeps it (peerLocal.link) and unpins it when the
// incarnation ends, so a link never outlives the incarnation it was dialled
// for (a new agent at the same endpoint dials its own). It watches the
// connection: a decode whose socket goes away (its process died) is reported
// to lost. Other links are dialled on first use by the owner, and only to an
// endpoint known says is a registered decode's (a rejected registration's
// included, so it hears why); an address taken from a frame alone never gets
// a link. At most max links live: past it the least recently used unpinned
// link is evicted (closed in the background, its flush bounded by
// evictFlush).
type links struct {
	log   *slog.Logger
	zctx  *zmq.Context
	lost  func(kv.Endpoint)
	known func(kv.Endpoint) bool
	max   int

	table *actors.Owned[linkTable, struct{}]
	// tick orders the uses of unpinned links (linkEntry.used): a notice
	// marks its link without asking the owner, which evicts by the marks.
	tick atomic.Uint64
	bg   sync.WaitGroup // evicted and retired links closing; added to on the owner only

	evicted, refused atomic.Int64
	sendFailed       atomic.Int64 // closed links' libzmq send failures and flush discards
}

// linkTable is one published version of the links: never changed once
// published (an edit clones it).
type linkTable struct {
	// to is where a notice to each endpoint goes: the pinned link of the
	// incarnation that pinned there last, else the unpinned link.
	to map[kv.Endpoint]*linkEntry
	// all is every live link, pinned or not (an older incarnation's pinned
	// link at an endpoint another one pinned since included): the cap
	// counts them, shutdown flushes them.
	all    []*linkEntry
	closed bool
}

// linkEntry is one live link. Only used and ended change, atomically.
type linkEntry struct {
	to     kv.Endpoint
	link   *zmqio.PushLink
	pinned bool
	used   atomic.Uint64 // the tick of its last use (unpinned links: the LRU)
	ended  atomic.Bool   // out of the table: closing, its monitor reports nothing
}

func (c *linkTable) clone() *linkTable {
	return &linkTable{to: maps.Clone(c.to), all: slices.Clone(c.all)}
}

// remove takes e out of a version not published yet; false if it was not in.
func (c *linkTable) remove(e *linkEntry) bool {
	i := slices.Index(c.all, e)
	if i < 0 {
		return false
	}
	c.all = slices.Delete(c.all, i, i+1)
	if c.to[e.to] == e {
		delete(c.to, e.to)
		// An older incarnation's pinned link at the endpoint (fenced, not yet
		// gone) carries its notices again.
		for j := len(c.all) - 1; j >= 0; j-- {
			if o := c.all[j]; o.pinned && o.to == e.to {
				c.to[e.to] = o
				break
			}
		}
	}
	return true
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
	first := &linkTable{to: map[kv.Endpoint]*linkEntry{}}
	return &links{log: log, zctx: zctx, lost: lost, known: known, max: maxLinks,
		table: actors.NewOwned[linkTable, struct{}](first)}, nil
}

// dial opens the link of e. ZMQ connects asynchronously (DialPush returns
// whether or not decode listens, and never waits on the network), so a peer
// actor or the owner may dial.
func (l *links) dial(e *linkEntry) error {
	to := e.to
	link, err := zmqio.DialPush(zmqio.PushConfig{
		Context: l.zctx, Endpoint: zmqio.TCPEndpoint(to.IP, to.Port), Logger: l.log,
		// Flush at close (bounded: CloseBy): the last notices of a graceful
		// shutdown must reach decode.
		FlushTimeout: evictFlush,
		OnDisconnect: func() {
			if !e.ended.Load() { // not a link already retired or evicted
				l.lost(to)
			}
		},
	})
	if err != nil {
		return err
	}
	e.link = link
	return nil
}

// pin dials a registered decode's link for its peer actor, which keeps it
// and hands it back to unpin when the incarnation ends. It is never evicted;
// it takes the place of an unpinned link to the same endpoint, and past the
// cap it evicts the least recently used unpinned one (errLinksFull when
// every link is pinned).
func (l *links) pin(to kv.Endpoint) (*linkEntry, error) {
	if l.table.Load().closed {
		return nil, errLinksClosed
	}
	e := &linkEntry{to: to, pinned: true}
	if err := l.dial(e); err != nil {
		return nil, err
	}
	err := errLinksClosed // stays so if the owner is gone
	l.table.Edit(func(cur *linkTable, _ *struct{}) *linkTable {
		if cur.closed {
			return nil
		}
		next := cur.clone()
		var gone []*linkEntry
		if old := next.to[to]; old != nil && !old.pinned {
			next.remove(old)
			gone = append(gone, old)
		}
		victim, ok := l.room(next)
		if !ok {
			err = errLinksFull
			return nil
		}
		if victim != nil {
			gone = append(gone, victim)
			l.evicted.Add(1)
		}
		for _, g := range gone {
			l.closeLater(g)
		}
		next.to[to] = e
		next.all = append(next.all, e)
		err = nil
		return next
	})
	if err != nil {
		if errors.Is(err, errLinksFull) {
			l.refused.Add(1)
		}
		e.ended.Store(true)
		e.link.CloseBy(time.Time{}) // it never carried anything: nothing to flush
		return nil, err
	}
	return e, nil
}

// unpin retires a pinned link its incarnation ended with (closed in the
// background); from now on the endpoint's notices find the link of whoever
// registered there since, if any.
func (l *links) unpin(e *linkEntry) {
	if e == nil {
		return
	}
	l.table.Edit(func(cur *linkTable, _ *struct{}) *linkTable {
		next := cur.clone()
		if !next.remove(e) {
			return nil // retired wholesale already, or flushed by closeAll
		}
		l.closeLater(e)
		return next
	})
}

// current says whether a pinned link is still in the table (not retired).
func (e *linkEntry) current() bool { return e != nil && !e.ended.Load() }

// room makes room for one more link in a version not published yet (on the
// owner): past the cap the least recently used unpinned link leaves it,
// returned for the caller to close once it publishes; false when every link
// is pinned.
func (l *links) room(next *linkTable) (victim *linkEntry, ok bool) {
	if len(next.all) < l.max {
		return nil, true
	}
	for _, e := range next.all {
		if !e.pinned && (victim == nil || e.used.Load() < victim.used.Load()) {
			victim = e
		}
	}
	if victim == nil {
		return nil, false
	}
	next.remove(victim)
	return victim, true
}

// closeLater closes a link taken out of the table in the background, its
// flush bounded by evictFlush. It runs on the owner, so a closeAll that
// follows waits for it.
func (l *links) closeLater(e *linkEntry) {
	e.ended.Store(true)
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

// unpinned returns the unpinned link to an endpoint, dialling it on the
// owner if there is none (two notices to a new endpoint get one link).
func (l *links) unpinned(to kv.Endpoint) (*linkEntry, error) {
	var (
		got *linkEntry
		err = errLinksClosed // stays so if the owner is gone
	)
	l.table.Edit(func(cur *linkTable, _ *struct{}) *linkTable {
		if cur.closed {
			return nil
		}
		if e := cur.to[to]; e != nil { // dialled since the caller looked
			got, err = e, nil
			return nil
		}
		next := cur.clone()
		victim, ok := l.room(next)
		if !ok {
			err = errLinksFull
			return nil
		}
		e := &linkEntry{to: to}
		e.used.Store(l.tick.Add(1))
		if err = l.dial(e); err != nil {
			return nil // nothing evicted: the version stays as it was
		}
		if victim != nil {
			l.evicted.Add(1)
			l.closeLater(victim)
		}
		next.to[to] = e
		next.all = append(next.all, e)
		got = e
		return next
	})
	if errors.Is(err, errLinksFull) {
		l.refused.Add(1)
	}
	return got, err
}

// retireAll closes every link in the background (a rolled-back activation);
// the links stay usable.
func (l *links) retireAll() {
	l.table.Edit(func(cur *linkTable, _ *struct{}) *linkTable {
		if cur.closed {
			return nil
		}
		for _, e := range cur.all {
			l.closeLater(e)
		}
		return &linkTable{to: map[kv.Endpoint]*linkEntry{}}
	})
}

// send queues a notice on the endpoint's link: the table published last
// finds it without waiting; an endpoint with none gets an unpinned link,
// only where known says so.
func (l *links) send(to kv.Endpoint, frames [][]byte) error {
	t := l.table.Load()
	e := t.to[to]
	if e == nil {
		if t.closed {
			return errLinksClosed
		}
		if !l.known(to) {
			l.refused.Add(1)
			return errUnregistered
		}
		var err error
		if e, err = l.unpinned(to); err != nil {
			return err
		}
	}
	if !e.pinned {
		e.used.Store(l.tick.Add(1))
	}
	err := e.link.Send(frames)
	// Send returns the sentinel itself: a plain compare, so that a notice
	// dropped on a full queue costs no errors.Is.
	if err == zmqio.ErrLinkClosed {
		// Retired as it was read (its incarnation ended, or evicted): the
		// endpoint's link now, if another, takes it.
		if n := l.table.Load().to[to]; n != nil && n != e {
			return n.link.Send(frames)
		}
	}
	return err
}

// len is the number of live links.
func (l *links) len() int { return len(l.table.Load().all) }

// failed is every libzmq send failure and flush discard of links closed so
// far plus the live links' failures.
func (l *links) failed() int64 {
	n := l.sendFailed.Load()
	for _, e := range l.table.Load().all {
		n += int64(e.link.Stats().Failed)
	}
	return n
}

// closeAll flushes every link in parallel, all by one deadline, then ends the
// ZMQ context (whose linger is bounded by the same deadline). It returns by
// the deadline plus the monitors' poll and a second's grace for libzmq.
func (l *links) closeAll(deadline time.Time) {
	var all []*linkEntry
	first := false
	l.table.Edit(func(cur *linkTable, _ *struct{}) *linkTable {
		if cur.closed {
			return nil
		}
		first, all = true, cur.all
		for _, e := range all {
			e.ended.Store(true)
		}
		return &linkTable{to: map[kv.Endpoint]*linkEntry{}, closed: true}
	})
	if !first {
		return
	}
	l.table.Close() // nothing is dialled from now on: the table stays closed
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
