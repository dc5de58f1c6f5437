package telemetry

import (
	"context"
	"errors"
	"math"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
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

	// numStripes is how many stripes the aggregate metrics are split
	// into, a room's by its id (stripeIndex).
	numStripes = 64
)

// Config configures an Observer. The zero value observes metrics only.
type Config struct {
	// Exporter, when set, receives the spans of kept rooms directly: the
	// Observer builds them as read-only snapshots and exports them in batches
	// of up to 512, every ExportInterval or when Flush is called. This is the
	// cheap path (no SDK span machinery); Setup uses it.
	Exporter sdktrace.SpanExporter
	// ReuseSpans says that Exporter keeps nothing it is given (the spans,
	// their attribute and event slices) once ExportSpans returns, as the
	// OTLP exporters do (they encode the batch within the call; Setup sets
	// it for them) and tracetest.InMemoryExporter does not. The Observer
	// then builds each batch's spans in memory it reuses for the next batch,
	// instead of allocating about 3 KB per kept room.
	ReuseSpans bool
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
	// MaxRooms caps the live rooms tracked (default DefaultMaxRooms): rooms
	// with a record, live or retired and waiting for their spans.
	MaxRooms int
	// MaxEvents caps status events per room span (default and at most 128).
	MaxEvents int
	// MaxTransferSpans caps child spans per room (default 128, at most 65,519); more
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
//
// Each room keeps its own record (a *roomRec, the actors.RoomObserver its
// actor calls, never two goroutines at once): timestamps, transfers, trace
// context. When the room retires the record is handed to the emitter over a
// channel (kept rooms only; the rest are recycled at once, through a
// sync.Pool). The aggregate metrics are atomic counters and histograms,
// striped by room id so that rooms on different cores seldom add to one
// cache line, added to as events happen; the live-room gauges are summed at
// scrape time from what the rooms reported to the engine's shards
// (actors.Engine.Live). Nothing on a room's path takes a lock.
type Observer struct {
	cfg      Config
	clk      clock.Clock
	bpp      atomic.Int64
	start    time.Time // wall clock at New (metrics start time)
	base     time.Time // origin of the ticks; monotonic with the real clock
	real     bool      // Clock is the wall clock: ticks read only the monotonic clock
	sampling Sampling
	// capMask picks the stripe that counts a room's record toward MaxRooms
	// (stripeIndex(id) & capMask, see capStripe); pool keeps reset records
	// for reuse.
	capMask int
	pool    sync.Pool
	unt     untracked // the record of every room over MaxRooms

	tracing bool
	tracer  trace.Tracer          // the API path
	exp     sdktrace.SpanExporter // the direct path
	batch   []sdktrace.ReadOnlySpan
	reuse   bool      // ReuseSpans: build into arenas, reused after each export
	arena   spanArena // the emitter's, if reuse
	ids     ids
	agents  map[string]attribute.KeyValue // the emitter's: kv_transfer.peer.agent of one-agent rooms
	common  spanCommon                    // resource and scope of the direct path's spans

	all []stripe // numStripes, a room's by stripeIndex

	// Rare events: plain atomics.
	badTraceparents, queueFull atomic.Int64
	refusedCap, refusedShare   atomic.Int64
	exported, exportErrors     atomic.Int64
	src                        atomic.Pointer[sourceBox]
	engines                    atomic.Pointer[[]*actors.Engine]
	// ownClock: an engine watched runs on another clock than this
	// Observer's, so records read their own. Otherwise a room's step reads
	// the clock once for the engine and its record (actors.StepClock).
	ownClock atomic.Bool

	// Records handed over: kept (retired, sampled in; at most QueueSize
	// wait) and abandoned (live when the engine stopped or the Observer
	// closes).
	kept        chan *roomRec
	abandonedMu sync.Mutex
	abandoned   []*roomRec

	queue chan parcel // Flush and Close barriers for the emitter
	wake  chan struct{}
	// wakeAt kept rooms waiting (a quarter of QueueSize) wake the emitter
	// before its next tick: at high rates (keep-all at 100k rooms/s keeps
	// 100k rooms a second) the queue would fill up between ticks and drop
	// rooms. The spans are still exported in batches (exportBatch), or at
	// the tick.
	wakeAt  int
	closed  atomic.Bool
	stopped chan struct{}
}

var (
	_ actors.Observer        = (*Observer)(nil)
	_ actors.RefusalObserver = (*Observer)(nil)
	_ actors.EngineWatcher   = (*Observer)(nil)
	_ actors.RoomObserver    = (*roomRec)(nil)
	_ actors.RoomObserver    = (*untracked)(nil)
)

type sourceBox struct{ s Source }

// stripe is a share of the aggregate metrics: atomics only, read and summed
// by Produce. Tracked rooms are those created minus those released. The
// first len(all) & capMask stripes also share MaxRooms out: inUse counts the
// records in use of their rooms, at most limit.
//
// It is laid out by lines so that a room adds to few of them, wherever its
// durations fall: the counters every room adds to (line 0), the histograms'
// sums (line 1), the retirements and the rarer outcomes (line 2), the
// sampling decisions (line 3), then the histograms' buckets as rows across
// the histograms (rows[i] is bucket i of every status's and of the
// transfers'), so that a room's durations of one order share a line, where
// one histogram per status put each in a line (two, with its sum) of its
// own: a successful room adds to 4 or 5 lines of its stripe, not 12. Then
// what failed rooms and absorbed messages count. Stripes are whole lines
// (TestStripeLines).
type stripe struct {
	// Line 0.
	inUse             atomic.Int64
	limit             int64 // set by New
	created, released atomic.Int64
	posted, xferOK    atomic.Int64
	bytesOK           atomic.Int64
	evicted           atomic.Int64 // tombstones: one per room once the shards are full
	sums              [numHists]atomic.Int64
	_                 [8 - numHists]int64
	retired           [numStatuses]atomic.Int64
	xferFailed        atomic.Int64
	bytesFailed       atomic.Int64
	untracked         atomic.Int64
	decisions         [numDecisions]atomic.Int64
	_                 [8 - numDecisions]int64
	rows              [maxBuckets][8]atomic.Int64 // rows[i][h]: bucket i of histogram h (status, or xferHist)
	failures          [numReasons]atomic.Int64
	absorbed          [numMsgKinds][2]atomic.Int64 // [kind][0 live room, 1 retired or unknown]
	_                 [stripePad]byte
}

// The histograms of a stripe: one per status (the time spent in it), then
// the transfers' durations.
const (
	xferHist = numStatuses
	numHists = numStatuses + 1
	// stripePad makes a stripe whole lines: 4 lines of scalars, the rows
	// and failures (whole lines), then absorbed (208 bytes) before it.
	stripePad = 64 - (numMsgKinds*2*8)%64
)

// observe records d in histogram h of st.
func (st *stripe) observe(h int, d time.Duration, bounds []time.Duration) {
	d = max(d, 0)
	i := 0
	for i < len(bounds) && d > bounds[i] {
		i++
	}
	st.rows[i][h].Add(1)
	st.sums[h].Add(int64(d))
}

// shardStats is a snapshot of the stripes, summed (totals), plus the live
// gauges read from the engines.
type shardStats struct {
	tracked, created, untracked int64
	evicted                     int64
	posted, xferOK, xferFailed  int64
	bytesOK, bytesFailed        int64
	live, retired               [numStatuses]int64
	failures                    [numReasons]int64
	absorbed                    [numMsgKinds][2]int64
	decisions                   [numDecisions]int64
	statusDur                   [numStatuses]hist
	xferDur                     hist
}

// roomRec is what the Observer keeps of one live room until it retires.
//
// Its first line (o and roomHead) is what a room touches at its creation
// and its retirement: a dropped room's retirement, and its record's reset,
// touch nothing else. The next (roomBody, then the first transfer entry) is
// what every room's steps write; it is zeroed when the record is given to
// a room, which writes it soon after anyway. Then the second transfer
// entry, the first agent and three status events (a typical traced room
// has three status events, two transfers and one agent); longer lists
// spill over into more. What most rooms never touch (the counters of
// failures and drops, the overflow buffers, a parent trace context) comes
// last. Records are 320 bytes, a size class of 64-byte-aligned objects, so
// each part starts a cache line (TestRecordLines).
type roomRec struct {
	o *Observer // set once: a record serves one Observer
	// The room's actor's step clock (BindSteps; noSteps until then): the
	// callbacks of one step share its reading, unless the Observer reads
	// its own clock (ownClock).
	clk *actors.StepClock
	roomState
	xf     [inlineXfers]xferRec // transfers: spans first, then in flight (see xfers)
	agent0 [1]string            // the first agent (see agents)
	evs    [inlineEvents]statusEvent
	// Line 3 on: what few rooms touch.
	rareState
	more *recMore // where xf, agent0 and evs spill over (kept for reuse)
	// parent is the trace the room joins (Traceparent; valid if hasParent,
	// cleared by reset only then).
	parent trace.SpanContext
}

const (
	inlineXfers  = 2
	inlineEvents = 3
	// maxSpanAgents caps the agents a record names: agent indexes are
	// uint16 (Config.MaxTransferSpans is capped alike).
	maxSpanAgents = math.MaxUint16
	// maxSpans caps Config.MaxTransferSpans: roomState.nSpans is a uint16,
	// and the agents of the spans and of the room stay within
	// maxSpanAgents.
	maxSpans = maxSpanAgents - maxRoomAgents
	// maxXfers caps a record's transfer entries (spans and writes in
	// flight): a write posted past it is counted but not followed (no
	// bytes or duration at its completion; only a room with more than
	// 65,535 writes in flight at once).
	maxXfers = math.MaxUint16
)

// roomState is what every room writes: its head and its body.
type roomState struct {
	roomHead
	roomBody
}

// roomHead is the rest of a record's first line (after o and clk): what the room's creation,
// its retirement and the sampler read and write. Reset at retirement.
type roomHead struct {
	id        uint64 // its stripe is o.stripe(id)
	created   tick
	statusAt  tick // when the current status was entered (once terminal, it stays: terminal statuses are absorbing)
	retiredAt tick
	status    kv.Status
	reason    kv.Reason
	keep      keepReason
	terminal  bool // it became terminal (at statusAt)
	retired   bool // false: emitted at Close while still live
	// From parent, for the sampler (no SpanContext reads on the hot path).
	hasParent, parentSampled bool
	rare                     bool  // rareState was written
	spill                    uint8 // spillX | spillA | spillE: in more
}

// roomBody is what a room's steps count, zeroed when a room takes the
// record (begin).
type roomBody struct {
	bytes     int64 // successfully written
	pages     int32 // saturating, as chunks and transfers
	chunks    int32
	transfers int32  // posted
	required  uint16 // required_dst_info_num from decode's transfer infos (saturating)
	nX        uint16 // entries in xfers() (at most maxXfers)
	nSpans    uint16 // of which the first nSpans are child spans (tracing)
	nAg       uint16 // len(agents())
	nEv       uint8  // len(events())
}

// Which of a record's lists live in its recMore.
const (
	spillX = 1 << iota
	spillA
	spillE
)

// rareState is what few rooms write (failures, absorbed messages, drops);
// reset clears it only if rare is set, and so leaves its line alone.
type rareState struct {
	failedX       int32 // completed with a failure
	ignored       int32
	droppedEvents int32
	droppedSpans  int32
	bytesFailed   int64
}

// recMore holds a record's lists once they outgrow the inline arrays: each
// list moves here whole and stays until reset (which keeps the buffers for
// the record's next rooms, up to maxKeptMore entries).
type recMore struct {
	xfers  []xferRec
	agents []string
	events []statusEvent
}

const maxKeptMore = 256

// statusEvent is a status change in 8 bytes: when, as nanoseconds since
// the room's creation in the top 48 bits (78 hours; a room's deadlines end
// it long before, and later times saturate), then its status and reason.
type statusEvent uint64

const maxEventAge = 1<<48 - 1

func newEvent(created, at tick, s kv.Status, why kv.Reason) statusEvent {
	age := uint64(min(max(at-created, 0), maxEventAge))
	return statusEvent(age<<16 | uint64(s)<<8 | uint64(why))
}

func (e statusEvent) at(created tick) tick { return created + tick(e>>16) }
func (e statusEvent) status() kv.Status    { return kv.Status(e >> 8) }
func (e statusEvent) reason() kv.Reason    { return kv.Reason(e) }

// sat is a+n, saturating at math.MaxInt32 (a count of a room's).
func sat(a int32, n int) int32 { return int32(min(int64(a)+int64(n), math.MaxInt32)) }

// xferRec is one posted transfer: a child span (the first nSpans entries,
// in posting order, kept when done) or, past them, a write in flight
// (removed when done). 32 bytes, no pointers: its bytes are its pages
// times the page size when they are counted (SetBytesPerPage).
type xferRec struct {
	start, end tick
	seq        uint32
	chunk      int32
	pages      int32
	agent      uint16 // index into agents()
	fail       kv.Reason
	flags      uint8 // xLast | xDone
}

const (
	xLast = 1 << iota
	xDone
)

func (x *xferRec) last() bool { return x.flags&xLast != 0 }
func (x *xferRec) done() bool { return x.flags&xDone != 0 }

// xfers is the record's transfer entries.
func (r *roomRec) xfers() []xferRec {
	if r.spill&spillX != 0 {
		return r.more.xfers
	}
	return r.xf[:r.nX]
}

// spans is the child spans' entries.
func (r *roomRec) spans() []xferRec { return r.xfers()[:r.nSpans] }

// agents is the distinct agents written to, in posting order.
func (r *roomRec) agents() []string {
	if r.spill&spillA != 0 {
		return r.more.agents
	}
	return r.agent0[:r.nAg]
}

// roomAgents is the agents that name the room: the first maxRoomAgents.
func (r *roomRec) roomAgents() []string {
	as := r.agents()
	return as[:min(len(as), maxRoomAgents)]
}

// agentOf is x's agent.
func (r *roomRec) agentOf(x *xferRec) string { return r.agents()[x.agent] }

// events is the status events.
func (r *roomRec) events() []statusEvent {
	if r.spill&spillE != 0 {
		return r.more.events
	}
	return r.evs[:r.nEv]
}

// extra is r.more, made on first use.
func (r *roomRec) extra() *recMore {
	if r.more == nil {
		r.more = new(recMore)
	}
	return r.more
}

// addXfer appends a zeroed entry and returns it, or nil if r holds
// maxXfers.
func (r *roomRec) addXfer() *xferRec {
	if r.spill&spillX == 0 && int(r.nX) < len(r.xf) {
		r.nX++
		x := &r.xf[r.nX-1]
		*x = xferRec{} // a recycled record holds old ones
		return x
	}
	return r.addXferMore()
}

// addXferMore is addXfer past the inline entries (the entry it returns is
// zeroed too).
func (r *roomRec) addXferMore() *xferRec {
	if r.spill&spillX == 0 {
		m := r.extra()
		m.xfers, r.spill = append(m.xfers[:0], r.xf[:]...), r.spill|spillX
	}
	m := r.more
	if len(m.xfers) >= maxXfers {
		return nil
	}
	m.xfers = append(m.xfers, xferRec{})
	r.nX = uint16(len(m.xfers))
	return &m.xfers[len(m.xfers)-1]
}

// dropXfer removes entry i (one past the spans) by moving the last there.
func (r *roomRec) dropXfer(i int) {
	xs := r.xfers()
	last := len(xs) - 1
	xs[i] = xs[last]
	r.nX--
	if r.spill&spillX != 0 {
		r.more.xfers = xs[:last]
	}
}

// addAgent appends a to agents.
func (r *roomRec) addAgent(a string) {
	if r.spill&spillA == 0 {
		if int(r.nAg) < len(r.agent0) {
			r.agent0[r.nAg] = a
			r.nAg++
			return
		}
		m := r.extra()
		m.agents, r.spill = append(m.agents[:0], r.agent0[:]...), r.spill|spillA
	}
	r.more.agents = append(r.more.agents, a)
	r.nAg = uint16(len(r.more.agents))
}

// addEvent appends e to events.
func (r *roomRec) addEvent(e statusEvent) {
	if r.spill&spillE == 0 && int(r.nEv) < len(r.evs) {
		r.evs[r.nEv] = e
		r.nEv++
		return
	}
	r.addEventMore(e)
}

// addEventMore is addEvent past the inline events.
func (r *roomRec) addEventMore(e statusEvent) {
	if r.spill&spillE == 0 {
		m := r.extra()
		m.events, r.spill = append(m.events[:0], r.evs[:]...), r.spill|spillE
	}
	r.more.events = append(r.more.events, e)
	r.nEv = uint8(len(r.more.events))
}

// agentIndex is a's index in agents, added if new. Only the first 16
// distinct agents name the room (roomAttrs); a child span's agent is added
// past them (always: span is true; maxSpans keeps them under
// maxSpanAgents). For an agent not added it is 0, which only entries that
// are no span get.
func (r *roomRec) agentIndex(a string, span bool) int {
	as := r.agents()
	for i := range as {
		if as[i] == a {
			return i
		}
	}
	if len(as) < maxRoomAgents || (span && len(as) < maxSpanAgents) {
		r.addAgent(a)
		return len(as)
	}
	return 0
}

// maxRoomAgents is how many agents name a room (kv_transfer.peer.agent).
const maxRoomAgents = 16

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
	cfg.MaxTransferSpans = min(cfg.MaxTransferSpans, maxSpans)
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
	o := &Observer{cfg: cfg, clk: cfg.Clock, start: time.Now(), base: cfg.Clock.Now(), stopped: make(chan struct{})}
	o.all = make([]stripe, numStripes)
	// MaxRooms shared out over capStripes stripes (a power of two), with
	// at least 1,024 records each, so that rooms counted on different
	// stripes seldom write one line; a small cap stays on one stripe.
	capStripes := 1
	for capStripes < numStripes && cfg.MaxRooms/(2*capStripes) >= 1024 {
		capStripes *= 2
	}
	o.capMask = capStripes - 1
	for i := range capStripes {
		n := cfg.MaxRooms / capStripes
		if i < cfg.MaxRooms%capStripes {
			n++
		}
		o.all[i].limit = int64(n)
	}
	_, o.real = cfg.Clock.(clock.Real)
	o.sampling = Sampling{Ratio: 1}
	if cfg.Sampling != nil {
		if err := cfg.Sampling.validate(); err != nil {
			return nil, err
		}
		o.sampling = *cfg.Sampling
	}
	o.bpp.Store(cfg.BytesPerPage)
	o.unt.o = o
	switch {
	case cfg.Exporter != nil:
		o.exp, o.ids = cfg.Exporter, newIDs()
		if o.cfg.Resource == nil {
			o.cfg.Resource = resource.Default()
		}
		o.common = spanCommon{resource: o.cfg.Resource, scope: instrumentation.Scope{Name: Scope}, base: o.base}
		o.reuse = cfg.ReuseSpans
	case cfg.Tracer != nil:
		o.tracer = cfg.Tracer.Tracer(Scope)
	}
	o.tracing = o.exp != nil || o.tracer != nil
	if o.tracing {
		o.queue, o.wake = make(chan parcel, 4), make(chan struct{}, 1)
		o.kept = make(chan *roomRec, cfg.QueueSize)
		o.wakeAt = max(cfg.QueueSize/4, 1)
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

// SetBytesPerPage changes the page size used for kv_transfer.bytes from now on
// (also for writes already posted and spans not yet built: a write's bytes
// are its pages times the page size when they are counted).
func (o *Observer) SetBytesPerPage(n int64) { o.bpp.Store(n) }

// Attach makes the daemon's pool and frame counters part of the metrics (read
// at scrape time).
func (o *Observer) Attach(s Source) { o.src.Store(&sourceBox{s}) }

// stripeIndex is the stripe of a room's metrics: the hash the engine uses
// to pick a room's directory shard (actors.Engine), so that with a shard
// count that divides numStripes (the default 4 × GOMAXPROCS does for
// GOMAXPROCS 1, 2, 4, 8 and 16) the rooms of one shard, whose goroutine
// runs them, share their stripes with no other shard's.
func stripeIndex(id uint64) int {
	return int((id * 0x9E3779B97F4A7C15) >> 32 & (numStripes - 1))
}

// stripe is the stripe of room id.
func (o *Observer) stripe(id uint64) *stripe { return &o.all[stripeIndex(id)] }

// capStripe is the stripe that counts room id's record toward MaxRooms.
func (o *Observer) capStripe(id uint64) *stripe { return &o.all[stripeIndex(id)&o.capMask] }

// inUse is the records in use, over the stripes (MaxRooms caps it).
func (o *Observer) inUse() int64 {
	var n int64
	for i := range o.all {
		n += o.all[i].inUse.Load()
	}
	return n
}

// WatchEngine implements actors.EngineWatcher: the live-room gauges are read
// from e at scrape time, and Close has e's live rooms hand their records over.
//
// An engine on another clock than the Observer's makes every record read the
// Observer's clock itself instead of sharing its step's reading.
func (o *Observer) WatchEngine(e *actors.Engine) {
	for {
		old := o.engines.Load()
		var next []*actors.Engine
		if old != nil {
			next = append(next, *old...)
		}
		next = append(next, e)
		if o.engines.CompareAndSwap(old, &next) {
			break
		}
	}
	if !sameClock(e.Clock(), o.clk) {
		o.ownClock.Store(true)
	}
}

// sameClock reports whether a and b are one clock (equal values of one
// comparable type: clock.Real, or the same *clock.Fake).
func sameClock(a, b clock.Clock) bool {
	ta := reflect.TypeOf(a)
	return ta != nil && ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

func (o *Observer) watched() []*actors.Engine {
	if p := o.engines.Load(); p != nil {
		return *p
	}
	return nil
}

// RoomCreated implements actors.Observer: a record for the room (a
// recycled one if any), or the untracked record once the room's share of
// MaxRooms is tracked (capStripe: with a large cap, a room may be untracked
// while another share has room).
func (o *Observer) RoomCreated(id uint64, at time.Time) actors.RoomObserver {
	st, cs := o.stripe(id), o.capStripe(id)
	if cs.inUse.Add(1) > cs.limit {
		cs.inUse.Add(-1)
		st.untracked.Add(1)
		return &o.unt
	}
	r, _ := o.pool.Get().(*roomRec)
	if r == nil {
		r = &roomRec{o: o}
		reset(r)
	}
	st.created.Add(1)
	var now tick
	if o.ownClock.Load() {
		now = o.now()
	} else {
		now = tick(at.Sub(o.base)) // the engine's reading, on this Observer's clock
	}
	r.begin(id, now)
	return r
}

// begin gives the reset record r to room id, created at t: its body is
// zeroed here, where the room is about to write it, rather than at the
// last room's retirement, whose line it is not.
func (r *roomRec) begin(id uint64, t tick) {
	r.id, r.created, r.statusAt, r.status = id, t, t, kv.StatusBootstrapping
	r.roomBody = roomBody{}
}

// reset empties r for reuse. It writes only what the room used: the head,
// and the rare counters, the overflow lists and the parent only if the room
// wrote them; the body is zeroed by begin (the inline entries need no
// clearing: they hold no pointers, and are overwritten before use). The
// first agent's name stays until the record's next room names one: a
// decode agent's, and pooled records go at the collector's next cycles.
func reset(r *roomRec) {
	if r.spill != 0 {
		r.more.trim()
	}
	if r.rare {
		r.rareState = rareState{}
	}
	if r.hasParent {
		r.parent = trace.SpanContext{}
	}
	r.clk, r.roomHead = noSteps, roomHead{}
}

// trim empties m, keeping buffers of up to maxKeptMore entries.
func (m *recMore) trim() {
	clear(m.agents)
	m.xfers, m.agents, m.events = keep(m.xfers), keep(m.agents), keep(m.events)
}

func keep[T any](s []T) []T {
	if cap(s) > maxKeptMore {
		return nil
	}
	return s[:0]
}

// recycle resets r and keeps it for another room; it no longer counts
// toward MaxRooms.
func (o *Observer) recycle(r *roomRec) {
	cs := o.capStripe(r.id)
	reset(r)
	o.pool.Put(r)
	cs.inUse.Add(-1)
}

// Ignored implements actors.Observer: a message a tombstone (or nobody)
// absorbed.
func (o *Observer) Ignored(id uint64, msg room.Msg) {
	k := msgIndex(msg)
	st := o.stripe(id)
	st.absorbed[k][1].Add(1)
}

// LateTransferDone implements actors.Observer: a write that completed after
// its room retired is counted.
func (o *Observer) LateTransferDone(id uint64, _ uint32, fail kv.Reason) {
	st := o.stripe(id)
	if fail == kv.ReasonNone {
		st.xferOK.Add(1)
	} else {
		st.xferFailed.Add(1)
	}
}

// TombstoneEvicted implements actors.Observer. Once the shards hold their
// cap of tombstones every retiring room evicts one: it is counted on the
// room's stripe, not on a counter every shard's core writes.
func (o *Observer) TombstoneEvicted(id uint64) {
	st := o.stripe(id)
	st.evicted.Add(1)
}

// RoomRefused implements actors.RefusalObserver.
func (o *Observer) RoomRefused(_ uint64, peerShare bool) {
	if peerShare {
		o.refusedShare.Add(1)
	} else {
		o.refusedCap.Add(1)
	}
}

// Step implements actors.RoomObserver: the step's facts, in their order.
func (r *roomRec) Step(msg room.Msg, fx room.Effects) {
	if fx.Info.Seen {
		r.transferInfo(fx.Info.Required)
	}
	if !fx.Done.Seen && len(fx.Posts) == 0 && !fx.Published && !fx.Retire {
		if fx.Ignored {
			r.absorb(msg)
		}
		return
	}
	// The step's facts share its time and the room's stripe.
	now, st := r.now(), r.o.stripe(r.id)
	if fx.Done.Seen {
		r.transferDone(st, now, fx.Done.Seq, fx.Done.Fail)
	}
	for i := range fx.Posts {
		r.posted(st, now, &fx.Posts[i])
	}
	if fx.Published {
		r.statusChanged(st, now, fx.Status, fx.Reason)
	}
	if fx.Ignored && !fx.Retire {
		r.absorb(msg)
	}
	if fx.Retire {
		r.retire(st, now, fx.Tomb)
	}
}

// BindSteps implements actors.RoomObserver: the callbacks of one step of
// the room's actor are handled at one time: they share one clock reading
// (the first that one of them needs), as reading the clock is about a
// quarter of a room's bookkeeping otherwise. A write that completes within
// the step that posted it (inside Transfers.Post) thus lasts 0.
func (r *roomRec) BindSteps(c *actors.StepClock) { r.clk = c }

// now is the time of the room's current step (its actor's StepClock: one
// reading of the engine's clock per step, which the deadlines the step arms
// share, or with the engine on another clock one reading of the
// Observer's), or the Observer's clock outside a step.
func (r *roomRec) now() tick {
	if d, ok := r.clk.Since0(); ok {
		return tick(d)
	}
	return r.nowFirst()
}

// nowFirst is now at a step's first call (or outside a step).
func (r *roomRec) nowFirst() tick {
	o := r.o
	var own clock.Clock
	if o.ownClock.Load() {
		own = o.clk
	}
	if d, in := r.clk.Since(o.base, own); in {
		return tick(d)
	}
	return o.now()
}

// noSteps is the step clock of a record until its actor binds its own: it
// is never in a step (and so never written).
var noSteps = actors.NewStepClock(clock.Real{})

// Traceparent implements actors.RoomObserver: the room's span joins that
// trace. Invalid values are ignored (counted).
func (r *roomRec) Traceparent(traceparent string) {
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": traceparent}))
	if !sc.IsValid() {
		r.o.badTraceparents.Add(1)
		return
	}
	r.parent, r.hasParent, r.parentSampled = sc, true, sc.IsSampled()
}

// transferInfo records the room's required_dst_info_num (decode agents are
// recorded as transfers are posted).
func (r *roomRec) transferInfo(required int) {
	r.required = uint16(min(max(required, 0), math.MaxUint16))
}

// statusChanged records a published status change.
func (r *roomRec) statusChanged(st *stripe, now tick, s kv.Status, why kv.Reason) {
	o := r.o
	ri, si := reasonIndex(why), statusIndex(r.status)
	if s == kv.StatusFailed {
		st.failures[ri].Add(1)
	}
	st.observe(si, time.Duration(now-r.statusAt), statusBoundsNs)
	r.status, r.reason, r.statusAt = s, why, now
	if s.Terminal() {
		r.terminal = true
	}
	if o.tracing {
		if int(r.nEv) < o.cfg.MaxEvents {
			r.addEvent(newEvent(r.created, now, s, why))
		} else {
			r.rare = true
			r.droppedEvents++
		}
	}
}

// posted records a transfer posted.
func (r *roomRec) posted(st *stripe, now tick, t *kv.Transfer) {
	o := r.o
	pages := len(t.SrcPages)
	st.posted.Add(1)
	r.transfers = sat(r.transfers, 1)
	r.pages = sat(r.pages, pages)
	if c := int32(min(t.Chunk, math.MaxInt32-1)) + 1; c > r.chunks {
		r.chunks = c
	}
	x := r.addXfer()
	if x == nil { // past maxXfers, so past the spans too
		if o.tracing {
			r.rare = true
			r.droppedSpans++
		}
		return
	}
	*x = xferRec{seq: t.Seq, start: now, pages: int32(min(pages, math.MaxInt32))}
	if o.tracing {
		r.addSpan(x, t)
	}
}

// addSpan makes x, just added for t, a child span if r has room for one
// (the spans are the first entries: entries past them are only made once
// the spans are full, or without tracing). The room's agents are recorded
// either way.
func (r *roomRec) addSpan(x *xferRec, t *kv.Transfer) {
	span := int(r.nSpans) < r.o.cfg.MaxTransferSpans
	agent := 0 // the first agent, as most rooms' every transfer
	if r.nAg == 0 || r.spill&spillA != 0 || r.agent0[0] != t.Agent {
		agent = r.agentIndex(t.Agent, span)
	}
	if !span {
		r.rare = true
		r.droppedSpans++
		return
	}
	r.nSpans++
	x.chunk, x.agent = int32(t.Chunk), uint16(agent)
	if t.Last {
		x.flags = xLast
	}
}

// transferDone records a transfer's completion.
func (r *roomRec) transferDone(st *stripe, now tick, seq uint32, fail kv.Reason) {
	ok := fail == kv.ReasonNone
	if !ok {
		r.rare = true
		r.failedX++
	}
	found := false
	var start tick
	var bytes int64
	xs := r.xfers()
	for i := len(xs) - 1; i >= 0; i-- {
		x := &xs[i]
		if x.seq != seq || x.done() {
			continue
		}
		found, start, bytes = true, x.start, int64(x.pages)*r.o.bpp.Load()
		if i < int(r.nSpans) {
			x.end, x.fail, x.flags = now, fail, x.flags|xDone
		} else {
			r.dropXfer(i)
		}
		if ok {
			r.bytes += bytes
		} else {
			r.bytesFailed += bytes
		}
		break
	}
	if ok {
		st.xferOK.Add(1)
	} else {
		st.xferFailed.Add(1)
	}
	if found {
		st.observe(xferHist, time.Duration(now-start), transferBoundsNs)
		if ok {
			st.bytesOK.Add(bytes)
		} else {
			st.bytesFailed.Add(bytes)
		}
	}
}

// absorb counts a message the live room absorbed.
func (r *roomRec) absorb(msg room.Msg) {
	r.rare = true
	r.ignored++
	k := msgIndex(msg)
	st := r.o.stripe(r.id)
	st.absorbed[k][0].Add(1)
}

// retire closes the record (t: the room's tombstone), and hands it to the
// emitter if the tail sampler keeps the room.
func (r *roomRec) retire(st *stripe, now tick, t room.Tombstone) {
	o := r.o
	ti, si := statusIndex(t.Status), statusIndex(r.status)
	d := time.Duration(now - r.statusAt)
	r.status, r.reason, r.retiredAt, r.retired = t.Status, t.Reason, now, true
	keep := dropSampled
	if o.tracing {
		keep = o.sampling.decide(r)
	}
	st.released.Add(1)
	st.retired[ti].Add(1)
	st.observe(si, d, statusBoundsNs)
	if o.tracing {
		st.decisions[keep].Add(1)
	}
	if keep == dropSampled || o.closed.Load() {
		o.recycle(r)
		return
	}
	r.keep = keep
	select {
	case o.kept <- r:
	default:
		o.queueFull.Add(1)
		o.recycle(r)
		return
	}
	if len(o.kept) >= o.wakeAt {
		select {
		case o.wake <- struct{}{}:
		default: // already woken
		}
	}
}

// Abandoned implements actors.RoomObserver: the room is still live, but its
// engine stopped or the Observer is closing; Close emits it (marked not
// retired), ended when it was handed over.
func (r *roomRec) Abandoned() {
	o := r.o
	st := r.o.stripe(r.id)
	st.released.Add(1)
	if !o.tracing || o.closed.Load() {
		o.recycle(r)
		return
	}
	r.retiredAt = r.now()
	o.abandonedMu.Lock()
	o.abandoned = append(o.abandoned, r)
	o.abandonedMu.Unlock()
}

// takeAbandoned returns the abandoned records, oldest first, and forgets them.
func (o *Observer) takeAbandoned() []*roomRec {
	o.abandonedMu.Lock()
	defer o.abandonedMu.Unlock()
	recs := o.abandoned
	o.abandoned = nil
	return recs
}

// untracked is the record of every room over MaxRooms: it
// keeps nothing of the room and counts what the aggregate metrics need.
type untracked struct {
	o *Observer
}

// count adds 1 to the counter that c picks of the first stripe (untracked
// rooms are not told apart).
func (u *untracked) count(c func(*stripe) *atomic.Int64) {
	c(&u.o.all[0]).Add(1)
}

func (u *untracked) Traceparent(string) {}

// Step implements actors.RoomObserver.
func (u *untracked) Step(msg room.Msg, fx room.Effects) {
	if fx.Done.Seen {
		if fx.Done.Fail == kv.ReasonNone {
			u.count(func(st *stripe) *atomic.Int64 { return &st.xferOK })
		} else {
			u.count(func(st *stripe) *atomic.Int64 { return &st.xferFailed })
		}
	}
	for range fx.Posts {
		u.count(func(st *stripe) *atomic.Int64 { return &st.posted })
	}
	if fx.Published && fx.Status == kv.StatusFailed {
		ri := reasonIndex(fx.Reason)
		u.count(func(st *stripe) *atomic.Int64 { return &st.failures[ri] })
	}
	if fx.Ignored && !fx.Retire {
		k := msgIndex(msg)
		u.count(func(st *stripe) *atomic.Int64 { return &st.absorbed[k][1] })
	}
	if fx.Retire {
		si := statusIndex(fx.Tomb.Status)
		u.count(func(st *stripe) *atomic.Int64 { return &st.retired[si] })
	}
}

func (u *untracked) Abandoned()                  {}
func (u *untracked) BindSteps(*actors.StepClock) {}

// parcel is what the emitter receives: a Flush or Close barrier.
type parcel struct {
	barrier chan struct{}
}

// collect takes the kept rooms handed over so far.
func (o *Observer) collect() []*roomRec {
	n := len(o.kept) // not those that come meanwhile: the next collect's
	recs := make([]*roomRec, 0, n)
	for range n {
		recs = append(recs, <-o.kept)
	}
	return recs
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

// Close stops the emitter after the rooms already retired, then emits a span
// for every room still live (attribute kv_transfer.retired=false), ended when
// its record was handed over: the live rooms of every engine it observes
// hand their records over first (actors.Engine.AbandonRecords; an engine
// that stopped already did). It returns ctx's error if ctx ends first.
func (o *Observer) Close(ctx context.Context) error {
	if o.closed.Load() {
		return errors.New("telemetry: observer already closed")
	}
	if o.tracing {
		done := make(chan struct{})
		go func() {
			defer close(done)
			for _, e := range o.watched() {
				e.AbandonRecords()
			}
		}()
		select {
		case <-done:
		case <-ctx.Done():
			o.closed.Store(true)
			return ctx.Err()
		}
	}
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
	for _, r := range o.collect() { // retired, kept, not yet emitted
		o.emit(r)
	}
	for _, r := range o.takeAbandoned() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if r.keep = o.sampling.decide(r); r.keep != dropSampled {
			o.emit(r)
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
			emit(o.collect())
			if o.exp != nil {
				o.export(context.Background())
			}
			close(p.barrier)
			if o.closed.Load() {
				return
			}
		case <-o.wake: // build them now; export when a batch is full
			emit(o.collect())
			if len(o.kept) >= o.wakeAt {
				// More came meanwhile: once more, after whatever else is due.
				select {
				case o.wake <- struct{}{}:
				default:
				}
			}
		case <-tick.C:
			emit(o.collect())
			if o.exp != nil {
				o.export(context.Background())
			}
		}
	}
}

// live sums the watched engines' live rooms (what each room last reported to
// its shard), and the age of the oldest that is neither Success nor Failed.
func (o *Observer) live() (byStatus [numStatuses]int64, nonTerminal int, oldest time.Duration) {
	var first time.Time
	for _, e := range o.watched() {
		l := e.Live()
		for s := range min(len(l.ByStatus), numStatuses) {
			byStatus[s] += int64(l.ByStatus[s])
		}
		if l.NonTerminal > 0 && (nonTerminal == 0 || l.OldestNonTerminal.Before(first)) {
			first = l.OldestNonTerminal
		}
		nonTerminal += l.NonTerminal
	}
	if nonTerminal > 0 {
		oldest = max(o.clk.Now().Sub(first), 0)
	}
	return byStatus, nonTerminal, oldest
}
