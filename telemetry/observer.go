package telemetry

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
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

	numShards = 64
)

// Config configures an Observer. The zero value observes metrics only.
type Config struct {
	// Tracer, when set, receives one kv_transfer.room span per kept room. It
	// must not sample spans away itself (use sdktrace.AlwaysSample): the
	// Observer samples at retirement.
	Tracer trace.TracerProvider
	// Sampling is the tail-sampling policy; nil keeps every room.
	Sampling *Sampling
	// BytesPerPage converts pages to kv_transfer.bytes (KV bytes of one page
	// over all layers of this rank). 0 leaves bytes at 0; SetBytesPerPage
	// can change it later, e.g. once the scheduler registered memory.
	BytesPerPage int64
	// MaxRooms caps the live rooms tracked (default DefaultMaxRooms).
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
}

// Observer implements actors.Observer (rooms → spans and metrics) and the OTel
// metric SDK's Producer (metrics, aggregated at read time).
type Observer struct {
	cfg    Config
	clk    clock.Clock
	tracer trace.Tracer // nil: tracing off
	bpp    atomic.Int64
	start  time.Time

	sampling Sampling

	shards  [numShards]shard
	tracked atomic.Int64

	m   counters
	src atomic.Pointer[sourceBox]

	queue   chan *roomRec
	closed  atomic.Bool
	stopped chan struct{}
	recs    sync.Pool
}

var _ actors.Observer = (*Observer)(nil)

type sourceBox struct{ s Source }

type shard struct {
	mu    sync.Mutex
	rooms map[uint64]*roomRec
	_     [40]byte // keep neighbouring shards' locks off one cache line
}

// roomRec is what the Observer keeps of one live room until it retires.
type roomRec struct {
	id         uint64
	created    time.Time
	statusAt   time.Time // when the current status was entered
	terminalAt time.Time
	retiredAt  time.Time
	status     room.Status
	reason     room.Reason
	retired    bool // false: emitted at Close while still live
	parent     trace.SpanContext

	events        []statusEvent
	droppedEvents int
	spans         []xferRec // child spans, up to MaxTransferSpans
	droppedSpans  int
	inflight      []inflightRec
	agents        []string

	chunks    int
	transfers int
	pages     int64
	bytes     int64 // successfully written
	failedX   int
	ignored   int

	keep    keepReason
	barrier chan struct{} // a Flush barrier, not a room
}

type statusEvent struct {
	at     time.Time
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
	start, end time.Time
	fail       room.Reason
	done       bool
}

type inflightRec struct {
	seq   uint32
	pages int
	bytes int64
	start time.Time
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
	o := &Observer{cfg: cfg, clk: cfg.Clock, start: cfg.Clock.Now(), stopped: make(chan struct{})}
	o.sampling = Sampling{Ratio: 1}
	if cfg.Sampling != nil {
		if err := cfg.Sampling.validate(); err != nil {
			return nil, err
		}
		o.sampling = *cfg.Sampling
	}
	o.bpp.Store(cfg.BytesPerPage)
	for i := range o.shards {
		o.shards[i].rooms = map[uint64]*roomRec{}
	}
	o.recs.New = func() any { return &roomRec{} }
	o.m.init()
	if cfg.Tracer != nil {
		o.tracer = cfg.Tracer.Tracer("github.com/kvxfer/kvxfer/telemetry")
		o.queue = make(chan *roomRec, cfg.QueueSize)
		go o.emitLoop()
	} else {
		close(o.stopped)
	}
	return o, nil
}

// SetBytesPerPage changes the page size used for kv_transfer.bytes from now on.
func (o *Observer) SetBytesPerPage(n int64) { o.bpp.Store(n) }

// Attach makes the daemon's pool and frame counters part of the metrics (read
// at scrape time).
func (o *Observer) Attach(s Source) { o.src.Store(&sourceBox{s}) }

func (o *Observer) shardOf(id uint64) *shard {
	return &o.shards[(id*0x9E3779B97F4A7C15)>>58]
}

