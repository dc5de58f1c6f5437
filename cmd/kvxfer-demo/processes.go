package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kvxfer/kvxfer/emul/decode"
	"github.com/kvxfer/kvxfer/emul/sched"
)

// defaultFleet is the decode fleet `make demo` runs: one decode process per
// wire dialect kvxferd tells apart on its own (0.5.20/0.5.21 look like 0.5.18
// until they fail a room; 0.5.22 shows itself with its first armed ABORT).
const defaultFleet = "0.5.18,0.5.22,0.5.23"

// decodeProc is one decode emulator process of the fleet.
type decodeProc struct {
	rel          decode.Release
	cmd          *exec.Cmd
	json, rooms  string
	err          error
	sum          decode.Summary
	outcomes     map[string]string
	disagree     int // decode Success, prefill Failed
	prefillOnly  int // prefill Success, decode did not complete
	missingRooms int // rooms one side did not report
}

// processesMain runs kvxferd, kvxfer-sched and one kvxfer-decode per release
// of the fleet as OS processes that only talk over SGLang's protocol
// (bootstrap HTTP, ZMQ frames, NIXL notifications through shared memory) and
// kvxferd's control API. The decodes share the scheduler's workload: decode k
// of n plays the rooms i with i % n == k.
func processesMain(args []string) error {
	fs := flag.NewFlagSet("kvxfer-demo", flag.ContinueOnError)
	rooms := fs.Int("rooms", 5000, "rooms to run")
	conc := fs.Int("concurrency", 64, "rooms in flight at once on the prefill side (each decode gets its share)")
	seed := fs.Uint64("seed", 1, "workload seed (shared by every emulator)")
	abortShare := fs.Float64("abort-share", 0.2, "share of rooms with an abort plan (decode or prefill side, random phase)")
	fleetFlag := fs.String("fleet", defaultFleet, "SGLang releases of the decode processes, comma-separated (one process each; repeats allowed)")
	proto := fs.String("decode-protocol", "auto", "kvxferd's -decode-protocol: auto, or a release every decode is taken for")
	legacy := fs.String("decode-protocol-legacy", "", "kvxferd's -decode-protocol-legacy (empty: its default)")
	releaseTimeout := fs.Duration("release-timeout", 15*time.Second, "decode's deferred-release timeout (0.5.21+)")
	limit := fs.Duration("timeout", 10*time.Minute, "give up on the whole run after this long")
	keep := fs.Bool("keep", false, "keep the run directory (logs, JSON summaries)")
	spinMax := fs.Duration("spin-max", 0, "the scheduler's shm_attach spin_max_us: the most kvxferd's ring consumer keeps spinning while records keep coming (0: kvxferd's default)")
	emulProcs := fs.Int("emulator-procs", 1, "GOMAXPROCS of the emulator processes, which stand in for single-threaded Python event loops (0: Go's default; a GOMAXPROCS in the environment wins)")
	gcFloor := fs.Int("gc-floor-mib", -1, "kvxferd's -gc-floor-mib (negative: its default)")
	pause := fs.Duration("pause-decode", 0, "stop the first decode process (SIGSTOP) this long, from "+pauseAfter.String()+" into the run, as a hung or stopped decode; the other decodes' rooms must not notice: a release timeout on one of them fails the run (needs two decodes or more)")
	profDir := fs.String("profile", "", "write kvxferd's CPU, block, mutex and heap profiles of the whole run into this directory (kvxferd.{cpu,block,mutex,heap}.pprof)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var fleet []*decodeProc
	for _, f := range strings.Split(*fleetFlag, ",") {
		rel, err := decode.ParseRelease(f)
		if err != nil {
			return fmt.Errorf("-fleet: %w", err)
		}
		fleet = append(fleet, &decodeProc{rel: rel})
	}
	if len(fleet) > *rooms {
		return fmt.Errorf("-fleet: %d decode processes for %d rooms", len(fleet), *rooms)
	}
	if *pause > 0 && len(fleet) < 2 {
		return errors.New("-pause-decode needs two decodes or more: the others are the ones checked")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	bin := filepath.Dir(exe)
	dir, err := os.MkdirTemp("", "kvxdemo")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Println("run directory:", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	ctl := "ipc://" + filepath.Join(dir, "ctl.sock")
	boot := "127.0.0.1:" + strconv.Itoa(port)
	ctx, cancel := context.WithTimeout(context.Background(), *limit)
	defer cancel()

	names := make([]string, len(fleet))
	for i, d := range fleet {
		names[i] = d.rel.String()
	}
	fmt.Printf("kvxfer demo: kvxferd + prefill scheduler emulator + %d decode emulators (SGLang %s) as separate processes\n",
		len(fleet), strings.Join(names, ", "))
	fmt.Printf("  %d rooms, %d in flight, %.0f%% with an abort plan, kvxferd -decode-protocol %s, bootstrap %s\n\n",
		*rooms, *conc, 100**abortShare, *proto, boot)

	logFile, err := os.Create(filepath.Join(dir, "kvxferd.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	// The loopback backend: every process of the demo is on this host and
	// shares the user's namespace /dev/shm/kvxfer-<euid>.
	dargs := []string{"-nixl-backend", "loopback", "-control", ctl, "-disaggregation-bootstrap-port", strconv.Itoa(port),
		"-decode-protocol", *proto, "-log-level", "warn", "-debug-addr", ""}
	if *legacy != "" {
		dargs = append(dargs, "-decode-protocol-legacy", *legacy)
	}
	if *gcFloor >= 0 {
		dargs = append(dargs, "-gc-floor-mib", strconv.Itoa(*gcFloor))
	}
	if *profDir != "" {
		if err := os.MkdirAll(*profDir, 0o755); err != nil {
			return err
		}
		for _, k := range []string{"cpu", "block", "mutex", "heap"} {
			dargs = append(dargs, "-"+k+"profile", filepath.Join(*profDir, "kvxferd."+k+".pprof"))
		}
	}
	daemon := exec.Command(filepath.Join(bin, "kvxferd"), dargs...)
	// Deadlines short enough that a demo run shows them working, long enough
	// for a loaded 2-core machine.
	daemon.Env = append(os.Environ(), "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=15", "KVXFER_WAITING_TIMEOUT=15",
		"KVXFER_TRANSFER_TIMEOUT=15", "KVXFER_DRAIN_TIMEOUT=3", "KVXFER_LINGER_TIMEOUT=30")
	daemon.Stdout, daemon.Stderr = logFile, logFile
	if err := daemon.Start(); err != nil {
		return fmt.Errorf("starting kvxferd: %w", err)
	}
	daemonDone := make(chan error, 1)
	go func() { daemonDone <- daemon.Wait() }()
	defer func() {
		if daemon.ProcessState == nil {
			daemon.Process.Kill()
		}
	}()
	if err := waitFor(ctx, filepath.Join(dir, "ctl.sock"), daemonDone); err != nil {
		return fmt.Errorf("kvxferd did not come up (log: %s): %w", logFile.Name(), err)
	}

	workloadArgs := []string{"-rooms", strconv.Itoa(*rooms), "-seed", strconv.FormatUint(*seed, 10),
		"-abort-share", strconv.FormatFloat(*abortShare, 'f', -1, 64)}
	schedJSON, schedRooms := filepath.Join(dir, "sched.json"), filepath.Join(dir, "sched-rooms.json")
	schedCmd := exec.CommandContext(ctx, filepath.Join(bin, "kvxfer-sched"),
		schedArgs(ctl, schedJSON, schedRooms, *conc, *spinMax, workloadArgs)...)
	cmds := []*exec.Cmd{schedCmd}
	// The emulators play single-threaded Python processes (SGLang's
	// scheduler and decode event loops): one Go processor each, unless the
	// environment says otherwise. kvxferd keeps Go's default.
	emulEnv := emulatorEnv(os.Environ(), *emulProcs)
	schedCmd.Env = emulEnv
	labels := []string{"sched"}
	// Each decode's window covers about as many workload indices as the
	// scheduler's, so the windows overlap (docs/emulators.md).
	share := max(1, (*conc+len(fleet)-1)/len(fleet))
	for k, d := range fleet {
		d.json = filepath.Join(dir, fmt.Sprintf("decode%d.json", k))
		d.rooms = filepath.Join(dir, fmt.Sprintf("decode%d-rooms.json", k))
		// 0.5.18 hears of a prefill-side abort only through its own waiting
		// timeout (it never reads KV_STATUS), so the demo keeps that short.
		waiting := "20s"
		if !d.rel.ReadsPull() {
			waiting = "3s"
		}
		dargs := append([]string{"-bootstrap", boot, "-sglang", d.rel.String(), "-shard", fmt.Sprintf("%d/%d", k, len(fleet)),
			"-concurrency", strconv.Itoa(share), "-json", d.json, "-rooms-out", d.rooms, "-waiting-timeout", waiting,
			"-release-timeout", releaseTimeout.String(),
			// The rank registers only once the scheduler registered its memory:
			// retry the topology query often so startup does not skew latencies.
			"-topology-retry", "20ms", "-topology-attempts", "1000"}, workloadArgs...)
		d.cmd = exec.CommandContext(ctx, filepath.Join(bin, "kvxfer-decode"), dargs...)
		d.cmd.Env = emulEnv
		cmds = append(cmds, d.cmd)
		labels = append(labels, "decode "+d.rel.String())
	}
	width := 0
	for _, l := range labels {
		width = max(width, len(l))
	}
	loadStart := loadAvg1()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(cmds))
	ended := make([]time.Time, len(cmds))
	for i, c := range cmds {
		name := fmt.Sprintf("[%-*s] ", width, labels[i])
		out, err := c.StdoutPipe()
		if err != nil {
			return err
		}
		c.Stderr = c.Stdout
		if err := c.Start(); err != nil {
			return fmt.Errorf("starting %s: %w", labels[i], err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			prefix(out, name)
			errs[i] = c.Wait()
			ended[i] = time.Now()
		}()
	}
	paused := make(chan time.Time, 1)
	if *pause > 0 {
		go func() { paused <- pauseProcess(ctx, fleet[0].cmd.Process, pauseAfter, *pause, os.Stdout) }()
	}
	wg.Wait()
	wall := time.Since(start)
	for i, d := range fleet {
		d.err = errs[i+1]
	}

	// Stop kvxferd as an operator would: SIGTERM, then it fails what is left
	// (nothing, if the run was clean) and drains.
	daemon.Process.Signal(syscall.SIGTERM)
	var daemonErr error
	var daemonPS *os.ProcessState // set once Wait returned
	select {
	case daemonErr = <-daemonDone:
		daemonPS = daemon.ProcessState
	case <-time.After(20 * time.Second):
		daemon.Process.Kill()
		daemonErr = errors.New("kvxferd did not stop within 20 s of SIGTERM")
	}

	var s sched.Summary
	readJSON(schedJSON, &s)
	var prefillRooms map[string]string
	readJSON(schedRooms, &prefillRooms)
	decodeRooms := 0
	for _, d := range fleet {
		readJSON(d.json, &d.sum)
		readJSON(d.rooms, &d.outcomes)
		decodeRooms += d.sum.Rooms
		d.join(prefillRooms)
	}
	fmt.Printf("\n== summary (%.1f s wall) ==\n", wall.Seconds())
	fmt.Printf("prefill side: %d rooms, pinned %d, %.0f rooms/s, time-to-terminal p50 %.2f ms p99 %.2f ms\n\n",
		s.Rooms, s.Pinned, s.RoomsPerS, s.P50Millis, s.P99Millis)
	printCPU(os.Stdout, s.Rooms, daemonPS, schedCmd.ProcessState, fleet)
	if s.Rooms > 0 {
		fmt.Println(goalLine(*fleetFlag, *abortShare, s.RoomsPerS, s.P50Millis,
			float64(cpuOf(daemonPS).Microseconds())/float64(s.Rooms), loadStart, loadAvg1()))
		fmt.Println()
	}
	printFleet(os.Stdout, fleet)

	var failed []string
	if errs[0] != nil {
		failed = append(failed, "scheduler emulator: "+errs[0].Error())
	}
	for _, d := range fleet {
		if d.err != nil {
			failed = append(failed, fmt.Sprintf("decode emulator %s: %v", d.rel, d.err))
		}
		if d.sum.WrongBytes > 0 || d.sum.AuxErrors > 0 || d.sum.PagesHeld+d.sum.AuxHeld > 0 {
			failed = append(failed, fmt.Sprintf("decode %s: %d wrong bytes, %d aux errors, %d pages held",
				d.rel, d.sum.WrongBytes, d.sum.AuxErrors, d.sum.PagesHeld+d.sum.AuxHeld))
		}
		if d.disagree > 0 {
			failed = append(failed, fmt.Sprintf("decode %s: %d rooms completed on decode that the scheduler was told failed", d.rel, d.disagree))
		}
	}
	if *pause > 0 {
		if at := <-paused; at.IsZero() || !ended[1].After(at) {
			failed = append(failed, "-pause-decode: decode "+fleet[0].rel.String()+" had ended before the pause: nothing was checked (raise -rooms)")
		}
		for _, d := range fleet[1:] {
			if d.sum.ReleaseTimeouts > 0 {
				failed = append(failed, fmt.Sprintf("decode %s (not paused): %d rooms whose ABORT_ACK never came (release timeouts) while decode %s was stopped",
					d.rel, d.sum.ReleaseTimeouts, fleet[0].rel))
			}
		}
	}
	if daemonErr != nil {
		failed = append(failed, "kvxferd: "+daemonErr.Error()+" (log: "+logFile.Name()+")")
	}
	if s.Pinned > 0 || s.Rooms != *rooms {
		failed = append(failed, fmt.Sprintf("%d rooms pinned, %d of %d reported", s.Pinned, s.Rooms, *rooms))
	}
	if decodeRooms != *rooms {
		failed = append(failed, fmt.Sprintf("decode: %d of %d rooms reported", decodeRooms, *rooms))
	}
	if len(failed) > 0 {
		*keep = true
		return fmt.Errorf("demo failed:\n  %s\n  run directory kept: %s", joinLines(failed), dir)
	}
	fmt.Println("OK: no room pinned, every byte decode received was verified, no page held, both sides agree, every process exited cleanly")
	return nil
}

// pauseAfter is how far into the run -pause-decode stops its decode.
const pauseAfter = 300 * time.Millisecond

// pauseProcess stops p (SIGSTOP) after `after` for `d`, then lets it go on
// (SIGCONT; also if ctx ends first, so that the run can end). It returns when
// it stopped p (zero: it did not).
func pauseProcess(ctx context.Context, p *os.Process, after, d time.Duration, w io.Writer) time.Time {
	select {
	case <-time.After(after):
	case <-ctx.Done():
		return time.Time{}
	}
	if p.Signal(syscall.SIGSTOP) != nil {
		return time.Time{} // already exited
	}
	at := time.Now()
	fmt.Fprintf(w, "[demo] decode process %d stopped for %s\n", p.Pid, d)
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	p.Signal(syscall.SIGCONT)
	fmt.Fprintf(w, "[demo] decode process %d continued\n", p.Pid)
	return at
}

// join compares the decode's per-room outcomes with the scheduler's.
func (d *decodeProc) join(prefill map[string]string) {
	for id, o := range d.outcomes {
		p, ok := prefill[id]
		switch {
		case !ok:
			d.missingRooms++
		case o == "success" && !strings.HasPrefix(p, "Success"):
			d.disagree++
		case o != "success" && strings.HasPrefix(p, "Success"):
			d.prefillOnly++
		}
	}
}

// printFleet writes one row per decode process in three tables: outcomes and
// completion signals; page releases and ABORT_ACK handling; byte checks and
// the join with the scheduler's outcomes.
func printFleet(w io.Writer, fleet []*decodeProc) {
	table := func(header string, row func(d *decodeProc) []any) {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, header+"\t")
		for _, d := range fleet {
			r := row(d)
			fmt.Fprintf(tw, strings.Repeat("%v\t", len(r))+"\n", r...)
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	table("SGLang\trooms\tsuccess\tfailed_kv_status\taborted\twaiting_timeout\tother\tdone_by_notifs\tdone_by_kv_status\tunexpected", func(d *decodeProc) []any {
		o := d.sum.Outcomes
		other := d.sum.Rooms - o["success"] - o["failed_kv_status"] - o["aborted"] - o["waiting_timeout"]
		return []any{d.rel, d.sum.Rooms, o["success"], o["failed_kv_status"], o["aborted"], o["waiting_timeout"], other,
			d.sum.CompletedBy[decode.CompletedByNotifs], d.sum.CompletedBy[decode.CompletedByStatus], d.sum.Unexpected}
	})
	table("SGLang\tpages_freed_by_ack\tpages_freed_by_timeout\tabort_generations\tacks_counted\tacks_ignored(no_gen/stale/unarmed)\tqueued_unread\tunsafe_frees", func(d *decodeProc) []any {
		s := &d.sum
		return []any{d.rel, s.PagesByAck, s.PagesByTimeout, s.Generations, s.AcksCounted,
			fmt.Sprintf("%d/%d/%d", s.AcksNoGen, s.AcksStale, s.AcksUnarmed), s.Queued, s.UnsafeReleases}
	})
	table("SGLang\tbytes_verified\twrong_bytes\taux_errors\tpages_held\tdisagreements\tprefill_only_success", func(d *decodeProc) []any {
		s := &d.sum
		return []any{d.rel, s.BytesVerified, s.WrongBytes, s.AuxErrors, s.PagesHeld + s.AuxHeld, d.disagree, d.prefillOnly}
	})
	fmt.Fprintln(w, "disagreements: decode completed a room the scheduler saw fail (fatal); prefill_only_success: the scheduler saw")
	fmt.Fprintln(w, "Success but decode gave up first (its abort or waiting timeout raced the completion); unsafe_frees: rooms whose")
	fmt.Fprintln(w, "pages decode freed with no word that writes were done (0.5.18/0.5.20 after an ABORT, release timeouts)")
}
func joinLines(ss []string) string {
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += "\n  "
		}
		out += s
	}
	return out
}

func readJSON(path string, v any) {
	b, err := os.ReadFile(path)
	if err == nil {
		json.Unmarshal(b, v)
	}
}

// schedArgs is kvxfer-sched's command line: -spin-max only when set, so
// that 0 leaves kvxferd's default.
func schedArgs(ctl, jsonOut, roomsOut string, conc int, spinMax time.Duration, workload []string) []string {
	args := []string{"-control", ctl, "-json", jsonOut, "-rooms-out", roomsOut, "-concurrency", strconv.Itoa(conc)}
	if spinMax > 0 {
		args = append(args, "-spin-max", spinMax.String())
	}
	return append(args, workload...)
}

// emulatorEnv is the emulators' environment: environ plus GOMAXPROCS=procs,
// unless environ sets GOMAXPROCS already or procs is 0 (Go's default).
func emulatorEnv(environ []string, procs int) []string {
	env := slices.Clone(environ)
	for _, kv := range environ {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return env
		}
	}
	if procs > 0 {
		env = append(env, "GOMAXPROCS="+strconv.Itoa(procs))
	}
	return env
}

// cpuOf is a finished process's CPU time (user + system, every thread).
func cpuOf(ps *os.ProcessState) time.Duration {
	if ps == nil {
		return 0
	}
	return ps.UserTime() + ps.SystemTime()
}

// printCPU writes each process's CPU time per room over its whole life
// (start-up and shutdown included), so that where the demo's CPU goes can be
// read from one run.
func printCPU(w io.Writer, rooms int, daemon, sched *os.ProcessState, fleet []*decodeProc) {
	if rooms <= 0 {
		return
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(rooms) }
	var decodes time.Duration
	parts := make([]string, len(fleet))
	for i, d := range fleet {
		c := cpuOf(d.cmd.ProcessState)
		decodes += c
		parts[i] = fmt.Sprintf("%s %.0f", d.rel, per(c))
	}
	all := cpuOf(daemon) + cpuOf(sched) + decodes
	fmt.Fprintf(w, "CPU per room (user+sys, whole process): kvxferd %.0f µs, scheduler %.0f µs, decodes %.0f µs (%s), all %.0f µs\n\n",
		per(cpuOf(daemon)), per(cpuOf(sched)), per(decodes), strings.Join(parts, ", "), per(all))
}

func prefix(r io.Reader, p string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fmt.Println(p + sc.Text())
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitFor waits until path exists (the control socket), or the daemon exits.
func waitFor(ctx context.Context, path string, exited <-chan error) error {
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("kvxferd exited: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
