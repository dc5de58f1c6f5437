package decode

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/emul/pages"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/wire"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// Emulator is one decode rank (plus its optional dummy sibling). Create it with
// New, call Start once, then Run or RunRoom, then Close.
type Emulator struct {
	cfg Config
	clk clock.Clock
	log *slog.Logger
	bc  *bootstrapClient

	primary, dummy *rank
	pages, aux     *pages.Pool // the decode-side page model (emul/pages)
	state          *pages.Pool // nil without state

	info    *ServerInfo
	mapping Mapping

	mu       sync.Mutex
	rooms    map[uint64]*roomState
	checker  *sglang.Checker
	targets  map[int][]Target // dp group -> resolved targets; dropped on heartbeat loss
	hbFails  int
	hbTimer  clock.Timer
	gen      uint64 // _deferred_abort_generation: the last generation handed out (0.5.22+)
	closed   bool
	quit     chan struct{}
	pollDone chan struct{}
	stg      *stagingAnswer // the staging listener (staging_answer.go); nil without a ring

	c counters
}

// counters are the emulator-wide figures that do not belong to one room.
type counters struct {
	registrations   atomic.Int64
	heartbeatLosses atomic.Int64
	lateNotices     atomic.Int64 // KV_STATUS / ABORT_ACK for a room no longer tracked
	badOutbound     atomic.Int64 // undecodable prefill->decode messages
	otherStatus     atomic.Int64 // KV_STATUS with a status other than 0 or 4 (ignored)
	badNotifs       atomic.Int64 // NIXL notifications decode could not parse
	dummyNotifs     atomic.Int64 // NIXL notifications that reached the dummy rank (must be 0)
	unreadNotifs    atomic.Int64 // 0.5.23: notifications it never reads (must be 0)
	pushErrors      atomic.Int64
	foreignRanks    atomic.Int64 // KV_STATUS / ABORT_ACK from a prefill_rank the room did not target
	generations     atomic.Int64 // armed ABORTs sent with a generation (0.5.22+)
	unsafeReleases  atomic.Int64 // rooms freed with writes possibly in flight (see pages.Pool)

	acksCounted atomic.Int64 // ABORT_ACKs that counted toward a release
	acksNoGen   atomic.Int64 // 0.5.22+: generation-less ACKs, ignored
	acksStale   atomic.Int64 // 0.5.22+: ACKs with another generation, ignored
	acksUnarmed atomic.Int64 // ACKs for a room that holds nothing (0.5.20 never arms), ignored

	// Messages on the PULL sockets by kind ("KV_STATUS 0", "ABORT_ACK 4
	// frames", …), under Emulator.mu. 0.5.18 reads none of them.
	pull, dummyPull map[string]int64
}

// New creates the decode ranks (agents, memory, PULL sockets). It does not
// touch the network beyond binding.
func New(cfg Config) (*Emulator, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Emulator{cfg: cfg, clk: cfg.Clock, log: cfg.Logger, rooms: map[uint64]*roomState{},
		checker: sglang.NewChecker(), targets: map[int][]Target{}, quit: make(chan struct{}), pollDone: make(chan struct{})}
	e.c.pull, e.c.dummyPull = map[string]int64{}, map[string]int64{}
	if e.clk == nil {
		e.clk = clock.Real{}
	}
	if e.log == nil {
		e.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	}
	e.bc = newBootstrapClient(cfg.Bootstrap, hc)
	var err error
	if e.primary, err = newRank(&e.cfg, "r0", cfg.TPRank, e.onPrimaryMsg); err != nil {
		return nil, err
	}
	if cfg.Workload.DummyShare > 0 {
		if e.dummy, err = newRank(&e.cfg, "dummy", cfg.TPRank, e.onDummyMsg); err != nil {
			e.primary.close()
			return nil, err
		}
	}
	if cfg.StagingBytes > 0 {
		ring := NewStagingRing(cfg.StagingBytes)
		ring.EmptyNewRound = cfg.Release == Release0523
		e.stg = &stagingAnswer{ring: ring, reqs: map[string]int64{}, known: map[uint64]bool{}}
	}
	e.pages = pages.New(cfg.Shape.Slots)
	e.aux = pages.New(cfg.Shape.AuxSlots)
	if cfg.State {
		e.state = pages.New(cfg.Shape.StateSlots)
	}
	return e, nil
}

// Port is the primary rank's PULL port (where KV_STATUS / ABORT_ACK arrive).
func (e *Emulator) Port() int { return e.primary.pull.Port() }

