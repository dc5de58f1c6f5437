package hostile

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// F2: ABORT frames naming 3,300 distinct ip:port return addresses (all
// loopback, nothing listening), each for its own unknown room.
func TestF2ReturnAddresses(t *testing.T) {
	hostile(t)
	d := startDaemon(t, daemonOpts{})
	c := newCanary(t, t.TempDir(), 4096)
	w := startWorkload(t, d, workloadOpts{rooms: 300, rate: 40})
	if err := d.waitLive(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	before := d.proc()
	s := d.sample(50 * time.Millisecond)
	push := dialPusher(t, d.zmqPort)
	const n = 3300
	start := time.Now()
	sent, err := push.flood(n, 60*time.Second, func(i int) [][]byte {
		return abortFrames(attackRoom(i), "127.0.0.1", 30000+i, 0)
	})
	// Give the daemon the time the unfixed daemon took to crash (about 4.8 s) to act on them.
	time.Sleep(6 * time.Second)
	after := d.proc()
	peak := s.now()
	m := fmt.Sprintf("%d ABORTs in %.1f s; before %s; 6 s later %s; peak %d threads, %d fds", sent, time.Since(start).Seconds(), before, after, peak.Threads, peak.FDs)
	if err != nil {
		m += " (send stopped: " + err.Error() + ")"
	}
	if !d.Alive() {
		m += "; kvxferd died: " + d.ExitDesc()
	}
	record(t, "F2 ABORTs from 3,300 distinct return addresses", bounds.f2.String(), m,
		d.Alive() && peak.Threads <= bounds.f2.threads && peak.FDs <= bounds.f2.fds)
	checkHonest(t, w, 60*time.Second)
	checkDaemon(t, d, s.end(), bounds.f2, c)
}

// F2b: an honest decode process restarting N times (each run registers under
// a new agent name from a new PULL endpoint, then exits): no growth per restart.
func TestF2bDecodeRestarts(t *testing.T) {
	hostile(t)
	d := startDaemon(t, daemonOpts{})
	c := newCanary(t, t.TempDir(), 4096)
	w := startWorkload(t, d, workloadOpts{rooms: 300, rate: 12})
	if err := d.waitLive(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the honest decode registered and its link is up
	s := d.sample(50 * time.Millisecond)
	before := d.proc()
	const restarts = 12
	bin := binDir(t)
	dir := t.TempDir()
	start := time.Now()
	failed := 0
	for k := range restarts {
		// A different seed: these rooms are not the scheduler's, so they end by
		// decode's waiting timeout (it aborts them) and the process exits.
		cmd := exec.Command(filepath.Join(bin, "kvxfer-decode"), "-bootstrap", d.boot, "-sglang", "0.5.20", "-rooms", "2",
			"-seed", strconv.Itoa(1000+k), "-abort-share", "0", "-dummy-share", "0", "-waiting-timeout", "300ms",
			"-release-timeout", "300ms", "-quiet", "-topology-retry", "20ms", "-json", filepath.Join(dir, fmt.Sprintf("d%d.json", k)))
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
			failed++
		}
	}
	// Loss detection and eviction: up to 10 s for the growth to settle.
	settle := time.Now()
	after := d.proc()
	for time.Since(settle) < 10*time.Second {
		time.Sleep(500 * time.Millisecond)
		after = d.proc()
		if after.Threads-before.Threads <= bounds.f2bThreads && after.FDs-before.FDs <= bounds.f2bFDs && after.Maps-before.Maps <= bounds.f2bMaps {
			break
		}
	}
	dt, df, dm := after.Threads-before.Threads, after.FDs-before.FDs, after.Maps-before.Maps
	m := fmt.Sprintf("%d restarts in %.1f s: threads %+d, fds %+d, mapped shm files %+d (%.2f / %.2f / %.2f per restart) %.1f s after the last; before %s, after %s",
		restarts, time.Since(start).Seconds(), dt, df, dm, float64(dt)/restarts, float64(df)/restarts, float64(dm)/restarts, time.Since(settle).Seconds(), before, after)
	if failed > 0 {
		m += fmt.Sprintf("; %d decode runs killed at 20 s", failed)
	}
	record(t, "F2b honest decode restarting", fmt.Sprintf("growth over %d restarts: threads ≤ %d, fds ≤ %d, mapped files ≤ %d", restarts, bounds.f2bThreads, bounds.f2bFDs, bounds.f2bMaps),
		m, d.Alive() && dt <= bounds.f2bThreads && df <= bounds.f2bFDs && dm <= bounds.f2bMaps)
	checkHonest(t, w, 60*time.Second)
	checkDaemon(t, d, s.end(), bounds.steady, c)
}

// F3: SIGTERM with 10,000 notices owed to a registered decode whose endpoint
// accepts TCP but never speaks ZMTP or reads (a hung process): the exit is bounded.
func TestF3ShutdownBound(t *testing.T) {
	hostile(t)
	d := startDaemon(t, daemonOpts{})
	c := newCanary(t, t.TempDir(), 4096)
	w := startWorkload(t, d, workloadOpts{rooms: 300, rate: 60})
	if err := d.waitLive(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	var held []net.Conn
	go func() {
		for {
			c, err := dead.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // accepted, never read or written
		}
	}()
	f := newFakeDecode(t, "f3", dead.Addr().(*net.TCPAddr).Port)
	push := dialPusher(t, d.zmqPort)
	if err := push.send(f.registration(t)); err != nil {
		t.Fatal(err)
	}
	const n = 10000
	sent, ferr := push.flood(n, 60*time.Second, func(i int) [][]byte {
		return transferInfo(f.name(), f.port, attackRoom(i), 1)
	})
	// Also ABORTs with a generation for another 1,000 rooms: their ACKs are owed too.
	push.flood(1000, 10*time.Second, func(i int) [][]byte {
		return abortFrames(attackRoom(n+i), "127.0.0.1", f.port, uint64(i+1))
	})
	s := d.sample(50 * time.Millisecond)
	checkHonest(t, w, 60*time.Second)
	_, stats := d.counters()
	peak := s.end()
	took, exited := d.Stop(40 * time.Second)
	m := fmt.Sprintf("%d transfer infos + 1,000 ABORTs owed to a hung endpoint (live rooms at SIGTERM: %v); exit %.1f s after SIGTERM (%s)",
		sent, stats["LiveRooms"], took.Seconds(), d.ExitDesc())
	if !exited {
		m = fmt.Sprintf("%d transfer infos + 1,000 ABORTs; still running %.0f s after SIGTERM (killed)", sent, took.Seconds())
	}
	if ferr != nil {
		m += " (flood stopped: " + ferr.Error() + ")"
	}
	record(t, "F3 SIGTERM with 10,000 notices owed to a dead endpoint", fmt.Sprintf("exit ≤ %s", bounds.f3Exit), m, exited && took <= bounds.f3Exit)
	why := c.check()
	record(t, "canary", "unchanged", map[bool]string{true: "unchanged", false: why}[why == ""], why == "")
	bounds.steady.check(t, peak)
}

// F5: 200,000 ABORTs (with generations) whose ACKs go to a registered decode
// that is unreachable: the log stays small.
func TestF5LogFlood(t *testing.T) {
	hostile(t)
	d := startDaemon(t, daemonOpts{})
	c := newCanary(t, t.TempDir(), 4096)
	w := startWorkload(t, d, workloadOpts{rooms: 300, rate: 30})
	if err := d.waitLive(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	s := d.sample(100 * time.Millisecond)
	unreachable := freePort(t) // nothing listens there
	f := newFakeDecode(t, "f5", unreachable)
	push := dialPusher(t, d.zmqPort)
	if err := push.send(f.registration(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	logBefore := d.logSize()
	const n = 200000
	start := time.Now()
	sent, err := push.flood(n, 120*time.Second, func(i int) [][]byte {
		return abortFrames(attackRoom(i), "127.0.0.1", unreachable, uint64(i+1))
	})
	time.Sleep(3 * time.Second)
	grown := d.logSize() - logBefore
	cnt, _ := d.counters()
	m := fmt.Sprintf("%d ABORTs in %.1f s: log +%d bytes (%d \"dropped\" lines in all), notices_dropped %d",
		sent, time.Since(start).Seconds(), grown, d.logCount("dropped"), cnt["notices_dropped"])
	if err != nil {
		m += " (flood stopped: " + err.Error() + ")"
	}
	record(t, "F5 200,000 ABORTs to an unreachable decode", fmt.Sprintf("log growth ≤ %d KiB", bounds.f5LogBytes>>10), m, grown <= bounds.f5LogBytes)
	checkHonest(t, w, 90*time.Second)
	checkDaemon(t, d, s.end(), bounds.steady, c)
}
