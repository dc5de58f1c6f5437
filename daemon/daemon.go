package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/peer"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/bootstrap"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// Rank is this prefill rank's place in the parallel layout.
type Rank struct {
	TPSize, TPRank int
	PPSize, PPRank int
	CPSize, CPRank int
	DPSize, DPRank int
}

// Sender is the notification sender id, SGLang's transfer_source_rank:
// pp_rank·tp_size + tp_rank over the whole TP group, whose ranks are
// (cp_rank, attn_tp_rank) with attn_tp fastest — so CP ranks that all
// transfer stay distinct senders (unique across PP stages too, which
// upstream's plain tp_rank once was not).
func (r Rank) Sender() int {
	cp := max(r.CPSize, 1)
	return sglang.SenderID(r.PPRank, r.TPSize*cp, r.CPRank*r.TPSize+r.TPRank)
}

// Unique is SGLang's _prefill_unique_rank(), the prefill_rank of KV_STATUS and
// ABORT_ACK: attn_tp_rank·(pp_size·cp_size) + pp_rank·cp_size + cp_rank. Decode
// counts distinct values of it, so it must differ across every rank it pulls from.
func (r Rank) Unique() int {
	return r.TPRank*(r.PPSize*r.CPSize) + r.PPRank*r.CPSize + r.CPRank
}

// Config configures a Daemon.
type Config struct {
	Rank Rank
	// HostIP is the advertised address: the rank_ip published in PUT /route,
	// which decodes connect to ("" : resolved as ResolveAddrs does).
	HostIP string
	// ListenHost is where the hosted bootstrap server and the ZMQ PULL socket
	// bind ("": HostIP); 0.0.0.0 and :: listen on every interface. SingleHost
	// says every decode runs on this host, which allows a loopback HostIP with
	// a non-loopback ListenHost (a loopback ListenHost implies it). See addr.go.
	ListenHost   string
	SingleHost   bool
	PullPort     int // 0: random
	PageSize     int
	KVCacheDtype string
	// LoadBalanceMethod is sent as load_balance_method in PUT /route; "" omits it.
	LoadBalanceMethod string

	// ServeBootstrap hosts a bootstrap HTTP server on BootstrapPort (the
	// prefill instance's rank 0 does this in SGLang).
	ServeBootstrap bool
	BootstrapPort  int
	// BootstrapURL is where PUT /route goes; empty means the hosted server.
	BootstrapURL string
	AuthToken    string
	// BootstrapCleanup is SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL
	// for the hosted server (0: 120 s).
	BootstrapCleanup time.Duration

	ControlEndpoint string // default control.DefaultEndpoint(tp rank)
	DebugAddr       string // /debug/rooms, /healthz and /metrics; empty: off
	// Metrics, when set, is served at /metrics on DebugAddr (the Prometheus
	// exporter's handler).
	Metrics http.Handler
	// HTTP bounds both HTTP servers (bootstrap and debug); zero values take
	// the defaults (see HTTPLimits).
	HTTP HTTPLimits
	// BootstrapMaxRanks and BootstrapMaxDPEntries cap the hosted bootstrap
	// server's rank and room -> dp_rank tables (0: transport's defaults).
	BootstrapMaxRanks, BootstrapMaxDPEntries int

	// Dialect pins every decode to one SGLang release's wire behaviour;
	// DialectUnknown (the default, "auto") detects it per decode agent from
	// what it sends. LegacyDialect is what a 23-frame registration is taken
	// for, since 0.5.18 to 0.5.22 look alike on the wire (default 0.5.20:
	// notifications, KV_STATUS failures and 3-frame ACKs).
	Dialect       wire.Dialect
	LegacyDialect wire.Dialect
	// NoHold posts the last chunk's notifications with its writes, as SGLang
	// does, instead of holding them until the room is known to have succeeded
	// (for measuring what holding costs; see invariant 10).
	NoHold bool
	// MaxLinks caps the live PUSH links to decode endpoints, and so the
	// accepted decode agents (each keeps its link); 0: KVXFER_MAX_DECODE_LINKS,
	// else an eighth of the fd limit, at most 512.
	MaxLinks int

	NoKV            sglang.NoKVForm
	QueueSize       int // transfer pool actors
	StateComponents int // state lists the scheduler will register before going live
	MLA             bool
	// Staging: SGLang's staging path (-staging; staging.go). Off by default.
	Staging StagingConfig
	// Topology: KV heads, PP stage layers and layer ids (topology.go).
	Topology Topology

	Engine actors.Config // deadlines, tombstones, clock (Transfers is set here)
	Logger *slog.Logger

	// NewAgent creates the NIXL agent when memory is registered (loopback by default).
	NewAgent func(name string) (Agent, error)
	// StateDir, when set, keeps the decode registrations this rank accepted in
	// StateDir/registrations and replays them when the rank next goes live (a
	// restarted kvxferd of the same rank; see state.go). The directory must
	// be ours and private (created 0700).
	StateDir string
	// Memfds are the memory files the scheduler passed at exec (-memfd):
	// register_memory regions name them by descriptor number.
	Memfds Memfds

	// OnLive, when set, is called once the rank is live with the geometry the
	// scheduler registered (telemetry takes its bytes per page from it).
	OnLive func(local sglang.Local)

	// Liveness configures how decodes are watched (probes, decode's heartbeat
	// budget, fences; liveness.go). Zero values take the environment's.
	Liveness LivenessConfig
}

