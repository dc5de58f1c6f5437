// Command kvxferd is one SGLang prefill rank's KV-transfer process: the actor
// engine and NIXL transfer pool behind SGLang's decode-facing protocol
// (bootstrap HTTP, ZMQ frames, NIXL notifications) and a local control API for
// the prefill scheduler. See docs/kvxferd.md.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/daemon"
	"github.com/kvxfer/kvxfer/internal/gcfloor"
	"github.com/kvxfer/kvxfer/nixl/cuda"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/telemetry"
	"github.com/kvxfer/kvxfer/transport/bootstrap"
	"github.com/kvxfer/kvxfer/transport/wire"
)

func main() {
	if err := run(os.Args[1:], os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "kvxferd:", err)
		os.Exit(1)
	}
}

// baseProcs is GOMAXPROCS as the runtime chose it at start (from the CPUs and
// the cgroup's limit, or the GOMAXPROCS environment), before -spare-procs.
var baseProcs = runtime.GOMAXPROCS(0)

// procsWith is the GOMAXPROCS kvxferd runs with: base plus spare, or base
// alone where the operator set GOMAXPROCS.
func procsWith(base, spare int, envSet bool) int {
	if envSet {
		return base
	}
	return base + spare
}

func envInt(getenv func(string) string, name string, def int) int {
	if v, err := strconv.Atoi(getenv(name)); err == nil {
		return v
	}
	return def
}

func run(args []string, getenv func(string) string) error {
	return runWithOutput(args, getenv, os.Stderr)
}

