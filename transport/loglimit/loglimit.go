// Package loglimit rate-limits log lines that outside input can trigger.
package loglimit

import "time"

// Limiter lets one log line through per interval and counts what it suppressed, so a
// peer that floods us with garbage cannot flood the log. Not safe for concurrent use: each
// socket owner has its own.
type Limiter struct {
	every      time.Duration
	now        func() time.Time
	last       time.Time
	suppressed int
	started    bool
}

// Allow reports whether to log now and, if so, how many lines were suppressed since the
// last one that was let through.
func (l *Limiter) Allow() (bool, int) {
	t := l.now()
	if l.started && t.Sub(l.last) < l.every {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.started, l.last, l.suppressed = true, t, 0
	return true, n
}

// New lets one line through per every, timed by now (nil: the wall clock).
func New(every time.Duration, now func() time.Time) Limiter {
	if now == nil {
		now = time.Now
	}
	return Limiter{every: every, now: now}
}