// BytesPerPage is the KV bytes of one page over every layer buffer of local.
func BytesPerPage(local sglang.Local) int64 {
	var n int64
	for _, l := range local.KV.ItemLens {
		n += int64(l)
	}
	return n
}

// Agent is a NIXL agent that can also map the scheduler's shared memory.
type Agent interface {
	nixl.Agent
	Attach(path string) ([]byte, error)
	// AttachFile maps an open memory file the scheduler passed (Config.Memfds).
	AttachFile(f *os.File) ([]byte, error)
}

// Daemon is a running kvxferd.
type Daemon struct {
	cfg Config
	log *slog.Logger

	eng      *actors.Engine
	xfers    lazyTransfers
	control  *control.Server
	boot     *bootstrap.BootstrapServer
	bootLn   net.Listener
	bootSrv  *http.Server
	stopBoot context.CancelFunc
	debug    *http.Server
	debugLn  net.Listener

	// mu guards the fields of memory registration and activation: an I/O
	// boundary (control API requests, NIXL memory registration, the ZMQ bind,
	// PUT /route, Shutdown). It is never held across those calls (activate.go),
	// only while a field is read or set. An owner does not fit: the fields
	// change a few times in a process's life, between blocking NIXL and
	// network calls that must not run on an actor, and their readers (the
	// control API, a peer's load, Shutdown) need the value at once; an owner
	// would add a round trip to each read for nothing.
	mu       sync.Mutex
	agent    Agent
	mem      memory
	pool     *xfer.Pool
	ingest   *zmqio.Ingest
	live     atomic.Bool
	links    *links
	dialects *dialects
	peers    *peers
	state    *regStore    // nil: no -state-dir
	replay   [][][]byte   // registrations to replay when live (then nil)
	replayTo []lostTarget // their endpoints, set once in Start (lost.go)
	liveness *liveness    // how registered decodes are probed (liveness.go)
	memBusy  bool         // a register_memory or Activate is at work (guarded by mu; activate.go)
	closing  bool         // Shutdown began (guarded by mu)
	halt     context.Context
	haltFn   context.CancelFunc // Shutdown cancels halt: an activation's PUT /route stops
	// putRoute replaces PUT /route (tests).
	putRoute func(context.Context, string, bootstrap.RankRegistration, bootstrap.RegisterOptions) error
	counters counters
	// Per-message warnings, one line a second each, so that a flood of bad
	// frames cannot flood the log.
	noticeLogs, signalLogs, lostLogs, dropLogs *logLimiter
}