// Info returns the topology read by Start, and the resolved mapping.
func (e *Emulator) Info() (ServerInfo, Mapping) { return *e.info, e.mapping }

// Start queries the topology (retrying while the prefill is not fully
// registered), checks it against decode's settings, resolves the rank mapping,
// and starts the notification poller and the heartbeat.
func (e *Emulator) Start(ctx context.Context) error {
	si, err := e.bc.waitTopology(ctx, e.cfg.TopologyAttempts, e.cfg.TopologyRetry)
	if err != nil {
		return err
	}
	if e.cfg.PageSize > 0 && (si.PageSize == nil || *si.PageSize != e.cfg.PageSize) {
		return fmt.Errorf("decode: prefill page_size %v does not match decode's %d", deref(si.PageSize), e.cfg.PageSize)
	}
	if e.cfg.KVCacheDtype != "" && (si.KVCacheDtype == nil || *si.KVCacheDtype != e.cfg.KVCacheDtype) {
		return fmt.Errorf("decode: prefill kv_cache_dtype %v does not match decode's %q", deref(si.KVCacheDtype), e.cfg.KVCacheDtype)
	}
	m, err := ResolveMapping(si, e.cfg.TPSize, e.cfg.TPRank, e.cfg.PPSize, e.cfg.MLA)
	if err != nil {
		return err
	}
	e.info, e.mapping = si, m
	go e.pollNotifs()
	e.mu.Lock()
	e.hbTimer = e.clk.AfterFunc(e.cfg.HeartbeatInterval, e.heartbeat)
	e.mu.Unlock()
	return nil
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// Close stops the heartbeat, the poller and the sockets and frees the memory.
// Rooms still running see their sends fail; call it after Run returns.
func (e *Emulator) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	if e.hbTimer != nil {
		e.hbTimer.Stop()
	}
	close(e.quit)
	started := e.info != nil
	e.mu.Unlock()
	if started {
		<-e.pollDone
	}
	// Links under the lock (link() and nodeFailureLocked use them); the PULL
	// sockets outside it, since their handlers take the lock and Stop waits
	// for the handler to return.
	ranks := []*rank{e.primary}
	if e.dummy != nil {
		ranks = append(ranks, e.dummy)
	}
	e.mu.Lock()
	for _, r := range ranks {
		r.closeLinks()
	}
	e.mu.Unlock()
	for _, r := range ranks {
		r.close()
	}
}

// targetsFor resolves (once per DP group, and again after a heartbeat loss)
// the prefill ranks a room is pulled from, and makes sure r has a PUSH link to
// each of them with its registration sent first (ZMQ keeps the order, so the
// registration precedes every transfer info on that link).
func (e *Emulator) targetsFor(ctx context.Context, r *rank, room uint64) ([]Target, error) {
	dp, err := DPRank(e.info, room)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	ts, ok := e.targets[dp]
	e.mu.Unlock()
	if !ok {
		m := e.mapping
		for _, cp := range m.CPRanks {
			for _, tp := range m.TPRanks {
				for i := len(m.PPRanks) - 1; i >= 0; i-- { // upstream iterates reversed(pp ranks)
					pp := m.PPRanks[i]
					ip, port, err := e.bc.rankEndpoint(ctx, dp, cp, tp, pp)
					if err != nil {
						return nil, err
					}
					ts = append(ts, Target{DP: dp, CP: cp, TP: tp, PP: pp, Dummy: m.DummyTP[tp], IP: ip, Port: port})
				}
			}
		}
		e.mu.Lock()
		if cur, ok := e.targets[dp]; ok {
			ts = cur
		} else {
			e.targets[dp] = ts
		}
		e.mu.Unlock()
	}
	for _, t := range ts {
		if _, err := e.link(r, t); err != nil {
			return nil, err
		}
	}
	return ts, nil
}

// link returns r's PUSH link to t, creating it and sending the registration.
func (e *Emulator) link(r *rank, t Target) (*zmqio.PushLink, error) {
	ep := zmqio.TCPEndpoint(t.IP, t.Port)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, zmqio.ErrLinkClosed
	}
	if l, ok := r.links[ep]; ok {
		return l, nil
	}
	reg, err := r.registration(&e.cfg)
	if err != nil {
		return nil, err
	}
	l, err := zmqio.DialPush(zmqio.PushConfig{Endpoint: ep, Logger: e.cfg.Logger})
	if err != nil {
		return nil, err
	}
	if err := l.Send(reg.Encode()); err != nil {
		l.Close()
		return nil, err
	}
	e.c.registrations.Add(1)
	r.links[ep] = l
	return l, nil
}

