package workload

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// Progress writes line() to w every interval while a workload runs, until the
// returned stop is called (stop waits for the writer goroutine). The one
// progress display of the drivers: the decode emulator's and the bench suite's.
// A nil w shows nothing.
func Progress(w io.Writer, every time.Duration, line func() string) (stop func()) {
	if w == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintln(w, line())
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}