// Start brings the daemon up (not yet live; see the package comment).
func Start(cfg Config) (*Daemon, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Rank.TPSize <= 0 {
		cfg.Rank.TPSize = 1
	}
	if cfg.Rank.PPSize <= 0 {
		cfg.Rank.PPSize = 1
	}
	if cfg.Rank.CPSize <= 0 {
		cfg.Rank.CPSize = 1
	}
	if cfg.Rank.DPSize <= 0 {
		cfg.Rank.DPSize = 1
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 1
	}
	if cfg.ListenHost == "" {
		cfg.ListenHost = cfg.HostIP
	}
	addrs, err := ResolveAddrs(cfg.ListenHost, cfg.HostIP, cfg.SingleHost, SystemDetector(os.Getenv))
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	cfg.ListenHost, cfg.HostIP, cfg.SingleHost = addrs.Listen, addrs.Advertise, addrs.SingleHost
	cfg.BootstrapURL = ReachableURL(cfg.BootstrapURL)
	d := &Daemon{cfg: cfg, log: cfg.Logger}
	d.halt, d.haltFn = context.WithCancel(context.Background())
	d.dialects = newDialects(cfg.Dialect, cfg.LegacyDialect)
	for _, l := range []**logLimiter{&d.noticeLogs, &d.signalLogs, &d.lostLogs, &d.dropLogs} {
		*l = newLogLimiter(time.Second, &d.counters.logsSuppressed)
	}
	if cfg.MaxLinks <= 0 {
		cfg.MaxLinks, _ = strconv.Atoi(os.Getenv("KVXFER_MAX_DECODE_LINKS"))
		d.cfg.MaxLinks = cfg.MaxLinks
	}
	links, err := newLinks(cfg.Logger, cfg.MaxLinks, d.linkAllowed, d.linkLost) // linkLost only sends a message
	if err != nil {
		return nil, fmt.Errorf("daemon: ZMQ context for decode links: %w", err)
	}
	d.links, d.counters.links = links, links
	// The peer actors probe their decodes on the liveness clock (the
	// engine's unless the configuration names one).
	d.liveness = newLiveness(cfg.Liveness, cfg.Engine.Clock)
	d.peers = newPeers(d, links.max, d.liveness)
	if cfg.StateDir != "" {
		d.state, d.replay = openRegStore(cfg.StateDir, d.stateScope(), links.max, cfg.Logger)
		d.replayTo = d.replayTargets(d.replay)
	}
	// A transfer that failed peer_lost ends its agent's incarnation, unless
	// the agent was loaded again since it was posted (its actor decides).
	d.xfers.peerLost = func(agent string, epoch uint64) { d.peers.actors.Send(agent, peer.XferFailed{Inc: epoch}) }
	d.xfers.epoch = d.peers.epoch.Load
	d.xfers.gate = d.gateTransfer
	if cfg.Staging.Enabled {
		d.xfers.stage = d.peers.stage
		d.xfers.withdraw = d.peers.withdraw
	}
	ec := cfg.Engine
	if ec.Room == (room.Config{HoldCompletion: ec.Room.HoldCompletion}) {
		ec.Room = room.DefaultConfig()
	}
	ec.Room.HoldCompletion = !cfg.NoHold
	ec.Transfers = &d.xfers
	ec.Notifier = d
	if ec.Logger == nil {
		ec.Logger = cfg.Logger
	}
	eng, err := actors.New(ec)
	if err != nil {
		_ = d.peers.close(context.Background())
		links.closeAll(time.Now())
		return nil, err
	}
	d.eng = eng
	d.xfers.gated = &d.peers.gated // 0: no write needs its peer's actor
	if err := d.startBootstrap(); err != nil {
		d.Shutdown(context.Background())
		return nil, err
	}
	ep := cfg.ControlEndpoint
	if ep == "" {
		ep = control.DefaultEndpoint(cfg.Rank.TPRank)
	}
	d.control, err = control.Start(control.Config{
		Endpoint: ep, Engine: d.controlEngine(eng), Memory: d.registerMemory, Lost: d.failLost, Logger: cfg.Logger,
		Identity: control.Identity{Rank: cfg.Rank.TPRank, PPRank: cfg.Rank.PPRank, DPRank: cfg.Rank.DPRank, Name: "kvxferd"},
	})
	if err != nil {
		d.Shutdown(context.Background())
		return nil, fmt.Errorf("daemon: control API: %w", err)
	}
	if cfg.DebugAddr != "" {
		if err := d.startDebug(); err != nil {
			d.Shutdown(context.Background())
			return nil, err
		}
	}
	return d, nil
}

