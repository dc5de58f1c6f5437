package telemetry

import (
	"context"
	"encoding/binary"
	"errors"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/internal/clock"
)

// Limits and defaults.
const (
	DefaultMaxRooms         = 1 << 17
	DefaultMaxTransferSpans = 128
	DefaultQueueSize        = 4096
	// MaxEvents is the SDK's default event limit per span; more would be
	// dropped by the SDK anyway.
	MaxEvents = 128
	// DefaultSlow is the time to a terminal status above which a room is
	// always traced.
	DefaultSlow = 5 * time.Second

	maxShards   = 256
	freeRecords = 8192
)

// Config configures an Observer. The zero value observes metrics only.
type Config struct {
	// Exporter, when set, receives the spans of kept rooms directly: the
	// Observer builds them as read-only snapshots and exports them in batches
	// of up to 512, every ExportInterval or when Flush is called. This is the
	// cheap path (no SDK span machinery); Setup uses it.
	Exporter sdktrace.SpanExporter
	// Resource describes the process on directly exported spans.
	Resource *resource.Resource
	// ExportInterval bounds how long a built span waits for its batch
	// (default 1 s); ExportTimeout bounds one export (default 10 s).
	ExportInterval, ExportTimeout time.Duration
	// Tracer, used when Exporter is nil, receives the spans through the trace
	// API (any TracerProvider). It must not sample spans away itself (use
	// sdktrace.AlwaysSample): the Observer samples at retirement.
	Tracer trace.TracerProvider
	// Sampling is the tail-sampling policy; nil keeps every room.
	Sampling *Sampling
	// BytesPerPage converts pages to kv_transfer.bytes (KV bytes of one page
	// over all layers of this rank). 0 leaves bytes at 0; SetBytesPerPage
	// can change it later, e.g. once the scheduler registered memory.
	BytesPerPage int64
	// MaxRooms caps the live rooms tracked (default DefaultMaxRooms), split
	// evenly over the shards.
	MaxRooms int
	// MaxEvents caps status events per room span (default and at most 128).
	MaxEvents int
	// MaxTransferSpans caps child spans per room (default 128); more
	// transfers are still counted on the room span and in metrics.
	MaxTransferSpans int
	// QueueSize caps retired rooms waiting for their spans (default 4096).
	QueueSize int
	// Clock is the engine's clock (default the wall clock); span times and
	// durations come from it.
	Clock clock.Clock
}

// Source is what the daemon contributes to metrics at scrape time;
// *daemon.Daemon implements it.
type Source interface {
	PoolStats() xfer.Stats
	Counters() map[string]int64
	// DecodePeers counts registered decode agents by the SGLang release they
	// speak ("0.5.18" … "0.5.23", and "rejected").
	DecodePeers() map[string]int64
}

// Observer implements actors.Observer (rooms → spans and metrics) and the OTel
// metric SDK's Producer (metrics, aggregated at read time).
type Observer struct {
	cfg      Config
	clk      clock.Clock
	bpp      atomic.Int64
	start    time.Time // wall clock at New (metrics start time)
	base     time.Time // origin of the ticks; monotonic with the real clock
	real     bool      // Clock is the wall clock: ticks read only the monotonic clock
	sampling Sampling
	perShard int // MaxRooms split over the shards
	freeCap  int // recycled records kept per shard

	tracing bool
	tracer  trace.Tracer          // the API path
	exp     sdktrace.SpanExporter // the direct path
	batch   []sdktrace.ReadOnlySpan
	ids     ids

	shards []shard // a power of two: 4 × GOMAXPROCS, 8 to 256
	shift  uint    // 64 - log2(len(shards))

	// Rare events: plain atomics.
	evicted, badTraceparents, queueFull atomic.Int64
	refusedCap, refusedShare            atomic.Int64
	exported, exportErrors              atomic.Int64
	src                                 atomic.Pointer[sourceBox]

	queue   chan parcel
	closed  atomic.Bool
	stopped chan struct{}
}

var (
	_ actors.Observer        = (*Observer)(nil)
	_ actors.RefusalObserver = (*Observer)(nil)
)

type sourceBox struct{ s Source }