// runWithOutput is run with the usage text (-h, flag errors) written to usage.
func runWithOutput(args []string, getenv func(string) string, usage io.Writer) error {
	fs := flag.NewFlagSet("kvxferd", flag.ContinueOnError)
	fs.SetOutput(usage)
	var c daemon.Config
	envIP := bootstrap.HostIPFromEnv(getenv)
	listen := envIP
	if listen == "" {
		listen = "127.0.0.1"
	}
	fs.StringVar(&c.ListenHost, "host", listen, "LISTEN host: where the bootstrap HTTP server and the ZMQ PULL socket for decode frames bind (SGLang's --host); 0.0.0.0 or :: for every interface (default SGLANG_HOST_IP, else HOST_IP, else 127.0.0.1)")
	fs.StringVar(&c.HostIP, "advertise-host", envIP, "ADVERTISED address: the rank_ip published to decodes in PUT /route, which they connect to (default SGLANG_HOST_IP, else HOST_IP; else the -host address when it is a specific one; else, for 0.0.0.0/::, detected as SGLang's get_local_ip_auto: SGLANG_LOCAL_IP_NIC's address, the source address of the route to 8.8.8.8, the host name's address). Never 0.0.0.0 or ::; loopback only with -single-host (or a loopback -host)")
	fs.BoolVar(&c.SingleHost, "single-host", false, "every decode runs on this host: allow a loopback advertised address while -host is not loopback (a loopback -host implies it)")
	fs.IntVar(&c.Rank.TPSize, "tp-size", 1, "prefill attention TP size")
	fs.IntVar(&c.Rank.TPRank, "tp-rank", 0, "this rank's TP rank (engine_rank)")
	fs.IntVar(&c.Rank.PPSize, "pp-size", 1, "pipeline parallel size")
	fs.IntVar(&c.Rank.PPRank, "pp-rank", 0, "pipeline parallel rank")
	fs.IntVar(&c.Rank.CPSize, "cp-size", 1, "context parallel size")
	fs.IntVar(&c.Rank.CPRank, "cp-rank", 0, "context parallel rank")
	fs.IntVar(&c.Rank.DPSize, "dp-size", 1, "data parallel size")
	fs.IntVar(&c.Rank.DPRank, "dp-rank", 0, "data parallel rank")
	fs.IntVar(&c.PageSize, "page-size", 1, "tokens per KV page (--page-size)")
	fs.StringVar(&c.KVCacheDtype, "kv-cache-dtype", "auto", "KV cache dtype decode must match (--kv-cache-dtype)")
	fs.StringVar(&c.LoadBalanceMethod, "load-balance-method", "", "SGLang's --load-balance-method, sent in PUT /route (empty: the key is omitted, which SGLang reads as follow_bootstrap_room)")
	fs.BoolVar(&c.MLA, "mla", false, "MLA model: one KV buffer per layer, replicated across TP")
	fs.BoolVar(&c.Staging.Enabled, "staging", false, "SGLang's staging path (SGLANG_DISAGG_STAGING_BUFFER=1): decodes that announced a staging ring and run another TP size get each chunk written into a region of their ring (STAGING_REQ/STAGING_RSP/WATERMARK; stg notification, or CHUNK_READY for 0.5.23); the scheduler must send one chunk per grid slot, as SGLang's does (docs/sglang-compat.md)")
	fs.IntVar(&c.Staging.ChunkedPrefillSize, "chunked-prefill-size", 8192, "the scheduler's chunked_prefill_size in tokens: the staging grid (with -staging)")
	fs.IntVar(&c.Topology.KVHeadNum, "kv-head-num", 0, "MHA: this rank's KV heads (kv_args.kv_head_num); with -total-kv-heads, needed to serve decodes of another TP size (head slicing)")
	fs.IntVar(&c.Topology.TotalKVHeads, "total-kv-heads", 0, "MHA: the model's KV heads (0: -kv-head-num × -tp-size)")
	fs.IntVar(&c.Topology.StartLayer, "prefill-start-layer", 0, "this PP stage's first model layer (prefill_start_layer)")
	fs.BoolVar(&c.Topology.AllCPRanks, "all-cp-ranks-transfer", envTrue(getenv("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER")), "every attention CP rank transfers (SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER); off, a CP rank other than 0 is SGLang's dummy CP rank: its rooms succeed without a decode")
	layerIDs := fs.String("kv-layer-ids", "", "model layer of each KV buffer, comma separated (SGLang's kv_layer_ids; empty for plain pools): pairs buffers by layer with decodes that send theirs")
	fs.IntVar(&c.PullPort, "zmq-port", 0, "ZMQ PULL port for decode frames (0: random)")
	fs.StringVar(&c.StateDir, "state-dir", "", "private directory (ours, 0700; created) where the decode registrations this rank accepted are kept and from which they are replayed when it next goes live: a restarted kvxferd serves decodes that registered with the one before (empty: off)")
	fs.BoolVar(&c.ServeBootstrap, "serve-bootstrap", true, "host the bootstrap HTTP server (the instance's rank 0 does)")
	fs.IntVar(&c.BootstrapPort, "disaggregation-bootstrap-port", 8998, "bootstrap HTTP port")
	fs.StringVar(&c.BootstrapURL, "bootstrap-url", "", "register into this bootstrap server (http://host:port) instead of the hosted one")
	if bc, err := bootstrap.BootstrapConfigFromEnv(getenv); err == nil {
		c.BootstrapCleanup = bc.EntryCleanupInterval
	} else {
		return err
	}
	fs.StringVar(&c.AuthToken, "bootstrap-auth-token", getenv(bootstrap.EnvBootstrapAuthToken), "bearer token for PUT/POST (SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN)")
	fs.StringVar(&c.ControlEndpoint, "control", "", "control API endpoint (default ipc://$XDG_RUNTIME_DIR/kvxfer-<uid>-rank<tp-rank>.sock, or the temp directory when XDG_RUNTIME_DIR is unset: control.DefaultEndpoint)")
	fs.StringVar(&c.DebugAddr, "debug-addr", "127.0.0.1:0", "HTTP address for /debug/rooms, /healthz and /metrics (empty: off)")
	fs.IntVar(&c.HTTP.MaxConns, "http-max-conns", 0, "connections each HTTP server (bootstrap, debug) holds before new ones go to a 16-connection reserve that closes its oldest when full (0: an eighth of the open-file limit, 16 to 1024; -1: no cap)")
	fs.DurationVar(&c.HTTP.ReadTimeout, "http-read-timeout", daemon.DefaultHTTPReadTimeout, "HTTP servers: time to read a whole request, body included")
	fs.DurationVar(&c.HTTP.WriteTimeout, "http-write-timeout", daemon.DefaultHTTPWriteTimeout, "HTTP servers: time to write a reply (bounds /debug/pprof/profile too)")
	fs.DurationVar(&c.HTTP.IdleTimeout, "http-idle-timeout", daemon.DefaultHTTPIdleTimeout, "HTTP servers: how long an idle keep-alive connection is kept")
	proto := fs.String("decode-protocol", "auto", "SGLang release of the decodes: auto (detected per decode agent from its frames) or one of 0.5.18, 0.5.20, 0.5.21, 0.5.22, 0.5.23 for every decode")
	legacy := fs.String("decode-protocol-legacy", "0.5.20", "what auto takes a 23-frame registration for (0.5.18 to 0.5.22 look alike): 0.5.18, 0.5.20, 0.5.21 or 0.5.22")
	hold := fs.Bool("hold-completion", true, "send the last chunk's completion notifications only once all its writes completed and the room is still live (false: with the writes, as SGLang does)")
	nokv := fs.String("aux-nokv", "count", "aux_nokv notification form: baseline ({room}_aux_nokv_{sender}) or count (…_{n})")
	fs.IntVar(&c.QueueSize, "queue-size", envInt(getenv, "SGLANG_DISAGGREGATION_QUEUE_SIZE", 4), "transfer pool actors (SGLANG_DISAGGREGATION_QUEUE_SIZE)")
	fs.IntVar(&c.StateComponents, "state-components", 0, "state lists the scheduler registers before the rank goes live")
	logJSON := fs.Bool("log-json", false, "JSON logs")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	backend := fs.String("nixl-backend", "", "required: nixl for production (the real library, loaded at run time; its plugin and params come from SGLANG_DISAGGREGATION_NIXL_BACKEND and _PARAMS), or loopback for tests and demos on one host (shared memory, pure Go)")
	metrics := fs.Bool("metrics", true, "serve Prometheus /metrics on -debug-addr (tracing: the OTEL_* environment, see docs/observability.md)")
	parentPID := fs.Int("parent-pid", 0, "exit (as on SIGTERM) once this process is no longer our parent: the SGLang scheduler that started us died (0: off)")
	bytesPerPage := fs.Int64("kv-bytes-per-page", 0, "KV bytes of one page over all layers of this rank, for kv_transfer.bytes and kvxfer_transfer_bytes_total (0: taken from the registered memory)")
	memfds := fs.String("memfd", "", "memory files (sealed memfds) the parent passed at exec, by descriptor number (comma separated): the scheduler's host KV, state and aux pools; register_memory names them as {memfd: N}")
	spare := fs.Int("spare-procs", 1, "Go processors added to the machine's GOMAXPROCS, unless the GOMAXPROCS environment sets it: the shared-memory ring's consumer spins on one while a scheduler submits fast, and while every processor is busy Go polls the network (decode frames: transfer infos, ABORTs) only from its 10 ms monitor (docs/benchmarks.md, the fourth engine)")
	gcFloor := fs.Int("gc-floor-mib", 64, "the heap goal never falls below this many MiB while the live heap is small (GOGC's goal applies above it; 0: GOGC alone; GOGC=off wins): kvxferd's live heap is a few MiB while it allocates hundreds of MiB a second, and GOGC=100 alone collects every few milliseconds (docs/kvxferd.md)")
	var prof profiles
	fs.StringVar(&prof.cpu, "cpuprofile", "", "write a CPU profile of the whole run to this file (at shutdown)")
	fs.StringVar(&prof.block, "blockprofile", "", "write a block profile (one sample per 10 µs blocked) to this file at shutdown")
	fs.StringVar(&prof.mutex, "mutexprofile", "", "write a mutex contention profile (1 in 10 events) to this file at shutdown")
	fs.StringVar(&prof.heap, "heapprofile", "", "write a heap profile to this file at shutdown")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *spare < 0 || *spare > 64 {
		return fmt.Errorf("-spare-procs %d: want 0 to 64", *spare)
	}
	// Set only when it changes: setting GOMAXPROCS at all stops the runtime
	// from following later changes of the cgroup's CPU limit.
	if n := procsWith(baseProcs, *spare, getenv("GOMAXPROCS") != ""); n != runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(n)
	}
	if *gcFloor < 0 || *gcFloor > 1<<20 {
		return fmt.Errorf("-gc-floor-mib %d: want 0 to 1048576", *gcFloor)
	}
	defer gcfloor.Start(uint64(*gcFloor) << 20).Stop()
	if ids, err := daemon.ParseLayerIDs(*layerIDs); err != nil {
		return fmt.Errorf("-kv-layer-ids: %w", err)
	} else {
		c.Topology.KVLayerIDs = ids
	}
	var err error
	if c.Dialect, err = wire.ParseDialect(*proto); err != nil {
		return fmt.Errorf("-decode-protocol: %w", err)
	}
	if c.LegacyDialect, err = wire.ParseDialect(*legacy); err != nil || c.LegacyDialect == wire.DialectUnknown || c.LegacyDialect == wire.Dialect0523 {
		return fmt.Errorf("-decode-protocol-legacy %q: want 0.5.18, 0.5.20, 0.5.21 or 0.5.22", *legacy)
	}
	c.NoHold = !*hold
	switch *nokv {
	case "baseline":
		c.NoKV = sglang.NoKVBaseline
	case "count":
		c.NoKV = sglang.NoKVWithCount
	default:
		return fmt.Errorf("-aux-nokv %q: want baseline or count", *nokv)
	}
	switch *backend {
	case "":
		return fmt.Errorf("-nixl-backend is required: nixl (production) or loopback (tests and demos on one host); see docs/nixl.md")
	case "loopback":
		// VRAM mode: CUDA IPC buffers are copied with the driver, loaded on the
		// first GPU registration (docs/vram.md); host memory is unchanged.
		c.NewAgent = func(name string) (daemon.Agent, error) {
			a, err := loopback.NewVRAM(name, loopback.Options{}, cuda.Lazy(""))
			if err != nil {
				return nil, err
			}
			return daemon.WithCUDAIPC(a, a.Driver()), nil
		}
	case "nixl":
		c.NewAgent = func(name string) (daemon.Agent, error) {
			a, err := libnixl.New(name, libnixl.Options{})
			if err != nil {
				return nil, err
			}
			return daemon.WithCUDAIPC(daemon.WithFileMapping(a), cuda.Lazy("")), nil
		}
	default:
		return fmt.Errorf("-nixl-backend %q: want loopback or nixl", *backend)
	}
	// Before anything binds: an advertised address decodes cannot use is refused.
	addrs, err := daemon.ResolveAddrs(c.ListenHost, c.HostIP, c.SingleHost, daemon.SystemDetector(getenv))
	if err != nil {
		return err
	}
	c.ListenHost, c.HostIP, c.SingleHost = addrs.Listen, addrs.Advertise, addrs.SingleHost
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return err
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if *logJSON {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	c.Logger = slog.New(h).With("rank", c.Rank.TPRank, "pp", c.Rank.PPRank)
	if *backend == "loopback" {
		c.Logger.Warn("NIXL backend loopback: shared memory on this host only, for tests and demos; production runs -nixl-backend nixl")
	}
	ec, err := actors.ConfigFromEnv(actors.Config{}, getenv)
	if err != nil {
		return err
	}
	tel, err := telemetry.Setup(context.Background(), telemetry.Options{BytesPerPage: *bytesPerPage, Attributes: []attribute.KeyValue{
		attribute.Int("kvxfer.tp_rank", c.Rank.TPRank), attribute.Int("kvxfer.pp_rank", c.Rank.PPRank), attribute.Int("kvxfer.dp_rank", c.Rank.DPRank)}})
	if err != nil {
		return err
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { c.Logger.Warn("telemetry", "err", err) }))
	if tel.TracerProvider != nil {
		otel.SetTracerProvider(tel.TracerProvider)
	}
	ec.Observer = tel.Observer
	c.Engine = ec
	if *bytesPerPage == 0 {
		c.OnLive = func(local sglang.Local) { tel.Observer.SetBytesPerPage(daemon.BytesPerPage(local)) }
	}
	if *metrics {
		c.Metrics = tel.Metrics
	}

	defer func() {
		// After the daemon: rooms failed by the shutdown are exported too.
		tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(tctx); err != nil {
			c.Logger.Warn("telemetry shutdown", "err", err)
		}
	}()

	if err := prof.start(); err != nil {
		return err
	}
	defer prof.stop(c.Logger.Warn)

	if addrs.Warning != "" {
		c.Logger.Warn(addrs.Warning)
	}
	c.Logger.Info("addresses", "listen", addrs.Listen, "advertise", addrs.Advertise, "advertise_from", addrs.Source, "single_host", addrs.SingleHost)
	if c.Memfds, err = daemon.OpenMemfds(*memfds); err != nil {
		return err
	}
	defer c.Memfds.Close()
	d, err := daemon.Start(c)
	if err != nil {
		return err
	}
	tel.Observer.Attach(d)
	c.Logger.Info("kvxferd started; waiting for the scheduler to register memory",
		"control", d.ControlEndpoint(), "bootstrap", d.BootstrapAddr(), "debug", d.DebugAddr(), "telemetry", tel.Tracing)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if *parentPID > 0 {
		ctx = watchParent(ctx, *parentPID, 200*time.Millisecond, os.Getppid, c.Logger)
	}
	<-ctx.Done()
	c.Logger.Info("shutting down: stopping ingest, failing live rooms (reason shutdown), draining writes")
	sctx, cancel := context.WithTimeout(context.Background(), ec.Room.Drain+5*time.Second)
	defer cancel()
	err = d.Shutdown(sctx)
	if *parentPID > 0 && parentGone(*parentPID, os.Getppid, procState) {
		// The scheduler that started us is gone (SGLang never shuts its
		// managers down): nobody else is left to remove what this rank owns.
		removeOwned(d.ControlEndpoint(), c.StateDir, c.Logger)
	}
	return err
}

