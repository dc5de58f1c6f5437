// Command kvxfer-decode is an SGLang decode rank (NIXL backend) in a box: it
// looks the prefill up through the bootstrap server, registers its KV memory
// with every target prefill rank, plays the shared deterministic workload
// (emul/workload; kvxfer-sched plays the prefill side of the same rooms), and
// verifies every byte kvxfer writes into its pages. It prints a summary (and
// writes it as JSON with -json) and exits non-zero if any byte was wrong or any
// page is still held at the end. -sglang picks the release it plays (frames,
// completion rule, ABORT generations, deferred page release). See
// docs/emulators.md. -nixl-backend nixl uses the real NIXL library, so that
// decode can run on another host than kvxferd (docs/hosts.md).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/kvxfer/kvxfer/emul/decode"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
)

func main() {
	if err := run(os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kvxfer-decode:", err)
		os.Exit(1)
	}
}

// envSeconds reads an SGLang duration variable (seconds, fractions allowed).
func envSeconds(getenv func(string) string, name string, def time.Duration) time.Duration {
	if f, err := strconv.ParseFloat(getenv(name), 64); err == nil && f > 0 {
		return time.Duration(f * float64(time.Second))
	}
	return def
}

func envInt(getenv func(string) string, name string, def int) int {
	if v, err := strconv.Atoi(getenv(name)); err == nil {
		return v
	}
	return def
}

