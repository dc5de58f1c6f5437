package dispatch

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
)

// TestLoopRunsInOrderOnOneGoroutine: every run happens, in order, and the
// goroutine count does not grow with the number of runs.
func TestLoopRunsInOrderOnOneGoroutine(t *testing.T) {
	l := NewLoop(10)
	if l.Throughput() != 10 {
		t.Fatalf("Throughput %d", l.Throughput())
	}
	var got []int
	done := make(chan struct{})
	for i := range 1000 {
		l.Schedule(func() {
			got = append(got, i) // one goroutine: no race
			if i == 999 {
				close(done)
			}
		})
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("runs did not finish")
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("run %d was %d: out of order", i, v)
		}
	}
	l.Close()
}

// TestLoopCloseEndsGoroutine: Close ends the goroutine, and a Schedule after
// Close still runs its function.
func TestLoopCloseEndsGoroutine(t *testing.T) {
	base := runtime.NumGoroutine()
	l := NewLoop(1)
	var ran atomic.Int32
	l.Schedule(func() { ran.Add(1) })
	testrig.Eventually(t, 10*time.Second, "first run", func() bool { return ran.Load() == 1 })
	l.Close()
	l.Close() // idempotent
	testrig.Eventually(t, 10*time.Second, "loop goroutine ended", func() bool { return runtime.NumGoroutine() <= base })
	l.Schedule(func() { ran.Add(1) })
	testrig.Eventually(t, 10*time.Second, "a run after Close", func() bool { return ran.Load() == 2 })
}
