package control

import (
	"testing"
	"time"
)

// TestServerIdlePollHasNoTimeout: the server's loop blocks with no timeout
// while idle (an idle kvxferd makes no periodic wake-up, docs/benchmarks.md);
// requests still end the poll, and Stop wakes it: with an hour's
// PollInterval, a request is answered and Stop returns.
func TestServerIdlePollHasNoTimeout(t *testing.T) {
	eng := newEngine(t)
	srv := startServer(t, eng, func(c *Config) { c.PollInterval = time.Hour })
	guard := func(what string, f func()) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			f()
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: still blocked after 20 s", what)
		}
	}
	for range 3 {
		c, err := Dial(srv.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		guard("Hello", func() {
			if _, err := c.Hello(nil); err != nil {
				t.Error(err)
			}
		})
		_ = c.Close()
	}
	guard("Stop", srv.Stop)
	select {
	case <-srv.done:
	default:
		t.Fatal("Stop returned before the loop ended")
	}
}

// TestShmSafetyWakeBacksOff: an idle session's doorbell safety timeout
// doubles from shmSafetyWake after each one that finds nothing, and stays at
// shmSafetyWakeMax (so an idle session wakes at most every 6.4 s; records
// and doorbells reset it to shmSafetyWake in the consumer loop).
func TestShmSafetyWakeBacksOff(t *testing.T) {
	d := shmSafetyWake
	var got []time.Duration
	for range 9 {
		got = append(got, d)
		d = nextSafetyWake(d)
	}
	want := []time.Duration{100, 200, 400, 800, 1600, 3200, 6400, 6400, 6400}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("safety timeouts %v, want %v ms", got, want)
		}
	}
}
