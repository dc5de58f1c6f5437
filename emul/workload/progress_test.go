package workload

import (
	"strings"
	"sync"
	"testing"
	"time"
)

type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// TestProgressWritesUntilStopped: lines come while it runs (waited for, not
// timed); stop waits for the writer, so every line built was written when it
// returns; stop is idempotent; a nil writer shows nothing.
func TestProgressWritesUntilStopped(t *testing.T) {
	var w lockedBuf
	calls := make(chan struct{}, 1<<16)
	stop := Progress(&w, time.Millisecond, func() string {
		calls <- struct{}{}
		return "tick"
	})
	<-calls
	<-calls
	stop()
	stop()
	built := 2 + len(calls)
	w.mu.Lock()
	n := strings.Count(w.b.String(), "tick\n")
	w.mu.Unlock()
	if n != built {
		t.Fatalf("%d lines written of %d built when stop returned", n, built)
	}
	Progress(nil, time.Millisecond, func() string { t.Error("nil writer"); return "" })()
}