// send queues frames to t on r's link; failures are counted, as decode's
// sends are best effort.
func (e *Emulator) send(r *rank, t Target, frames [][]byte) {
	l, err := e.link(r, t)
	if err == nil {
		err = l.Send(frames)
	}
	if err != nil {
		e.c.pushErrors.Add(1)
		e.log.Warn("decode: send to prefill failed", "endpoint", zmqio.TCPEndpoint(t.IP, t.Port), "err", err)
	}
}

// pullKind names a prefill->decode message for the PULL counters.
func pullKind(frames [][]byte) string {
	if len(frames) == 0 {
		return "empty"
	}
	switch tag := string(frames[0]); tag {
	case wire.TagKVStatus:
		if len(frames) > 2 {
			return "KV_STATUS " + string(frames[2])
		}
		return "KV_STATUS ?"
	case wire.TagAbortAck:
		return fmt.Sprintf("ABORT_ACK %d frames", len(frames))
	default:
		if len(tag) > 24 || !printable(tag) {
			return "other"
		}
		return tag
	}
}

func printable(s string) bool {
	for _, c := range []byte(s) {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// onPrimaryMsg is the primary rank's PULL socket. 0.5.18 runs no listener
// there: messages only queue, so they are counted and nothing else. 0.5.20+
// run _start_decode_listener_thread: KV_STATUS and ABORT_ACK are applied to
// the room. It runs on the socket goroutine and only records.
func (e *Emulator) onPrimaryMsg(frames [][]byte) {
	rel := e.cfg.Release
	e.mu.Lock()
	e.c.pull[pullKind(frames)]++
	e.mu.Unlock()
	if e.stg != nil && isStagingReq(frames) {
		e.onStagingReq(frames) // staging's own listener, on every release
		return
	}
	if e.stg != nil && rel.ReadsPull() && isChunkReady(frames) {
		e.onChunkReady(frames)
		return
	}
	if !rel.ReadsPull() {
		return
	}
	m, err := wire.DecodeOutbound(frames)
	if err != nil {
		e.c.badOutbound.Add(1)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch m := m.(type) {
	case *wire.KVStatus:
		rs, ok := e.rooms[m.Room]
		if !ok || !rs.infoSent {
			e.c.lateNotices.Add(1) // request_status has no such room: dropped
			return
		}
		if !rs.ranks[m.PrefillRank] {
			e.c.foreignRanks.Add(1)
		}
		switch m.Status {
		case kv.StatusFailed:
			if !rs.complete && !rs.failed {
				rs.failed, rs.failReason = true, m.Reason
				if rs.failReason == "" {
					rs.failReason = "Failed to get kvcache from prefill instance, it might be dead"
				}
			}
		case kv.StatusSuccess:
			// apply_prefill_status: success once N distinct prefill_rank values said so.
			rs.okRanks[m.PrefillRank] = true
			if !rs.complete && !rs.failed && len(rs.okRanks) >= max(e.mapping.RequiredPrefillResponses, 1) {
				rs.complete, rs.completedBy = true, CompletedByStatus
			}
		default:
			e.c.otherStatus.Add(1)
			return
		}
		rs.poke()
	case *wire.AbortAck:
		if rel.Generations() && !m.HasGen {
			e.c.acksNoGen.Add(1) // "generation-less ABORT_ACK ignored" (warned once upstream)
			return
		}
		rs, ok := e.rooms[m.Room]
		if !ok {
			e.c.lateNotices.Add(1) // released already: _do_release dropped the state
			return
		}
		if !rs.ranks[m.PrefillRank] {
			e.c.foreignRanks.Add(1)
		}
		if !rs.armed {
			e.c.acksUnarmed.Add(1)
			return
		}
		if rel.Generations() && m.Generation != rs.gen {
			e.c.acksStale.Add(1)
			return
		}
		e.c.acksCounted.Add(1)
		rs.acks[m.PrefillRank] = true
		rs.poke()
	}
}

// onDummyMsg: the dummy rank holds no pages for anyone; it only counts.
func (e *Emulator) onDummyMsg(frames [][]byte) {
	e.mu.Lock()
	e.c.dummyPull[pullKind(frames)]++
	e.mu.Unlock()
}

// notifier is an agent that says when notifications arrive (the loopback
// backend's OnNotif).
type notifier interface {
	OnNotif(wake func()) (stop func())
}

// pollNotifs is decode's poll(): decode has no NIXL progress thread, it drains
// get_new_notifs() and applies update_transfer_status. Here that runs in one
// goroutine: where the agents say when notifications arrive it waits for
// that, else it polls, backing off when idle (Go's timers make that at least
// 1 ms).
func (e *Emulator) pollNotifs() {
	defer close(e.pollDone)
	var buf []nixl.Notif
	idle := 20 * time.Microsecond
	var arrived chan struct{}
	pn, ok := e.primary.node.NIXL.(notifier)
	var dn notifier
	if e.dummy != nil {
		dn, _ = e.dummy.node.NIXL.(notifier)
	}
	if ok && (e.dummy == nil || dn != nil) {
		arrived = make(chan struct{}, 1)
		wake := func() {
			select {
			case arrived <- struct{}{}:
			default:
			}
		}
		defer pn.OnNotif(wake)()
		if dn != nil {
			defer dn.OnNotif(wake)()
		}
	}
	for {
		select {
		case <-e.quit:
			return
		default:
		}
		ns, err := e.primary.node.NIXL.Notifs(buf[:0])
		if err != nil {
			return
		}
		buf = ns
		if e.dummy != nil {
			if dn, err := e.dummy.node.NIXL.Notifs(nil); err == nil && len(dn) > 0 {
				e.c.dummyNotifs.Add(int64(len(dn)))
			}
		}
		if len(ns) == 0 {
			if arrived != nil {
				select {
				case <-arrived:
				case <-e.quit:
					return
				}
				continue
			}
			time.Sleep(idle)
			idle = min(2*idle, time.Millisecond)
			continue
		}
		idle = 20 * time.Microsecond
		if !e.cfg.Release.Notifs() {
			// 0.5.23 never calls get_new_notifs: these would pile up in its agent.
			e.c.unreadNotifs.Add(int64(len(ns)))
			continue
		}
		e.mu.Lock()
		var wms []stagedWatermark
		for _, n := range ns {
			msg := n.Msg
			if e.stg != nil && strings.Contains(msg, "_stg_") {
				// A staged chunk: scatter it once every writer's block
				// arrived, then count it as that chunk's kv arrival.
				st, err := wire.ParseStgNotif(msg)
				if err != nil {
					e.c.badNotifs.Add(1)
					continue
				}
				if wm := e.stagedArrivedLocked(st.Room, st.ChunkIdx, st.PageStart, st.NumPages); wm.wm != nil {
					wms = append(wms, wm)
				}
				msg = string(sglang.AppendKVNotif(nil, st.Room, st.ChunkID, st.IsLast, st.Sender))
			}
			nn, err := sglang.ParseNotif(msg)
			if err != nil {
				e.c.badNotifs.Add(1)
				continue
			}
			rs, ok := e.rooms[nn.Room]
			if !ok {
				continue // a write that landed after the room ended; nothing to track
			}
			e.checker.Status(nn.Room).Apply(nn)
			if !rs.complete && !rs.failed && rs.infoSent && e.checker.Done(nn.Room) {
				rs.complete, rs.completedBy = true, CompletedByNotifs
				rs.poke()
			}
		}
		e.mu.Unlock()
		e.sendWatermarks(wms)
	}
}

// heartbeat is one GET /health; it re-arms itself. After HeartbeatMaxFailure
// consecutive failures it does upstream's _handle_node_failure.
func (e *Emulator) heartbeat() {
	select {
	case <-e.quit:
		return
	default:
	}
	err := e.bc.health(context.Background(), e.cfg.HeartbeatTimeout)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	if err == nil {
		e.hbFails = 0
	} else if e.hbFails++; e.hbFails >= e.cfg.HeartbeatMaxFailure {
		e.hbFails = 0
		e.nodeFailureLocked(err)
	}
	e.hbTimer = e.clk.AfterFunc(e.cfg.HeartbeatInterval, e.heartbeat)
}

// nodeFailureLocked fails every room not yet complete ("Lost connection with
// prefill instance"), closes the PUSH links and forgets the resolved targets,
// so the next room looks them up and registers again.
func (e *Emulator) nodeFailureLocked(cause error) {
	e.c.heartbeatLosses.Add(1)
	e.log.Warn("decode: lost connection with prefill instance", "bootstrap", e.cfg.Bootstrap, "err", cause)
	for _, rs := range e.rooms {
		if !rs.complete {
			rs.lost = true
			rs.poke()
		}
	}
	for _, r := range []*rank{e.primary, e.dummy} {
		if r != nil {
			r.closeLinks()
		}
	}
	clear(e.targets)
}

// Held returns the KV pages and aux slots currently taken by rooms.
func (e *Emulator) Held() (pages, aux int) { return e.pages.Held(), e.aux.Held() }