// removeOwned removes the control socket file (ipc:// endpoints) and the
// state directory of a rank whose scheduler has died.
func removeOwned(endpoint, stateDir string, log *slog.Logger) {
	if p, ok := strings.CutPrefix(endpoint, "ipc://"); ok && p != "" && !strings.HasPrefix(p, "@") {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("removing the control socket", "path", p, "err", err)
		}
	}
	if stateDir != "" {
		if err := os.RemoveAll(stateDir); err != nil {
			log.Warn("removing the state directory", "path", stateDir, "err", err)
		}
	}
}

// parentGone reports whether the scheduler that started us has died. The
// parent-death signal comes when the thread that forked us exits; while the
// scheduler's other threads are still exiting, getppid still names it, but its
// leader thread is already a zombie (or /proc has no entry for it).
func parentGone(parent int, getppid func() int, state func(pid int) (byte, error)) bool {
	if getppid() != parent {
		return true
	}
	st, err := state(parent)
	return err != nil || st == 'Z' || st == 'X'
}

// procState is the state letter of /proc/<pid>/stat.
func procState(pid int) (byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("/proc/%d/stat: no state field", pid)
	}
	return b[i+2], nil
}

// watchParent returns a context that is also done once getppid no longer
// answers parent: the process that started kvxferd (an SGLang scheduler
// through the kvxfer plug-in) has died and we were re-parented. PR_SET_PDEATHSIG
// in the starter covers most exits; this covers the rest (the starting thread
// outliving nothing, a starter that could not set it).
func watchParent(ctx context.Context, parent int, every time.Duration, getppid func() int, log *slog.Logger) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if getppid() != parent {
				log.Warn("parent process gone: shutting down", "parent_pid", parent)
				cancel()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return ctx
}

// envTrue reads a boolean environment value as SGLang's get_bool_env_var does.
func envTrue(v string) bool { return v == "1" || v == "true" || v == "True" || v == "TRUE" }