// stateScope names the rank and deployment a state file belongs to: a file
// written for another is not replayed.
func (d *Daemon) stateScope() string {
	r := d.cfg.Rank
	boot := d.cfg.BootstrapURL
	if boot == "" {
		boot = "hosted:" + strconv.Itoa(d.cfg.BootstrapPort)
	}
	return fmt.Sprintf("tp=%d/%d pp=%d/%d cp=%d/%d dp=%d/%d host=%s bootstrap=%s", r.TPRank, r.TPSize, r.PPRank, r.PPSize,
		r.CPRank, r.CPSize, r.DPRank, r.DPSize, d.cfg.HostIP, boot)
}

// Engine is the daemon's engine (for tests and embedding).
func (d *Daemon) Engine() *actors.Engine { return d.eng }

// ControlEndpoint is where the control API listens.
func (d *Daemon) ControlEndpoint() string { return d.control.Endpoint() }

// BootstrapAddr is the hosted bootstrap server's address ("" if not hosted).
func (d *Daemon) BootstrapAddr() string {
	if d.bootLn == nil {
		return ""
	}
	return d.bootLn.Addr().String()
}

// DebugAddr is the /debug/rooms server's address ("" if off).
func (d *Daemon) DebugAddr() string {
	if d.debugLn == nil {
		return ""
	}
	return d.debugLn.Addr().String()
}

// PullPort is the bound ZMQ port once live (0 before).
func (d *Daemon) PullPort() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ingest == nil {
		return 0
	}
	return d.ingest.Port()
}

// Live reports whether the rank is registered and accepting decode frames.
func (d *Daemon) Live() bool { return d.live.Load() }

func (d *Daemon) startBootstrap() error {
	if !d.cfg.ServeBootstrap {
		return nil
	}
	r := d.cfg.Rank
	// The rank this process serves: its PUT /route alone may set its route,
	// and its instance-wide values are fixed before any PUT,
	// so that no other process can hijack or pre-empt the rank's route.
	own := bootstrap.RankRegistration{
		AttnTPSize: r.TPSize, AttnTPRank: r.TPRank, AttnCPSize: r.CPSize, AttnCPRank: r.CPRank,
		AttnDPSize: r.DPSize, AttnDPRank: r.DPRank, PPSize: r.PPSize, PPRank: r.PPRank,
		SystemDPSize: r.DPSize, SystemDPRank: r.DPRank, PageSize: d.cfg.PageSize, KVCacheDtype: d.cfg.KVCacheDtype,
		LoadBalanceMethod: d.cfg.LoadBalanceMethod,
	}
	bc := bootstrap.BootstrapConfig{Logger: d.log, EntryCleanupInterval: d.cfg.BootstrapCleanup, Owner: &own,
		MaxRanks: d.cfg.BootstrapMaxRanks, MaxDPEntries: d.cfg.BootstrapMaxDPEntries}
	if d.cfg.AuthToken != "" {
		bc.RequireAuth, bc.AuthToken = true, d.cfg.AuthToken
	}
	d.boot = bootstrap.NewBootstrapServer(bc)
	ln, err := net.Listen("tcp", net.JoinHostPort(d.cfg.ListenHost, strconv.Itoa(d.cfg.BootstrapPort)))
	if err != nil {
		return fmt.Errorf("daemon: bootstrap server: %w", err)
	}
	d.bootLn = ln
	d.bootSrv = d.cfg.HTTP.server(d.boot.Handler())
	go d.bootSrv.Serve(d.cfg.HTTP.listener(ln))
	ctx, cancel := context.WithCancel(context.Background())
	d.stopBoot = cancel
	go d.boot.RunCleanup(ctx) // drops room -> dp_rank entries past their interval
	return nil
}

// registerOptions are the options of this rank's PUT /route to url: the
// owner key when url is the hosted bootstrap server.
func (d *Daemon) registerOptions(url string) bootstrap.RegisterOptions {
	opt := bootstrap.RegisterOptions{Token: d.cfg.AuthToken}
	if d.boot != nil && d.bootLn != nil && url == d.hostedBootstrapURL() {
		opt.OwnerKey = d.boot.OwnerKey()
	}
	return opt
}