// newRec makes a record for a room first seen now; nil when over the cap.
// The caller holds the shard lock.
func (o *Observer) newRec(sh *shard, id uint64, now time.Time) *roomRec {
	if o.tracked.Add(1) > int64(o.cfg.MaxRooms) {
		o.tracked.Add(-1)
		o.m.untracked.Add(1)
		return nil
	}
	r := o.recs.Get().(*roomRec)
	r.id, r.created, r.statusAt, r.status = id, now, now, room.Bootstrapping
	sh.rooms[id] = r
	o.m.created.Add(1)
	o.m.live[room.Bootstrapping].Add(1)
	return r
}

func (o *Observer) release(r *roomRec) {
	ev, sp, in, ag := r.events[:0], r.spans[:0], r.inflight[:0], r.agents[:0]
	clear(r.spans[:cap(r.spans)])   // drop agent strings
	clear(r.agents[:cap(r.agents)]) // likewise
	*r = roomRec{events: ev, spans: sp, inflight: in, agents: ag}
	if cap(r.spans) > 32 {
		r.spans = nil
	}
	o.recs.Put(r)
}

// RoomCreated implements actors.Observer.
func (o *Observer) RoomCreated(id uint64) {
	now := o.clk.Now()
	sh := o.shardOf(id)
	sh.mu.Lock()
	if _, ok := sh.rooms[id]; !ok { // else a traceparent came first: keep its time
		o.newRec(sh, id, now)
	}
	sh.mu.Unlock()
}

// Traceparent implements actors.Observer: the room's span joins that trace.
// Invalid values are ignored (counted).
func (o *Observer) Traceparent(id uint64, traceparent string) {
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": traceparent}))
	if !sc.IsValid() {
		o.m.badTraceparents.Add(1)
		return
	}
	now := o.clk.Now()
	sh := o.shardOf(id)
	sh.mu.Lock()
	r := sh.rooms[id]
	if r == nil {
		r = o.newRec(sh, id, now)
	}
	if r != nil {
		r.parent = sc
	}
	sh.mu.Unlock()
}