// shard holds the records of the live rooms that hash to it and the
// metrics those rooms moved, all under one lock: the hot path touches no
// shared atomic, and Produce sums the shards when metrics are read.
type shard struct {
	mu    sync.Mutex
	rooms map[uint64]*roomRec
	free  []*roomRec // recycled records
	kept  []*roomRec // retired rooms to be emitted, handed over by handoff
	st    shardStats
	_     [64]byte // keep neighbouring shards' locks off one cache line
}

type shardStats struct {
	tracked, created, untracked int64
	posted, xferOK, xferFailed  int64
	bytesOK, bytesFailed        int64
	live, retired               [numStatuses]int64
	failures                    [numReasons]int64
	absorbed                    [numMsgKinds][2]int64 // [kind][0 live room, 1 retired or unknown]
	decisions                   [numDecisions]int64
	statusDur                   [numStatuses]hist
	xferDur                     hist
}

// roomRec is what the Observer keeps of one live room until it retires. The
// small inline arrays hold a typical room without further allocation.
type roomRec struct {
	roomState
	evBuf [4]statusEvent
	spBuf [4]xferRec
	inBuf [4]inflightRec
	agBuf [2]string
}

// roomState is the part of a record that is reset between rooms. (Keep the
// Observer's frames small: they run deep in the actors' goroutines, whose
// stacks start small and are copied whenever they grow.)
type roomState struct {
	id         uint64
	created    tick
	statusAt   tick // when the current status was entered
	terminalAt tick // when it became terminal, if terminal
	retiredAt  tick
	terminal   bool
	status     room.Status
	reason     room.Reason
	retired    bool // false: emitted at Close while still live
	parent     trace.SpanContext
	// From parent, for the sampler (no SpanContext copies on the hot path).
	hasParent, parentSampled bool
	parentKey                uint64

	events        []statusEvent
	droppedEvents int
	spans         []xferRec // child spans, up to MaxTransferSpans
	droppedSpans  int
	inflight      []inflightRec
	agents        []string

	chunks      int
	required    int // required_dst_info_num from decode's transfer infos
	transfers   int // posted
	doneOK      int
	failedX     int // completed with a failure
	pages       int64
	bytes       int64 // successfully written
	bytesFailed int64
	ignored     int

	keep keepReason
}

type statusEvent struct {
	at     tick
	status room.Status
	reason room.Reason
}

type xferRec struct {
	seq        uint32
	chunk      int
	last       bool
	agent      string
	pages      int
	bytes      int64
	start, end tick
	fail       room.Reason
	done       bool
}

type inflightRec struct {
	seq   uint32
	bytes int64
	start tick
	span  int // index into spans, or -1
}