func (d *Daemon) startDebug() error {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/rooms", func(w http.ResponseWriter, r *http.Request) {
		limit := 100
		if v, err := strconv.Atoi(r.URL.Query().Get("limit")); err == nil && v > 0 {
			limit = min(v, 10000)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"stats": d.eng.Stats(), "counters": d.counters.snapshot(), "rooms": d.eng.Rooms(limit)})
	})
	mux.HandleFunc("/debug/peers", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"default_23_frame_dialect": d.dialects.legacy.String(),
			"pinned": d.cfg.Dialect != wire.DialectUnknown, "peers": d.dialects.list(), "liveness": d.livenessOf(r.Context())})
	})
	mux.HandleFunc("/debug/shm", d.serveShm)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if !d.Live() {
			http.Error(w, "not live: waiting for memory registration", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if d.cfg.Metrics != nil {
		mux.Handle("/metrics", d.cfg.Metrics)
	}
	ln, err := net.Listen("tcp", d.cfg.DebugAddr)
	if err != nil {
		return fmt.Errorf("daemon: debug server: %w", err)
	}
	d.debugLn = ln
	if isLoopback(ln.Addr()) {
		// Profiles only where nothing off the host can ask for them.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	d.debug = d.cfg.HTTP.server(mux)
	go d.debug.Serve(d.cfg.HTTP.listener(ln))
	return nil
}

// Shutdown stops ingest (no new decode input), the bootstrap server and the
// control API, fails every live room with reason shutdown and waits for
// in-flight writes (bounded by ctx) so decode is told after the drain, then
// stops the pool, the agent, the links and the debug server.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.state.close() // what the next incarnation replays stays as it is
	d.haltFn()
	d.mu.Lock()
	d.closing = true
	in := d.ingest
	d.mu.Unlock()
	if in != nil {
		in.Stop()
	}
	d.liveness.close()
	var errs []error
	// Every peer ends; registrations still loading finish (or fail) before
	// the agent closes.
	if err := d.peers.close(ctx); err != nil {
		errs = append(errs, err)
	}
	// The bootstrap server goes first after ingest, so decode heartbeats fail
	// and decodes stop sending; then the control API, so no scheduler call is
	// left waiting on an engine that is closing.
	if d.bootSrv != nil {
		d.stopBoot()
		errs = append(errs, d.bootSrv.Shutdown(ctx))
	}
	if d.control != nil {
		d.control.Stop()
	}
	if d.eng != nil {
		errs = append(errs, d.eng.Close(ctx))
	}
	d.mu.Lock()
	pool, agent := d.pool, d.agent
	d.mu.Unlock()
	if pool != nil { // no lock held while the pool stops and NIXL closes
		pool.Close()
	}
	if agent != nil {
		errs = append(errs, agent.Close())
	}
	// The links flush in parallel, all by one deadline: the context's, at
	// most shutdownFlush from now, so that a dead decode owed notices cannot
	// hold shutdown.
	by := time.Now().Add(shutdownFlush)
	if dl, ok := ctx.Deadline(); ok && dl.Before(by) {
		by = dl
	}
	d.links.closeAll(by)
	if d.debug != nil {
		errs = append(errs, d.debug.Shutdown(ctx))
	}
	d.dialects.close()
	return errors.Join(errs...)
}

// Notify implements actors.Notifier: each notice goes out in the form the
// decode's SGLang release reads, or not at all where it reads nothing.
//
//   - Completion: the held NIXL notifications (releases that complete on
//     them), or KV_STATUS "4" (0.5.23).
//   - FailureStatus: KV_STATUS "0" with the reason (0.5.20+; 0.5.18 never reads
//     its PULL socket, so statuses would only queue there).
//   - AbortAck: 4 frames echoing the ABORT's generation when it had one;
//     otherwise 3 frames, only for 0.5.20/0.5.21 (0.5.22+ ignore them, and an
//     ABORT without a generation means that decode waits for no ACK).
func (d *Daemon) Notify(roomID uint64, n room.Notice) {
	dl := d.dialects.at(n.To)
	var frames [][]byte
	switch n.Kind {
	case room.Completion:
		if len(n.Signal) > 0 && dl.Notifs() {
			d.signal(roomID, n)
		}
		if !dl.CompletesOnStatus() || n.To.Port <= 0 {
			return
		}
		frames = (&wire.KVStatus{Room: roomID, Status: kv.StatusSuccess, PrefillRank: d.cfg.Rank.Unique()}).Encode()
	case room.FailureStatus:
		if !dl.ReadsStatus() || n.To.Port <= 0 {
			return
		}
		reason := n.Reason.String()
		if n.Reason == kv.ReasonPeerRejected {
			if why := d.dialects.rejectionAt(n.To); why != "" {
				reason += ": " + why
			}
		}
		if n.DrainExpired {
			reason += " (writes still in flight after the drain deadline)"
		}
		frames = (&wire.KVStatus{Room: roomID, Status: kv.StatusFailed, PrefillRank: d.cfg.Rank.Unique(), Reason: reason}).Encode()
	case room.AbortAck:
		if n.To.Port <= 0 || !n.HasGen && !dl.AcksWithoutGen() {
			return
		}
		frames = (&wire.AbortAck{Room: roomID, PrefillRank: d.cfg.Rank.Unique(), Generation: n.Gen, HasGen: n.HasGen}).Encode()
	default:
		return
	}
	if err := d.links.send(n.To, frames); err != nil {
		d.counters.noticeDropped.Add(1)
		if ok, suppressed := d.noticeLogs.allow(); ok {
			d.log.Warn("notice to decode dropped", "room", roomID, "to", n.To.String(), "err", err, "suppressed", suppressed)
		}
	}
}

// signal sends a room's held completion notifications to its decode agent
// (through the pool: signalFailed hears if they could not go).
func (d *Daemon) signal(roomID uint64, n room.Notice) {
	if p := d.xfers.pool.Load(); p != nil {
		p.Signal(roomID, n.Agent, n.Signal)
	}
}

// signalFailed is the pool's word that a room's completion notifications
// were not sent.
func (d *Daemon) signalFailed(roomID uint64, agent string, err error) {
	d.counters.noticeDropped.Add(1)
	if ok, suppressed := d.signalLogs.allow(); ok {
		d.log.Warn("completion notification to decode dropped", "room", roomID, "agent", agent, "err", err,
			"suppressed", suppressed)
	}
}

// lazyTransfers forwards to the pool once memory is registered; before that a
// transfer cannot be planned (no local memory), so it fails its room.
// A transfer that fails peer_lost (the NIXL connection to its decode agent is
// lost) also drops that agent (peerLost).
// gate, when set, may hand a transfer to its decode's actor, which holds it
// while the decode does not answer or until a probe confirms it (liveness.go):
// it returns true and later calls post, or fail, exactly once.
type lazyTransfers struct {
	pool     atomic.Pointer[xfer.Pool]
	peerLost func(agent string, epoch uint64)
	epoch    func() uint64 // the peer table's epoch: a loss is of the agent loaded by then
	gate     func(t kv.Transfer, epoch uint64, post, fail func()) bool
	gated    *atomic.Int64 // peers whose writes go through their actor now; 0: gate is not asked
	// stage, when set (-staging), hands the chunks of staging decodes to
	// their actor, which holds each until its staging region is writable
	// and posts it, with the region, through post (staging.go); false: not
	// staged.
	stage func(t kv.Transfer, done kv.DoneFunc, post func(kv.Transfer, kv.DoneFunc)) bool
	// withdraw drops the chunks staged for a room that failed, at the
	// actors of its agents.
	withdraw func(roomID uint64, agents []string)
}

// Withdraw implements actors.Withdrawer: a failed room's staged chunks still
// waiting for their region (staging.go) and its transfers waiting for the
// pool's in-flight window (xfer.Pool.Withdraw) are not written.
func (l *lazyTransfers) Withdraw(roomID uint64, agents []string) {
	if l.withdraw != nil {
		l.withdraw(roomID, agents)
	}
	if p := l.pool.Load(); p != nil {
		p.Withdraw(roomID, agents)
	}
}

func (l *lazyTransfers) Post(t kv.Transfer, done kv.DoneFunc) {
	// A staged chunk's actor gates it itself (held while suspect), so it is
	// posted to the pool without the gate.
	if l.stage != nil && l.stage(t, done, l.poolPost) {
		return
	}
	l.post(t, done)
}

// watch makes a transfer's peer_lost end its agent's incarnation (the one
// loaded at epoch, taken now).
func (l *lazyTransfers) watch(t kv.Transfer, done kv.DoneFunc) (kv.DoneFunc, uint64) {
	if l.peerLost == nil {
		return done, 0
	}
	// The closure takes the agent alone: capturing t would move the whole
	// transfer to the heap on every post.
	inner, agent := done, t.Agent
	epoch := l.epoch()
	return func(fail kv.Reason, signal [][]byte) {
		if fail == kv.ReasonPeerLost {
			l.peerLost(agent, epoch)
		}
		inner(fail, signal)
	}, epoch
}

// poolPost posts to the pool, ungated.
func (l *lazyTransfers) poolPost(t kv.Transfer, done kv.DoneFunc) {
	p := l.pool.Load()
	if p == nil {
		done(kv.ReasonInvalidRequest, nil)
		return
	}
	done, _ = l.watch(t, done)
	p.Post(t, done)
}

func (l *lazyTransfers) post(t kv.Transfer, done kv.DoneFunc) {
	p := l.pool.Load()
	if p == nil {
		done(kv.ReasonInvalidRequest, nil)
		return
	}
	done, epoch := l.watch(t, done)
	if l.gate == nil || l.gated != nil && l.gated.Load() == 0 {
		p.Post(t, done)
		return
	}
	l.gatedPost(p, t, done, epoch)
}

// gatedPost asks the gate about t. It is a function of its own so that the
// copy of t its closure holds is made for a gated peer's transfer only (a
// parameter captured by a closure is moved to the heap on entry).
func (l *lazyTransfers) gatedPost(p *xfer.Pool, t kv.Transfer, done kv.DoneFunc, epoch uint64) {
	post := func() { p.Post(t, done) }
	if l.gate(t, epoch, post, func() { done(kv.ReasonPeerLost, nil) }) {
		return
	}
	post()
}

// PoolStats returns the transfer pool's counters (zero before the rank is live).
func (d *Daemon) PoolStats() xfer.Stats {
	if p := d.xfers.pool.Load(); p != nil {
		return p.Stats()
	}
	return xfer.Stats{}
}

// Counters returns the daemon's frame and registration counters by name,
// and the shared-memory control path's (shm_*).
func (d *Daemon) Counters() map[string]int64 {
	m := d.counters.snapshot()
	if d.control != nil {
		shmCounters(m, d.control.ShmStats())
	}
	return m
}

type counters struct {
	registrations, duplicateRegistrations, badRegistrations atomic.Int64
	badFrames, staging, noticeDropped                       atomic.Int64
	peersLost, peersDropped, abortsRefused                  atomic.Int64
	peersReturned, peersFenced, fencedInfos, queueRefused   atomic.Int64
	activationsRolledBack, lostRooms                        atomic.Int64
	logsSuppressed                                          atomic.Int64
	links                                                   *links
}

func (c *counters) snapshot() map[string]int64 {
	return map[string]int64{
		"registrations": c.registrations.Load(), "duplicate_registrations": c.duplicateRegistrations.Load(),
		"bad_registrations": c.badRegistrations.Load(), "bad_frames": c.badFrames.Load(),
		"staging_frames_dropped": c.staging.Load(), "notices_dropped": c.noticeDropped.Load(),
		"peers_lost": c.peersLost.Load(), "peers_dropped": c.peersDropped.Load(),
		"peers_returned": c.peersReturned.Load(), "peers_fenced": c.peersFenced.Load(),
		"fenced_transfer_infos": c.fencedInfos.Load(), "queued_frames_refused": c.queueRefused.Load(),
		"activations_rolled_back": c.activationsRolledBack.Load(), "lost_rooms": c.lostRooms.Load(),
		"abort_endpoints_refused": c.abortsRefused.Load(), "log_lines_suppressed": c.logsSuppressed.Load(),
		"links_evicted": c.links.evicted.Load(), "notices_send_failed": c.links.failed(),
	}
}
