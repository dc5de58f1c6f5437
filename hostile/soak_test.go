package hostile

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestSoak runs kvxferd for KVXFER_SOAK_DURATION (default 5 minutes) with a
// 5 s tombstone TTL under an honest workload of 100 rooms/s and a trickle of
// hostile traffic (ABORTs with generations for rooms nobody opened, 500/s,
// each leaving a tombstone), sampling RSS every 5 s. RSS must level off: the
// last third's peak at most 10 % (or 8 MiB) above the middle third's.
// `make soak` runs it (KVXFER_SOAK=1); it is not part of CI.
func TestSoak(t *testing.T) {
	if os.Getenv("KVXFER_SOAK") != "1" {
		t.Skip("soak: set KVXFER_SOAK=1 (make soak)")
	}
	dur := 5 * time.Minute
	if v := os.Getenv("KVXFER_SOAK_DURATION"); v != "" {
		var err error
		if dur, err = time.ParseDuration(v); err != nil {
			t.Fatalf("KVXFER_SOAK_DURATION: %v", err)
		}
	}
	const rate = 100.0
	d := startDaemon(t, daemonOpts{env: []string{"KVXFER_TOMBSTONE_TTL=5"}, args: []string{"-log-level", "warn"}})
	rooms := int(rate * dur.Seconds())
	w := startWorkload(t, d, workloadOpts{rooms: rooms, rate: rate, conc: 64})
	if err := d.waitLive(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	f := newFakeDecode(t, "soak", 0)
	push := dialPusher(t, d.zmqPort)
	if err := push.send(f.registration(t)); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	trickled := 0
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for range 5 {
				push.send(abortFrames(attackRoom(trickled), "127.0.0.1", f.port, uint64(trickled+1)))
				trickled++
			}
		}
	}()
	type point struct {
		at time.Duration
		p  procStats
	}
	var series []point
	start := time.Now()
loop:
	for time.Since(start) < dur && d.Alive() {
		series = append(series, point{time.Since(start), d.proc()})
		select {
		case <-w.sched.Done():
			break loop
		case <-time.After(5 * time.Second):
		}
	}
	close(stop)
	series = append(series, point{time.Since(start), d.proc()})
	desc, okHonest := w.result(dur + 2*time.Minute)
	record(t, "soak honest rooms", "all succeed, 0 wrong bytes", desc, okHonest)
	third := len(series) / 3
	peak := func(ps []point) float64 {
		m := 0.0
		for _, x := range ps {
			m = max(m, x.p.rssMiB())
		}
		return m
	}
	mid, last := peak(series[third:2*third]), peak(series[2*third:])
	ok := d.Alive() && (last <= mid*1.10 || last <= mid+8)
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "Soak of %s (%d honest rooms at %.0f/s, %d hostile ABORTs, tombstone TTL 5 s), run %s.\n\n",
		dur, rooms, rate, trickled, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintln(&buf, "| t (s) | RSS (MiB) | threads | fds |")
	fmt.Fprintln(&buf, "|---|---|---|---|")
	step := max(1, len(series)/12)
	for i, x := range series {
		if i%step == 0 || i == len(series)-1 {
			fmt.Fprintf(&buf, "| %.0f | %.1f | %d | %d |\n", x.at.Seconds(), x.p.rssMiB(), x.p.Threads, x.p.FDs)
		}
	}
	fmt.Fprintf(&buf, "\nPeak RSS middle third %.1f MiB, last third %.1f MiB (%+.1f %%); honest: %s.\n", mid, last, 100*(last-mid)/max(mid, 1), desc)
	t.Log("\n" + buf.String())
	record(t, "soak RSS levels off", "last third's peak ≤ middle third's + 10 % (or + 8 MiB)", fmt.Sprintf("middle %.1f MiB, last %.1f MiB", mid, last), ok)
	if p := os.Getenv("KVXFER_HOSTILE_DOC"); p != "" {
		if err := writeSection(p, "soak", buf.String()); err != nil {
			t.Log(err)
		}
	}
	checkDaemon(t, d, d.proc(), bounds.steady)
}
