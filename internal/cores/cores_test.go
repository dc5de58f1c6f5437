package cores

import (
	"bytes"
	"errors"
	"runtime"
	"testing"
	"time"
)

func TestParseRunnable(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"0.18 1.76 2.97 3/812 12345\n", 3, true},
		{"11.62 9.01 5.68 13/900 1234", 13, true},
		{"1 2 3", 0, false},
		{"1 2 3 x 5", 0, false},
		{"1 2 3 a/b 5", 0, false},
	} {
		got, err := parseRunnable([]byte(c.in))
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseRunnable(%q) = %d, %v; want %d, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
	if _, err := readLoadavg(); err != nil {
		t.Logf("this machine's /proc/loadavg: %v (Free answers true)", err)
	}
}

// TestProbe: the answer follows the runnable count against the CPUs, is
// cached for Every on the probe's clock, and is true when unreadable.
func TestProbe(t *testing.T) {
	now := time.Unix(1000, 0)
	runnable, reads := 1, 0
	var fail error
	p := &Probe{CPUs: 2, Every: time.Millisecond, Now: func() time.Time { return now },
		Read: func() (int, error) { reads++; return runnable, fail }}
	if !p.Free() || reads != 1 {
		t.Fatalf("1 runnable on 2 CPUs: want free, one read (reads %d)", reads)
	}
	runnable = 5
	if !p.Free() || reads != 1 {
		t.Fatalf("within Every: want the cached answer without a read")
	}
	now = now.Add(time.Millisecond)
	if p.Free() || reads != 2 {
		t.Fatalf("5 runnable on 2 CPUs after Every: want not free (reads %d)", reads)
	}
	runnable = 2
	now = now.Add(time.Millisecond)
	if !p.Free() {
		t.Fatalf("2 runnable on 2 CPUs (the caller among them): want free")
	}
	fail = errors.New("no /proc")
	now = now.Add(time.Millisecond)
	if !p.Free() {
		t.Fatalf("unreadable: want free")
	}
}

// FuzzParseRunnable: any bytes parse or fail without a panic, and a parse
// that succeeds read the fourth field's numerator.
func FuzzParseRunnable(f *testing.F) {
	f.Add([]byte("0.18 1.76 2.97 3/812 12345\n"))
	f.Add([]byte("1 2 3 /"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := parseRunnable(b)
		if err == nil && n < 0 && !bytes.Contains(b, []byte("-")) {
			t.Fatalf("parseRunnable(%q) = %d without a minus sign", b, n)
		}
	})
}

// TestProbeWaitsForGoroutines: with the kernel's count free, a goroutine of
// this process waiting for a processor makes the answer not free.
func TestProbeWaitsForGoroutines(t *testing.T) {
	now := time.Unix(1000, 0)
	waiting := 0
	p := &Probe{CPUs: 2, Every: time.Millisecond, Now: func() time.Time { return now },
		Read: func() (int, error) { return 1, nil }, Waiting: func() int { return waiting }}
	if !p.Free() {
		t.Fatal("1 runnable on 2 CPUs, no goroutine waiting: want free")
	}
	waiting = 3
	now = now.Add(time.Millisecond)
	if p.Free() {
		t.Fatal("goroutines waiting for a processor: want not free")
	}
	p.Read = func() (int, error) { return 0, errors.New("no /proc") }
	now = now.Add(time.Millisecond)
	if p.Free() {
		t.Fatal("unreadable /proc but goroutines waiting: want not free")
	}
}

// TestGoWaitingCountsQueuedGoroutines: goroutines started while this one
// holds the only processor wait in its run queue, and the runtime says so.
func TestGoWaitingCountsQueuedGoroutines(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	done := make(chan struct{})
	for range 4 {
		go func() { done <- struct{}{} }()
	}
	n := goWaiting()
	for range 4 {
		<-done
	}
	if n < 1 {
		t.Fatalf("4 goroutines queued on the only processor: runtime reports %d waiting", n)
	}
	if n := goWaiting(); n > 1 {
		t.Logf("after they ran: %d waiting", n)
	}
}
