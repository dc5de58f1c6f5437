// Package connguard bounds the connections an HTTP server holds, so that a
// flood of stalled clients cannot take every file descriptor of the process
// and a health check still gets through.
//
// A guarded listener never blocks Accept (a blocked Accept leaves new clients,
// health checks included, queued in the kernel behind the flood). It hands out
// connections from two pools:
//
//   - the main pool, up to Max connections, never evicted: its connections end
//     only through the server's own read, write and idle timeouts;
//   - a small reserve of Reserve connections, used only while the main pool is
//     full. When the reserve is full too, the oldest reserve connection is
//     closed to make room for the new one.
//
// So the process holds at most Max+Reserve connections per listener, and the
// newest client (a /health probe arriving during a flood of stalled
// connections) always gets a connection that only Reserve later arrivals could
// take from it.
package connguard

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// DefaultReserve is the reserve size when Config.Reserve is 0.
const DefaultReserve = 16

// Config sizes a guarded listener.
type Config struct {
	// Max is the main pool; <= 0 means unlimited (no guard at all).
	Max int
	// Reserve is the evicting overflow pool; 0 means DefaultReserve.
	Reserve int
}

// DefaultMax sizes the main pool from the process's open-file limit: an
// eighth of it, between 16 and 1024 (128 at a 1,024 limit), so that two
// guarded servers with their reserves take under a third of the descriptors.
func DefaultMax() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 128
	}
	n := rl.Cur / 8
	return int(min(max(n, 16), 1024))
}

// Stats counts what a listener did.
type Stats struct {
	Main, Reserve int   // connections held now
	Accepted      int64 // every connection accepted
	Overflowed    int64 // connections that went to the reserve
	Evicted       int64 // reserve connections closed for a newer one
}

// Listener is a guarded net.Listener.
type Listener struct {
	net.Listener
	max, reserve int

	mu       sync.Mutex
	main     int
	res      []*conn // reserve, oldest first
	accepted atomic.Int64
	overflow atomic.Int64
	evicted  atomic.Int64
}

// Wrap guards ln. With cfg.Max <= 0 it returns ln unchanged.
func Wrap(ln net.Listener, cfg Config) net.Listener {
	if cfg.Max <= 0 {
		return ln
	}
	r := cfg.Reserve
	if r <= 0 {
		r = DefaultReserve
	}
	return &Listener{Listener: ln, max: cfg.Max, reserve: r}
}

// Accept returns the next connection, placed in the main pool or the reserve.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	gc := &conn{Conn: c, l: l}
	var victim *conn
	l.mu.Lock()
	if l.main < l.max {
		l.main++
	} else {
		gc.reserve = true
		l.overflow.Add(1)
		if len(l.res) >= l.reserve {
			victim = l.res[0]
			l.res = l.res[1:]
			victim.evicted = true
		}
		l.res = append(l.res, gc)
	}
	l.mu.Unlock()
	if victim != nil {
		l.evicted.Add(1)
		victim.closeOnce()
	}
	return gc, nil
}

// stats returns the listener's counters.
func (l *Listener) stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Main: l.main, Reserve: len(l.res), Accepted: l.accepted.Load(),
		Overflowed: l.overflow.Load(), Evicted: l.evicted.Load()}
}

func (l *Listener) release(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.reserve {
		l.main--
		return
	}
	if c.evicted {
		return
	}
	for i, r := range l.res {
		if r == c {
			l.res = append(l.res[:i], l.res[i+1:]...)
			return
		}
	}
}

type conn struct {
	net.Conn
	l       *Listener
	reserve bool
	evicted bool // guarded by l.mu
	once    sync.Once
	err     error
}

func (c *conn) closeOnce() error {
	c.once.Do(func() {
		c.err = c.Conn.Close()
		c.l.release(c)
	})
	return c.err
}

func (c *conn) Close() error { return c.closeOnce() }
