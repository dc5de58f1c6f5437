package daemon

import (
	"net"
	"net/http"
	"time"

	"github.com/kvxfer/kvxfer/internal/connguard"
)

// Defaults of HTTPLimits: stalled connections must not exhaust kvxferd's fds
// or starve its probes (attack F6 of docs/hostile.md).
const (
	DefaultHTTPReadHeaderTimeout = 10 * time.Second
	// DefaultHTTPReadTimeout bounds reading a whole request, body included
	// (bootstrap bodies are a few hundred bytes).
	DefaultHTTPReadTimeout = 30 * time.Second
	// DefaultHTTPWriteTimeout leaves room for a 30 s /debug/pprof/profile.
	DefaultHTTPWriteTimeout = 60 * time.Second
	DefaultHTTPIdleTimeout  = 120 * time.Second
)

// HTTPLimits bounds the bootstrap and debug HTTP servers: timeouts, and the
// connections each holds (see internal/connguard). Zero values take the
// defaults; a negative MaxConns turns the connection cap off.
type HTTPLimits struct {
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxConns is each server's main pool (0: connguard.DefaultMax(), an
	// eighth of the open-file limit, 16 to 1024); over it, a reserve of
	// Reserve connections (0: 16) takes new clients and closes its oldest
	// one when full, so a health check always gets through.
	MaxConns, Reserve int
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func (l HTTPLimits) server(h http.Handler) *http.Server {
	return &http.Server{Handler: h,
		ReadHeaderTimeout: orDefault(l.ReadHeaderTimeout, DefaultHTTPReadHeaderTimeout),
		ReadTimeout:       orDefault(l.ReadTimeout, DefaultHTTPReadTimeout),
		WriteTimeout:      orDefault(l.WriteTimeout, DefaultHTTPWriteTimeout),
		IdleTimeout:       orDefault(l.IdleTimeout, DefaultHTTPIdleTimeout),
		MaxHeaderBytes:    64 << 10,
	}
}

func (l HTTPLimits) listener(ln net.Listener) net.Listener {
	n := l.MaxConns
	if n == 0 {
		n = connguard.DefaultMax()
	}
	return connguard.Wrap(ln, connguard.Config{Max: n, Reserve: l.Reserve})
}

func isLoopback(a net.Addr) bool {
	t, ok := a.(*net.TCPAddr)
	return ok && t.IP.IsLoopback()
}