// StatusChanged implements actors.Observer.
func (o *Observer) StatusChanged(id uint64, s room.Status, why room.Reason) {
	now := o.clk.Now()
	if s == room.Failed {
		o.m.failures[reasonIndex(why)].Add(1)
	}
	sh := o.shardOf(id)
	sh.mu.Lock()
	r := sh.rooms[id]
	if r == nil { // a tombstone revived by an Open is not created again
		if r = o.newRec(sh, id, now); r == nil {
			sh.mu.Unlock()
			return
		}
	} else {
		o.m.statusDur[statusIndex(r.status)].observe(now.Sub(r.statusAt))
	}
	o.m.live[statusIndex(r.status)].Add(-1)
	o.m.live[statusIndex(s)].Add(1)
	r.status, r.reason, r.statusAt = s, why, now
	if s.Terminal() && r.terminalAt.IsZero() {
		r.terminalAt = now
	}
	if o.tracer != nil {
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
	now := o.clk.Now()
	pages := len(t.SrcPages)
	bytes := int64(pages) * o.bpp.Load()
	o.m.posted.Add(1)
	sh := o.shardOf(t.Room)
	sh.mu.Lock()
	r := sh.rooms[t.Room]
	if r == nil {
		sh.mu.Unlock()
		return
	}
	r.transfers++
	r.pages += int64(pages)
	if t.Chunk+1 > r.chunks {
		r.chunks = t.Chunk + 1
	}
	span := -1
	if o.tracer != nil {
		if len(r.spans) < o.cfg.MaxTransferSpans {
			span = len(r.spans)
			r.spans = append(r.spans, xferRec{seq: t.Seq, chunk: t.Chunk, last: t.Last, agent: t.Agent, pages: pages, bytes: bytes, start: now})
		} else {
			r.droppedSpans++
		}
		if len(r.agents) < 16 && !contains(r.agents, t.Agent) {
			r.agents = append(r.agents, t.Agent)
		}
	}
	r.inflight = append(r.inflight, inflightRec{seq: t.Seq, pages: pages, bytes: bytes, start: now, span: span})
	sh.mu.Unlock()
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
	now := o.clk.Now()
	if fail == room.ReasonNone {
		o.m.transfersOK.Add(1)
	} else {
		o.m.transfersFailed.Add(1)
	}
	sh := o.shardOf(id)
	sh.mu.Lock()
	r := sh.rooms[id]
	if r == nil {
		sh.mu.Unlock()
		return
	}
	for i := len(r.inflight) - 1; i >= 0; i-- {
		in := r.inflight[i]
		if in.seq != seq {
			continue
		}
		last := len(r.inflight) - 1
		r.inflight[i] = r.inflight[last]
		r.inflight = r.inflight[:last]
		o.m.xferDur.observe(now.Sub(in.start))
		if fail == room.ReasonNone {
			r.bytes += in.bytes
			o.m.bytesOK.Add(in.bytes)
		} else {
			r.failedX++
			o.m.bytesFailed.Add(in.bytes)
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
	r := sh.rooms[id]
	if r != nil {
		r.ignored++
	}
	sh.mu.Unlock()
	if r != nil {
		o.m.absorbed[k][0].Add(1)
	} else {
		o.m.absorbed[k][1].Add(1)
	}
}

// TombstoneEvicted implements actors.Observer.
func (o *Observer) TombstoneEvicted(uint64) { o.m.evicted.Add(1) }

// RoomRetired implements actors.Observer: the room's record is closed, and
// its spans are emitted if the tail sampler keeps it.
func (o *Observer) RoomRetired(t room.Tombstone) {
	now := o.clk.Now()
	sh := o.shardOf(t.Room)
	sh.mu.Lock()
	r := sh.rooms[t.Room]
	if r != nil {
		delete(sh.rooms, t.Room)
	}
	sh.mu.Unlock()
	o.m.retired[statusIndex(t.Status)].Add(1)
	if r == nil {
		return
	}
	o.tracked.Add(-1)
	o.m.statusDur[statusIndex(r.status)].observe(now.Sub(r.statusAt))
	o.m.live[statusIndex(r.status)].Add(-1)
	r.status, r.reason, r.retiredAt, r.retired = t.Status, t.Reason, now, true
	o.finish(r)
}

// finish decides whether r's spans are emitted and hands it to the emitter.
func (o *Observer) finish(r *roomRec) {
	if o.tracer == nil {
		o.release(r)
		return
	}
	r.keep = o.sampling.decide(r)
	o.m.decisions[r.keep].Add(1)
	if r.keep == dropSampled || o.closed.Load() {
		o.release(r)
		return
	}
	select {
	case o.queue <- r:
	default:
		o.m.decisions[keepReason(dropQueueFull)].Add(1)
		o.release(r)
	}
}

// Flush waits until every room retired so far has had its spans handed to
// the TracerProvider (whose own batching is flushed by ForceFlush).
func (o *Observer) Flush(ctx context.Context) error {
	if o.tracer == nil || o.closed.Load() {
		return nil
	}
	b := &roomRec{barrier: make(chan struct{})}
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
	if o.tracer == nil {
		return nil
	}
	b := &roomRec{barrier: make(chan struct{})}
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
	now := o.clk.Now()
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.Lock()
		live := make([]*roomRec, 0, len(sh.rooms))
		for id, r := range sh.rooms {
			live = append(live, r)
			delete(sh.rooms, id)
		}
		sh.mu.Unlock()
		for _, r := range live {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			o.tracked.Add(-1)
			r.retiredAt = now
			if r.keep = o.sampling.decide(r); r.keep != dropSampled {
				o.emit(r)
			}
			o.m.decisions[r.keep].Add(1)
		}
	}
	return nil
}

func (o *Observer) emitLoop() {
	defer close(o.stopped)
	for r := range o.queue {
		if r.barrier != nil {
			close(r.barrier)
			if o.closed.Load() {
				return
			}
			continue
		}
		o.emit(r)
		o.release(r)
	}
}

// oldestNonTerminal returns the age of the oldest tracked room that is not
// Success or Failed, and how many such rooms there are.
func (o *Observer) oldestNonTerminal(now time.Time) (time.Duration, int) {
	var oldest time.Time
	n := 0
	for i := range o.shards {
		sh := &o.shards[i]
		sh.mu.Lock()
		for _, r := range sh.rooms {
			if r.status.Terminal() {
				continue
			}
			n++
			if oldest.IsZero() || r.created.Before(oldest) {
				oldest = r.created
			}
		}
		sh.mu.Unlock()
	}
	if n == 0 {
		return 0, 0
	}
	return now.Sub(oldest), n
}