// New returns an Observer. Call Close when done (it emits what is left).
func New(cfg Config) (*Observer, error) {
	if cfg.MaxRooms <= 0 {
		cfg.MaxRooms = DefaultMaxRooms
	}
	if cfg.MaxEvents <= 0 || cfg.MaxEvents > MaxEvents {
		cfg.MaxEvents = MaxEvents
	}
	if cfg.MaxTransferSpans <= 0 {
		cfg.MaxTransferSpans = DefaultMaxTransferSpans
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.ExportInterval <= 0 {
		cfg.ExportInterval = time.Second
	}
	if cfg.ExportTimeout <= 0 {
		cfg.ExportTimeout = 10 * time.Second
	}
	o := &Observer{cfg: cfg, clk: cfg.Clock, start: time.Now(), base: cfg.Clock.Now(), stopped: make(chan struct{}),
		shift: 64 - uint(bits.Len(uint(shardCount())-1))}
	o.shards = make([]shard, 1<<(64-o.shift))
	o.perShard = (cfg.MaxRooms + len(o.shards) - 1) / len(o.shards)
	// Keep up to freeRecords recycled records (under 1 KiB each) over all
	// shards, so that steady traffic allocates none.
	o.freeCap = max(64, min(o.perShard, freeRecords/len(o.shards)))
	_, o.real = cfg.Clock.(clock.Real)
	o.sampling = Sampling{Ratio: 1}
	if cfg.Sampling != nil {
		if err := cfg.Sampling.validate(); err != nil {
			return nil, err
		}
		o.sampling = *cfg.Sampling
	}
	o.bpp.Store(cfg.BytesPerPage)
	for i := range o.shards {
		sh := &o.shards[i]
		sh.rooms = map[uint64]*roomRec{}
		for s := range sh.st.statusDur {
			sh.st.statusDur[s].init(len(statusBounds))
		}
		sh.st.xferDur.init(len(transferBounds))
	}
	switch {
	case cfg.Exporter != nil:
		o.exp, o.ids = cfg.Exporter, newIDs()
		if o.cfg.Resource == nil {
			o.cfg.Resource = resource.Default()
		}
	case cfg.Tracer != nil:
		o.tracer = cfg.Tracer.Tracer(Scope)
	}
	o.tracing = o.exp != nil || o.tracer != nil
	if o.tracing {
		o.queue = make(chan parcel, max(4, cfg.QueueSize/handoff))
		go o.emitLoop()
	} else {
		close(o.stopped)
	}
	return o, nil
}

// tick is a time as nanoseconds since Observer.base: 8 bytes instead of a
// time.Time's 24, and with the wall clock read from the monotonic clock alone
// (time.Since), half the cost of time.Now.
type tick int64

func (o *Observer) now() tick {
	if o.real {
		return tick(time.Since(o.base))
	}
	return tick(o.clk.Now().Sub(o.base))
}

// wall converts a tick back to a time for spans.
func (o *Observer) wall(t tick) time.Time { return o.base.Add(time.Duration(t)) }

// SetBytesPerPage changes the page size used for kv_transfer.bytes from now on.
func (o *Observer) SetBytesPerPage(n int64) { o.bpp.Store(n) }

// Attach makes the daemon's pool and frame counters part of the metrics (read
// at scrape time).
func (o *Observer) Attach(s Source) { o.src.Store(&sourceBox{s}) }

// shardCount is 4 × GOMAXPROCS rounded up to a power of two, within 8..256.
func shardCount() int {
	n := 8
	for n < 4*runtime.GOMAXPROCS(0) && n < maxShards {
		n *= 2
	}
	return n
}

func (o *Observer) shardIndex(id uint64) int { return int((id * 0x9E3779B97F4A7C15) >> o.shift) }

func (o *Observer) shardOf(id uint64) *shard { return &o.shards[o.shardIndex(id)] }

// newRec makes a record for a room first seen now; nil when the shard is at
// its share of MaxRooms. The caller holds the shard lock.
func (o *Observer) newRec(sh *shard, id uint64, now tick) *roomRec {
	if sh.st.tracked >= int64(o.perShard) {
		sh.st.untracked++
		return nil
	}
	var r *roomRec
	if n := len(sh.free); n > 0 {
		r, sh.free = sh.free[n-1], sh.free[:n-1]
	} else {
		r = new(roomRec)
		r.events, r.spans, r.inflight, r.agents = r.evBuf[:0], r.spBuf[:0], r.inBuf[:0], r.agBuf[:0]
	}
	r.id, r.created, r.statusAt, r.status = id, now, now, room.Bootstrapping
	sh.rooms[id] = r
	sh.st.tracked++
	sh.st.created++
	return r
}

// fold adds the transfer counts a record kept to its shard's totals (at
// retirement; Produce adds the live records' own). Counting per room keeps
// the hot path off the shard's counters.
func (st *shardStats) fold(r *roomRec) {
	st.posted += int64(r.transfers)
	st.xferOK += int64(r.doneOK)
	st.xferFailed += int64(r.failedX)
	st.bytesOK += r.bytes
	st.bytesFailed += r.bytesFailed
}

// reset empties r for reuse, keeping its inline buffers.
func reset(r *roomRec) {
	// Drop the agent strings of the used entries (addSpan zeroes an entry
	// before use, so the rest need no clearing).
	clear(r.spBuf[:min(len(r.spans), len(r.spBuf))])
	clear(r.agBuf[:min(len(r.agents), len(r.agBuf))])
	r.roomState = roomState{}
	r.events, r.spans, r.inflight, r.agents = r.evBuf[:0], r.spBuf[:0], r.inBuf[:0], r.agBuf[:0]
}

// recycle returns r to its shard's free list (bounded).
func (o *Observer) recycle(r *roomRec) {
	sh := o.shardOf(r.id)
	reset(r)
	sh.mu.Lock()
	if len(sh.free) < o.freeCap {
		sh.free = append(sh.free, r)
	}
	sh.mu.Unlock()
}

// RoomCreated implements actors.Observer.
func (o *Observer) RoomCreated(id uint64) {
	now := o.now()
	sh := o.shardOf(id)
	sh.mu.Lock()
	if _, ok := sh.rooms[id]; !ok { // else a traceparent came first: keep its time
		o.newRec(sh, id, now)
	}
	sh.mu.Unlock()
}

// TransferInfo implements actors.Observer: it records the room's
// required_dst_info_num (decode agents are recorded as transfers are posted).
func (o *Observer) TransferInfo(id uint64, _ string, required int) {
	now := o.now()
	sh := o.shardOf(id)
	sh.mu.Lock()
	r := sh.rooms[id]
	if r == nil {
		r = o.newRec(sh, id, now)
	}
	if r != nil {
		r.required = required
	}
	sh.mu.Unlock()
}

// Traceparent implements actors.Observer: the room's span joins that trace.
// Invalid values are ignored (counted).
func (o *Observer) Traceparent(id uint64, traceparent string) {
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": traceparent}))
	if !sc.IsValid() {
		o.badTraceparents.Add(1)
		return
	}
	now := o.now()
	sh := o.shardOf(id)
	sh.mu.Lock()
	r := sh.rooms[id]
	if r == nil {
		r = o.newRec(sh, id, now)
	}
	if r != nil {
		id := sc.TraceID()
		r.parent, r.hasParent, r.parentSampled = sc, true, sc.IsSampled()
		r.parentKey = binary.BigEndian.Uint64(id[8:16]) >> 1 // as sdktrace.TraceIDRatioBased
	}
	sh.mu.Unlock()
}

// StatusChanged implements actors.Observer.
func (o *Observer) StatusChanged(id uint64, s room.Status, why room.Reason) {
	now := o.now()
	sh := o.shardOf(id)
	sh.mu.Lock()
	st := &sh.st
	if s == room.Failed {
		st.failures[reasonIndex(why)]++
	}
	r := sh.rooms[id]
	if r == nil { // a tombstone revived by an Open is not created again
		if r = o.newRec(sh, id, now); r == nil {
			sh.mu.Unlock()
			return
		}
	} else {
		st.statusDur[statusIndex(r.status)].observe(time.Duration(now-r.statusAt), statusBoundsNs)
	}
	r.status, r.reason, r.statusAt = s, why, now
	if s.Terminal() && !r.terminal {
		r.terminalAt, r.terminal = now, true
	}
	if o.tracing {
		if len(r.events) < o.cfg.MaxEvents {
			r.events = append(r.events, statusEvent{at: now, status: s, reason: why})
		} else {
			r.droppedEvents++
		}
	}
	sh.mu.Unlock()
}

// Posted implements actors.Observer.
func (o *Observer) Posted(t *room.Transfer) {
	now := o.now()
	pages := len(t.SrcPages)
	bytes := int64(pages) * o.bpp.Load()
	sh := o.shardOf(t.Room)
	sh.mu.Lock()
	r := sh.rooms[t.Room]
	if r == nil {
		sh.st.posted++
		sh.mu.Unlock()
		return
	}
	r.transfers++
	r.pages += int64(pages)
	if t.Chunk+1 > r.chunks {
		r.chunks = t.Chunk + 1
	}
	span := -1
	if o.tracing {
		span = o.addSpan(r, t, pages, bytes, now)
	}
	if len(r.inflight) == cap(r.inflight) {
		r.inflight = slices.Grow(r.inflight, 1)
	}
	r.inflight = r.inflight[:len(r.inflight)+1]
	in := &r.inflight[len(r.inflight)-1]
	in.seq, in.bytes, in.start, in.span = t.Seq, bytes, now, span
	sh.mu.Unlock()
}

// addSpan records a child span for t, if r has room for one, and returns its
// index (-1 if not).
func (o *Observer) addSpan(r *roomRec, t *room.Transfer, pages int, bytes int64, now tick) int {
	if len(r.agents) < 16 && !contains(r.agents, t.Agent) {
		r.agents = append(r.agents, t.Agent)
	}
	if len(r.spans) >= o.cfg.MaxTransferSpans {
		r.droppedSpans++
		return -1
	}
	if len(r.spans) == cap(r.spans) {
		r.spans = slices.Grow(r.spans, 1)
	}
	r.spans = r.spans[:len(r.spans)+1]
	x := &r.spans[len(r.spans)-1]
	*x = xferRec{} // a recycled record may hold an old one
	x.seq, x.chunk, x.last, x.agent, x.pages, x.bytes, x.start = t.Seq, t.Chunk, t.Last, t.Agent, pages, bytes, now
	return len(r.spans) - 1
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// TransferDone implements actors.Observer.
func (o *Observer) TransferDone(id uint64, seq uint32, fail room.Reason) {
	now := o.now()
	sh := o.shardOf(id)
	sh.mu.Lock()
	st := &sh.st
	r := sh.rooms[id]
	if r == nil { // untracked, or completed after the room retired
		if fail == room.ReasonNone {
			st.xferOK++
		} else {
			st.xferFailed++
		}
		sh.mu.Unlock()
		return
	}
	if fail == room.ReasonNone {
		r.doneOK++
	} else {
		r.failedX++
	}
	for i := len(r.inflight) - 1; i >= 0; i-- {
		in := r.inflight[i]
		if in.seq != seq {
			continue
		}
		last := len(r.inflight) - 1
		r.inflight[i] = r.inflight[last]
		r.inflight = r.inflight[:last]
		st.xferDur.observe(time.Duration(now-in.start), transferBoundsNs)
		if fail == room.ReasonNone {
			r.bytes += in.bytes
		} else {
			r.bytesFailed += in.bytes
		}
		if in.span >= 0 {
			sp := &r.spans[in.span]
			sp.end, sp.fail, sp.done = now, fail, true
		}
		break
	}
	sh.mu.Unlock()
}

// Ignored implements actors.Observer: a message the room (or its tombstone,
// or nobody) absorbed.
func (o *Observer) Ignored(id uint64, msg room.Msg) {
	k := msgIndex(msg)
	sh := o.shardOf(id)
	sh.mu.Lock()
	if r := sh.rooms[id]; r != nil {
		r.ignored++
		sh.st.absorbed[k][0]++
	} else {
		sh.st.absorbed[k][1]++
	}
	sh.mu.Unlock()
}

// TombstoneEvicted implements actors.Observer.
func (o *Observer) TombstoneEvicted(uint64) { o.evicted.Add(1) }

// RoomRefused implements actors.RefusalObserver.
func (o *Observer) RoomRefused(_ uint64, peerShare bool) {
	if peerShare {
		o.refusedShare.Add(1)
	} else {
		o.refusedCap.Add(1)
	}
}

// RoomRetired implements actors.Observer: the room's record is closed, and
// its spans are emitted if the tail sampler keeps it.
func (o *Observer) RoomRetired(t room.Tombstone) {
	now := o.now()
	sh := o.shardOf(t.Room)
	sh.mu.Lock()
	st := &sh.st
	st.retired[statusIndex(t.Status)]++
	r := sh.rooms[t.Room]
	if r == nil {
		sh.mu.Unlock()
		return
	}
	delete(sh.rooms, t.Room)
	st.tracked--
	st.statusDur[statusIndex(r.status)].observe(time.Duration(now-r.statusAt), statusBoundsNs)
	st.fold(r)
	r.status, r.reason, r.retiredAt, r.retired = t.Status, t.Reason, now, true
	keep := dropSampled
	if o.tracing {
		keep = o.sampling.decide(r)
		st.decisions[keep]++
	}
	if keep == dropSampled || o.closed.Load() {
		reset(r)
		if len(sh.free) < o.freeCap {
			sh.free = append(sh.free, r)
		}
		sh.mu.Unlock()
		return
	}
	r.keep = keep
	sh.kept = append(sh.kept, r)
	var full []*roomRec
	if len(sh.kept) >= handoff {
		full, sh.kept = sh.kept, make([]*roomRec, 0, handoff)
	}
	sh.mu.Unlock()
	if full != nil {
		o.handOver(full)
	}
}

// handoff is how many kept rooms a shard gathers before it hands them to the
// emitter: one channel operation (and at most one wake-up) per batch instead
// of per room. The emitter also collects partial batches every
// ExportInterval and on Flush.
const handoff = 8

// parcel is what the emitter receives: kept rooms, or a Flush barrier.
type parcel struct {
	recs    []*roomRec
	barrier chan struct{}
}

func (o *Observer) handOver(recs []*roomRec) {
	select {
	case o.queue <- parcel{recs: recs}:
	default:
		o.queueFull.Add(int64(len(recs)))
		for _, r := range recs {
			o.recycle(r)
		}
	}
}

// collect takes every shard's partial batch of kept rooms.
func (o *Observer) collect() []*roomRec {
	var out []*roomRec
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.Lock()
		out = append(out, sh.kept...)
		clear(sh.kept)
		sh.kept = sh.kept[:0]
		sh.mu.Unlock()
	}
	return out
}

// Flush waits until every room retired so far has had its spans exported
// (direct path) or handed to the TracerProvider (API path; its own batching
// is flushed by ForceFlush).
func (o *Observer) Flush(ctx context.Context) error {
	if !o.tracing || o.closed.Load() {
		return nil
	}
	b := parcel{barrier: make(chan struct{})}
	select {
	case o.queue <- b:
	case <-ctx.Done():
		return ctx.Err()
	case <-o.stopped:
		return nil
	}
	select {
	case <-b.barrier:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the emitter after the rooms already queued, then emits a span
// for every room still live (attribute kv_transfer.retired=false), ended now.
// Call it after the engine closed. It returns ctx's error if ctx ends first.
func (o *Observer) Close(ctx context.Context) error {
	if o.closed.Swap(true) {
		return errors.New("telemetry: observer already closed")
	}
	if !o.tracing {
		return nil
	}
	b := parcel{barrier: make(chan struct{})}
	select {
	case o.queue <- b: // the emitter exits after this one
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-o.stopped:
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, r := range o.collect() { // retired, kept, not yet handed over
		o.emit(r)
	}
	now := o.now()
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.Lock()
		live := make([]*roomRec, 0, len(sh.rooms))
		for id, r := range sh.rooms {
			live = append(live, r)
			delete(sh.rooms, id)
			sh.st.fold(r)
		}
		sh.st.tracked = 0
		sh.mu.Unlock()
		for _, r := range live {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.retiredAt = now
			if r.keep = o.sampling.decide(r); r.keep != dropSampled {
				o.emit(r)
			}
		}
	}
	if o.exp != nil {
		o.export(ctx)
	}
	return ctx.Err()
}

func (o *Observer) emitLoop() {
	defer close(o.stopped)
	tick := time.NewTicker(o.cfg.ExportInterval) // wall time: export latency, not room time
	defer tick.Stop()
	emit := func(recs []*roomRec) {
		for _, r := range recs {
			o.emit(r)
			o.recycle(r)
		}
	}
	for {
		select {
		case p := <-o.queue:
			if p.barrier == nil {
				emit(p.recs)
				continue
			}
			emit(o.collect())
			if o.exp != nil {
				o.export(context.Background())
			}
			close(p.barrier)
			if o.closed.Load() {
				return
			}
		case <-tick.C:
			emit(o.collect())
			if o.exp != nil {
				o.export(context.Background())
			}
		}
	}
}

// oldestNonTerminal returns the age of the oldest tracked room that is not
// Success or Failed, and how many such rooms there are.
func (o *Observer) oldestNonTerminal(now tick) (time.Duration, int) {
	var oldest tick
	n := 0
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.Lock()
		for _, r := range sh.rooms {
			if r.status.Terminal() {
				continue
			}
			n++
			if n == 1 || r.created < oldest {
				oldest = r.created
			}
		}
		sh.mu.Unlock()
	}
	if n == 0 {
		return 0, 0
	}
	return time.Duration(now - oldest), n
}