func run(args []string, getenv func(string) string, out io.Writer) error {
	cfg := decode.DefaultConfig()
	fs := flag.NewFlagSet("kvxfer-decode", flag.ContinueOnError)
	cfg.Workload.RegisterFlags(fs)
	fs.StringVar(&cfg.Bootstrap, "bootstrap", "127.0.0.1:8998", "prefill bootstrap server host:port")
	fs.StringVar(&cfg.Host, "host", cfg.Host, "IP decode binds its PULL socket to and advertises")
	fs.IntVar(&cfg.PageSize, "page-size", 0, "decode page size; the prefill's must match (0: no check)")
	fs.StringVar(&cfg.KVCacheDtype, "kv-cache-dtype", "auto", "decode kv_cache_dtype; the prefill's must match (empty: no check)")
	fs.IntVar(&cfg.TPSize, "tp-size", cfg.TPSize, "decode attention TP size")
	fs.IntVar(&cfg.TPRank, "tp-rank", cfg.TPRank, "decode engine rank")
	fs.IntVar(&cfg.PPSize, "pp-size", cfg.PPSize, "decode PP size (1: pull from every prefill stage)")
	fs.BoolVar(&cfg.MLA, "mla", false, "MLA model (decode TP < prefill TP: dummy transfer infos to the extra ranks)")
	fs.IntVar(&cfg.GPU, "gpu", 0, "gpu_id sent in the registration")
	fs.IntVar(&cfg.Shape.Layers, "layers", cfg.Shape.Layers, "KV layers (2 buffers each, K then V)")
	fs.IntVar(&cfg.Shape.Slots, "slots", cfg.Shape.Slots, "KV pages per buffer")
	fs.IntVar(&cfg.Shape.Item, "item", cfg.Shape.Item, "bytes of one page of one buffer (must equal the prefill's)")
	fs.IntVar(&cfg.Shape.AuxSlots, "aux-slots", cfg.Shape.AuxSlots, "metadata buffer slots")
	fs.IntVar(&cfg.Shape.StateSlots, "state-slots", 0, "hybrid state slots (with -state)")
	fs.IntVar(&cfg.Shape.StateItem, "state-item", 256, "bytes of one state slot")
	fs.BoolVar(&cfg.State, "state", false, "send state indices (the prefill must send state too)")
	stagingMB := fs.Int64("staging-mb", 0, "announce a staging ring of this many MiB in the registration, as SGLang's decode with SGLANG_DISAGG_STAGING_BUFFER=1 (a prefill with staging off ignores it; 0: none)")
	fs.IntVar(&cfg.Rooms, "rooms", 2000, "rooms to run (room i is the workload's plan i)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "rooms in flight at once (keep ≤ the scheduler's)")
	fs.Float64Var(&cfg.Rate, "rate", 0, "rooms started per second (0: as fast as concurrency allows)")
	fs.DurationVar(&cfg.WaitingTimeout, "waiting-timeout",
		envSeconds(getenv, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", cfg.WaitingTimeout),
		"give up on a room this long after its transfer info, and ABORT it (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval",
		envSeconds(getenv, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", cfg.HeartbeatInterval),
		"GET /health period (SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL)")
	fs.IntVar(&cfg.HeartbeatMaxFailure, "heartbeat-max-failure",
		envInt(getenv, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", cfg.HeartbeatMaxFailure),
		"consecutive /health failures that fail every room (SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE)")
	fs.DurationVar(&cfg.ReleaseTimeout, "release-timeout",
		envSeconds(getenv, "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", cfg.ReleaseTimeout),
		"0.5.21+: free an aborted or failed room's pages after this long without every ABORT_ACK (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT)")
	fs.TextVar(&cfg.Release, "sglang", cfg.Release, "SGLang release to play: 0.5.18, 0.5.20, 0.5.21, 0.5.22 or 0.5.23")
	shard := fs.String("shard", "", "k/n: play only the rooms i with i % n == k (several decode processes sharing one workload)")
	roomsOut := fs.String("rooms-out", "", "write every room's decode-side outcome as JSON (room id -> outcome) to this file")
	fs.IntVar(&cfg.TopologyAttempts, "topology-attempts", 60, "GET /route topology tries while the prefill is not ready (0: forever)")
	fs.DurationVar(&cfg.TopologyRetry, "topology-retry", cfg.TopologyRetry, "pause between topology tries")
	jsonOut := fs.String("json", "", "write the summary as JSON to this file")
	quiet := fs.Bool("quiet", false, "no progress lines")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error")
	backend := fs.String("nixl-backend", "loopback", "NIXL backend of decode's memory: loopback (shared memory: the prefill must run on this host) or nixl (the real library, loaded at run time as kvxferd's -nixl-backend nixl: for a prefill on another host; UCX_TLS etc. from the environment)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.StagingBytes = *stagingMB << 20
	switch *backend {
	case "loopback":
	case "nixl":
		cfg.NewAgent = func(name string) (kvmem.Allocator, error) { return libnixl.New(name, libnixl.Options{}) }
	default:
		return fmt.Errorf("-nixl-backend %q: want loopback or nixl", *backend)
	}
	if *shard != "" {
		if _, err := fmt.Sscanf(*shard, "%d/%d", &cfg.Shard, &cfg.Shards); err != nil || cfg.Shards < 1 || cfg.Shard < 0 || cfg.Shard >= cfg.Shards {
			return fmt.Errorf("-shard %q: want k/n with 0 <= k < n", *shard)
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if !*quiet {
		cfg.Progress = out
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	e, err := decode.New(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	if err := e.Start(ctx); err != nil {
		return err
	}
	si, m := e.Info()
	fmt.Fprintf(out, "kvxfer-decode: SGLang %s, %d of %d rooms, %d in flight, prefill tp %d pp %d dp %d, %d target rank(s), waiting timeout %v\n",
		cfg.Release, len(cfg.Indices()), cfg.Rooms, cfg.Concurrency, si.AttnTPSize, si.PPSize, si.DPSize,
		len(m.TPRanks)*len(m.PPRanks)*len(m.CPRanks), cfg.WaitingTimeout)
	s := e.Run(ctx)
	s.Print(out)
	if *jsonOut != "" {
		if err := s.WriteJSON(*jsonOut); err != nil {
			return err
		}
	}
	if *roomsOut != "" {
		if err := s.WriteRoomOutcomes(*roomsOut); err != nil {
			return err
		}
	}
	if err := s.Err(); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %d rooms did not run to the end", s.Outcomes["error"])
	}
	fmt.Fprintln(out, "OK: no wrong bytes, no pages held")
	return nil
}
