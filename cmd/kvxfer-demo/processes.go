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
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/kvxfer/kvxfer/emul/decode"
	"github.com/kvxfer/kvxfer/emul/sched"
)

// processesMain runs kvxferd, kvxfer-sched and kvxfer-decode as three OS
// processes that only talk over SGLang's protocol (bootstrap HTTP, ZMQ frames,
// NIXL notifications through shared memory) and kvxferd's control API.
func processesMain(args []string) error {
	fs := flag.NewFlagSet("kvxfer-demo", flag.ContinueOnError)
	rooms := fs.Int("rooms", 5000, "rooms to run")
	conc := fs.Int("concurrency", 64, "rooms in flight at once (each side)")
	seed := fs.Uint64("seed", 1, "workload seed (shared by both emulators)")
	abortShare := fs.Float64("abort-share", 0.2, "share of rooms with an abort plan (decode or prefill side, random phase)")
	proto := fs.String("decode-protocol", "ack", "ack (KV_STATUS/ABORT_ACK after the drain) or baseline")
	limit := fs.Duration("timeout", 10*time.Minute, "give up on the whole run after this long")
	keep := fs.Bool("keep", false, "keep the run directory (logs, JSON summaries)")
	if err := fs.Parse(args); err != nil {
		return err
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

	fmt.Printf("kvxfer demo: kvxferd + prefill scheduler emulator + decode emulator as separate processes\n")
	fmt.Printf("  %d rooms, %d in flight, %.0f%% with an abort plan, decode protocol %s, bootstrap %s\n\n", *rooms, *conc, 100**abortShare, *proto, boot)

	logFile, err := os.Create(filepath.Join(dir, "kvxferd.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	daemon := exec.Command(filepath.Join(bin, "kvxferd"), "-control", ctl, "-disaggregation-bootstrap-port", strconv.Itoa(port),
		"-decode-protocol", *proto, "-log-level", "warn", "-debug-addr", "")
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

	common := []string{"-rooms", strconv.Itoa(*rooms), "-concurrency", strconv.Itoa(*conc),
		"-seed", strconv.FormatUint(*seed, 10), "-abort-share", strconv.FormatFloat(*abortShare, 'f', -1, 64)}
	schedJSON, decodeJSON := filepath.Join(dir, "sched.json"), filepath.Join(dir, "decode.json")
	schedCmd := exec.CommandContext(ctx, filepath.Join(bin, "kvxfer-sched"), append([]string{"-control", ctl, "-json", schedJSON}, common...)...)
	// A baseline decode hears of a prefill-side abort only through its own
	// waiting timeout (spec §6.3 P4), so the demo keeps that short.
	waiting := "20s"
	if *proto == "baseline" {
		waiting = "3s"
	}
	decodeArgs := append([]string{"-bootstrap", boot, "-json", decodeJSON, "-waiting-timeout", waiting, "-decode-protocol", *proto,
		// The rank registers only once the scheduler registered its memory:
		// retry the topology query often so startup does not skew latencies.
		"-topology-retry", "20ms", "-topology-attempts", "1000"}, common...)
	decodeCmd := exec.CommandContext(ctx, filepath.Join(bin, "kvxfer-decode"), decodeArgs...)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, c := range []*exec.Cmd{schedCmd, decodeCmd} {
		name := []string{"sched ", "decode"}[i]
		out, err := c.StdoutPipe()
		if err != nil {
			return err
		}
		c.Stderr = c.Stdout
		if err := c.Start(); err != nil {
			return fmt.Errorf("starting %s: %w", name, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			prefix(out, "["+name+"] ")
			errs[i] = c.Wait()
		}()
	}
	wg.Wait()
	wall := time.Since(start)

	// Stop kvxferd as an operator would: SIGTERM, then it fails what is left
	// (nothing, if the run was clean) and drains.
	daemon.Process.Signal(syscall.SIGTERM)
	var daemonErr error
	select {
	case daemonErr = <-daemonDone:
	case <-time.After(20 * time.Second):
		daemon.Process.Kill()
		daemonErr = errors.New("kvxferd did not stop within 20 s of SIGTERM")
	}

	var s sched.Summary
	readJSON(schedJSON, &s)
	var d decode.Summary
	readJSON(decodeJSON, &d)
	fmt.Printf("\n== summary (%.1f s wall) ==\n", wall.Seconds())
	fmt.Printf("prefill side: %d rooms, pinned %d, %.0f rooms/s, time-to-terminal p50 %.2f ms p99 %.2f ms\n",
		s.Rooms, s.Pinned, s.RoomsPerS, s.P50Millis, s.P99Millis)
	fmt.Printf("decode side:  %d rooms, %d bytes verified, wrong bytes %d, aux errors %d, pages held %d, unexpected outcomes %d\n",
		d.Rooms, d.BytesVerified, d.WrongBytes, d.AuxErrors, d.PagesHeld+d.AuxHeld, d.Unexpected)
	var failed []string
	if errs[0] != nil {
		failed = append(failed, "scheduler emulator: "+errs[0].Error())
	}
	if errs[1] != nil {
		failed = append(failed, "decode emulator: "+errs[1].Error())
	}
	if daemonErr != nil {
		failed = append(failed, "kvxferd: "+daemonErr.Error()+" (log: "+logFile.Name()+")")
	}
	if s.Pinned > 0 || s.Rooms != *rooms {
		failed = append(failed, fmt.Sprintf("%d rooms pinned, %d of %d reported", s.Pinned, s.Rooms, *rooms))
	}
	if d.WrongBytes > 0 || d.AuxErrors > 0 || d.PagesHeld > 0 || d.Rooms != *rooms {
		failed = append(failed, fmt.Sprintf("decode: %d wrong bytes, %d aux errors, %d pages held, %d of %d rooms", d.WrongBytes, d.AuxErrors, d.PagesHeld, d.Rooms, *rooms))
	}
	if len(failed) > 0 {
		*keep = true
		return fmt.Errorf("demo failed:\n  %s\n  run directory kept: %s", joinLines(failed), dir)
	}
	fmt.Println("OK: no room pinned, every byte decode received was verified, every process exited cleanly")
	return nil
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
