package daemon

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/transport/loglimit"
)

// logLimiter is loglimit.Limiter for warnings logged from many goroutines
// (room actors, link monitors, the ingest): one line per interval, with the
// count suppressed since the last one; every suppressed line also counts in
// total (the log_lines_suppressed counter).
type logLimiter struct {
	// mu is an I/O boundary: the log, written from many goroutines (room
	// actors, link monitors, the ingest), each asking before its line. An
	// owner does not fit: the answer is needed at once on the caller's
	// path, and a hop per warning to an owner's mailbox would cost more
	// than the line; mu is held for one comparison, never across the write.
	mu    sync.Mutex
	l     loglimit.Limiter
	total *atomic.Int64
}

func newLogLimiter(every time.Duration, total *atomic.Int64) *logLimiter {
	return &logLimiter{l: loglimit.New(every, nil), total: total}
}

// allow reports whether to log now and, if so, how many lines were suppressed
// since the last one let through.
func (r *logLimiter) allow() (bool, int) {
	r.mu.Lock()
	ok, n := r.l.Allow()
	r.mu.Unlock()
	if !ok && r.total != nil {
		r.total.Add(1)
	}
	return ok, n
}
