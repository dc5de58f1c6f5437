package telemetry

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"math/rand/v2"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvxfer/kvxfer/kv"
)

// Span and event names.
const (
	RoomSpan     = "kv_transfer.room"
	TransferSpan = "kv_transfer.transfer"
	StatusEvent  = "kv_transfer.status"
)

// Attribute keys. pd.* and kv_transfer.* are kvxfer-defined (there is no
// semantic convention for KV-cache transfer); error.type is the OTel one.
const (
	AttrBootstrapRoom   = attribute.Key("pd.bootstrap_room")
	AttrRole            = attribute.Key("pd.role")
	AttrBackend         = attribute.Key("kv_transfer.backend")
	AttrPeerAgent       = attribute.Key("kv_transfer.peer.agent")
	AttrChunks          = attribute.Key("kv_transfer.chunks")
	AttrRequired        = attribute.Key("kv_transfer.required_dst_info_num")
	AttrTransfers       = attribute.Key("kv_transfer.transfers")
	AttrFailedTransfers = attribute.Key("kv_transfer.transfers.failed")
	AttrPages           = attribute.Key("kv_transfer.pages")
	AttrBytes           = attribute.Key("kv_transfer.bytes")
	AttrStatus          = attribute.Key("kv_transfer.status")
	AttrIgnored         = attribute.Key("kv_transfer.ignored_messages")
	AttrRetired         = attribute.Key("kv_transfer.retired")
	AttrSampled         = attribute.Key("kv_transfer.sampling")
	AttrDroppedSpans    = attribute.Key("kv_transfer.transfer_spans.dropped")
	AttrDroppedEvents   = attribute.Key("kv_transfer.status_events.dropped")
	AttrChunk           = attribute.Key("kv_transfer.chunk")
	AttrLast            = attribute.Key("kv_transfer.last")
	AttrSeq             = attribute.Key("kv_transfer.seq")
	AttrAbandoned       = attribute.Key("kv_transfer.abandoned")
	AttrErrorType       = attribute.Key("error.type")
)

var (
	roleAttr     = AttrRole.String("prefill")
	backendAttr  = AttrBackend.String("nixl")
	statusAttrs  [numStatuses]attribute.KeyValue
	errAttrs     [numReasons]attribute.KeyValue
	decideAttrs  [numDecisions]attribute.KeyValue
	lastAttrs    = [2]attribute.KeyValue{AttrLast.Bool(false), AttrLast.Bool(true)}
	abandonAttr  = AttrAbandoned.Bool(true)
	notRetired   = AttrRetired.Bool(false)
	abandonedMsg = "in flight when the room retired"
)

func init() {
	for s := range statusAttrs {
		statusAttrs[s] = AttrStatus.String(kv.Status(s).String())
	}
	for r := range errAttrs {
		errAttrs[r] = AttrErrorType.String(kv.Reason(r).String())
	}
	for d := range decideAttrs {
		decideAttrs[d] = AttrSampled.String(keepReason(d).String())
	}
}

func errAttr(r kv.Reason) attribute.KeyValue {
	if int(r) < len(errAttrs) {
		return errAttrs[r]
	}
	return AttrErrorType.String(r.String())
}

// roomAttrCount is len(roomAttrs(r)).
func roomAttrCount(r *roomRec) int {
	return 9 + b2i(r.required > 0) + b2i(r.nAg > 0) + b2i(r.failedX > 0) + b2i(r.ignored > 0) + b2i(r.droppedSpans > 0) +
		b2i(r.droppedEvents > 0) + b2i(!r.retired) + b2i(r.status == kv.StatusFailed)
}

// xferAttrMax bounds len(xferAttrs(...)).
const xferAttrMax = 7

// roomAttrs appends the room span's attributes, all known at retirement.
// agents, if valid, is the kv_transfer.peer.agent attribute of r.agents.
func roomAttrs(a []attribute.KeyValue, r *roomRec, agents attribute.KeyValue) []attribute.KeyValue {
	a = append(a, AttrBootstrapRoom.Int64(int64(r.id)), roleAttr, backendAttr, statusAttrs[statusIndex(r.status)],
		AttrChunks.Int(int(r.chunks)), AttrTransfers.Int(int(r.transfers)), AttrPages.Int64(int64(r.pages)), AttrBytes.Int64(r.bytes),
		decideAttrs[r.keep])
	if r.required > 0 {
		a = append(a, AttrRequired.Int(int(r.required)))
	}
	if r.nAg > 0 {
		if !agents.Valid() {
			agents = AttrPeerAgent.StringSlice(r.roomAgents())
		}
		a = append(a, agents)
	}
	if r.failedX > 0 {
		a = append(a, AttrFailedTransfers.Int(int(r.failedX)))
	}
	if r.ignored > 0 {
		a = append(a, AttrIgnored.Int(int(r.ignored)))
	}
	if r.droppedSpans > 0 {
		a = append(a, AttrDroppedSpans.Int(int(r.droppedSpans)))
	}
	if r.droppedEvents > 0 {
		a = append(a, AttrDroppedEvents.Int(int(r.droppedEvents)))
	}
	if !r.retired {
		a = append(a, notRetired)
	}
	if r.status == kv.StatusFailed {
		a = append(a, errAttr(r.reason))
	}
	return a
}

func roomStatus(r *roomRec) sdktrace.Status {
	if r.status == kv.StatusFailed {
		return sdktrace.Status{Code: codes.Error, Description: r.reason.String()}
	}
	return sdktrace.Status{}
}

// xferAttrs appends one transfer span's attributes; it returns them, its end
// and its status.
func xferAttrs(a []attribute.KeyValue, r *roomRec, x *xferRec, bytesPerPage int64) ([]attribute.KeyValue, tick, sdktrace.Status) {
	a = append(a, AttrPeerAgent.String(r.agentOf(x)), AttrChunk.Int(int(x.chunk)), lastAttrs[b2i(x.last())],
		AttrSeq.Int64(int64(x.seq)), AttrPages.Int(int(x.pages)), AttrBytes.Int64(int64(x.pages)*bytesPerPage))
	switch {
	case !x.done(): // still in flight when the room retired (drain deadline expired)
		return append(a, abandonAttr), r.retiredAt, sdktrace.Status{Code: codes.Error, Description: abandonedMsg}
	case x.fail != kv.ReasonNone:
		return append(a, errAttr(x.fail)), x.end, sdktrace.Status{Code: codes.Error, Description: x.fail.String()}
	}
	return a, x.end, sdktrace.Status{}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func statusEventAttrs(e statusEvent) []attribute.KeyValue {
	s := statusIndex(e.status())
	if e.status() == kv.StatusFailed {
		return []attribute.KeyValue{statusAttrs[s], errAttr(e.reason())}
	}
	return statusAttrs[s : s+1 : s+1]
}

// emit turns a finished room record into its spans. It runs on the emitter
// goroutine (or in Close once the emitter stopped), never on an actor.
func (o *Observer) emit(r *roomRec) {
	if o.exp != nil {
		o.build(r)
		return
	}
	o.emitAPI(r)
}

// emitAPI goes through the trace API (any TracerProvider), with the real
// times given by trace.WithTimestamp.
func (o *Observer) emitAPI(r *roomRec) {
	bpp := o.bpp.Load()
	ctx := context.Background()
	if r.parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, r.parent)
	}
	ctx, sp := o.tracer.Start(ctx, RoomSpan, trace.WithTimestamp(o.wall(r.created)), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(roomAttrs(nil, r, attribute.KeyValue{})...))
	events := r.events()
	for i := range events {
		e := events[i]
		sp.AddEvent(StatusEvent, trace.WithTimestamp(o.wall(e.at(r.created))), trace.WithAttributes(statusEventAttrs(e)...))
	}
	spans := r.spans()
	for i := range spans {
		attrs, end, st := xferAttrs(nil, r, &spans[i], bpp)
		_, c := o.tracer.Start(ctx, TransferSpan, trace.WithTimestamp(o.wall(spans[i].start)), trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attrs...))
		if st.Code == codes.Error {
			c.SetStatus(st.Code, st.Description)
		}
		c.End(trace.WithTimestamp(o.wall(end)))
	}
	if st := roomStatus(r); st.Code == codes.Error {
		sp.SetStatus(st.Code, st.Description)
	}
	sp.End(trace.WithTimestamp(o.wall(r.retiredAt)))
}

// exportBatch is the direct path's batch: finished spans built as read-only
// snapshots and handed to the exporter without the SDK's span machinery
// (about a tenth of its cost per span; the Observer already buffers whole
// rooms, which is what a batch span processor would do).
const exportBatch = 512

// ids generates trace and span ids for the direct path; only the emitter
// goroutine (or Close, after it stopped) uses it.
type ids struct{ r *rand.ChaCha8 }

func newIDs() ids {
	var seed [32]byte
	_, _ = crand.Read(seed[:])
	return ids{rand.NewChaCha8(seed)}
}

func (g ids) span() trace.SpanID {
	var s trace.SpanID
	for s == (trace.SpanID{}) {
		binary.LittleEndian.PutUint64(s[:], g.r.Uint64())
	}
	return s
}

func (g ids) trace() trace.TraceID {
	var t trace.TraceID
	for t == (trace.TraceID{}) {
		binary.LittleEndian.PutUint64(t[:8], g.r.Uint64())
		binary.LittleEndian.PutUint64(t[8:], g.r.Uint64())
	}
	return t
}

// spanArena is the memory of one batch's spans when the exporter keeps
// nothing after ExportSpans returns (Config.ReuseSpans): a batch's spans,
// attributes and events are cut from it, and export empties it once the
// exporter has returned. A slab that runs out is replaced by a bigger one;
// spans already cut from the old one keep it alive until the export, and
// from then on the bigger one serves every batch.
type spanArena struct {
	recs   []spanRecord
	attrs  []attribute.KeyValue
	events []sdktrace.Event
}

// take returns n fresh elements of *slab (len n, cap n), growing it if full.
func take[T any](slab *[]T, n int) []T {
	s := *slab
	if len(s)+n > cap(s) {
		s = make([]T, 0, max(2*cap(s), n, 64))
	}
	*slab = s[:len(s)+n]
	return s[len(s) : len(s)+n : len(s)+n]
}

func (a *spanArena) reset() {
	a.recs, a.attrs, a.events = a.recs[:0], a.attrs[:0], a.events[:0]
}

// build appends r's spans to the pending batch, exporting when it is full.
func (o *Observer) build(r *roomRec) {
	bpp := o.bpp.Load()
	// Ids in this order: trace (unless joined), room span, transfer spans.
	var parentID trace.SpanID
	var parentFlags trace.TraceFlags
	var state trace.TraceState
	var tid trace.TraceID
	if r.parent.IsValid() {
		tid, state, parentID, parentFlags = r.parent.TraceID(), r.parent.TraceState(), r.parent.SpanID(), r.parent.TraceFlags()
	} else {
		tid = o.ids.trace()
	}
	roomID := o.ids.span()
	// One backing array for every span's attributes (each span gets a
	// capped sub-slice), one for the events, one for the spans: fresh, or
	// cut from the arena.
	n := roomAttrCount(r)
	spans, revents := r.spans(), r.events()
	nattr := n + xferAttrMax*len(spans)
	var buf []attribute.KeyValue
	var events []sdktrace.Event
	var recs []spanRecord
	if o.reuse {
		buf = take(&o.arena.attrs, nattr)[:0]
		recs = take(&o.arena.recs, 1+len(spans))
		if len(revents) > 0 {
			events = take(&o.arena.events, len(revents))
		}
	} else {
		buf = make([]attribute.KeyValue, 0, nattr)
		recs = make([]spanRecord, 1+len(spans))
		if len(revents) > 0 {
			events = make([]sdktrace.Event, len(revents))
		}
	}
	for i := range revents {
		e := revents[i]
		var ea []attribute.KeyValue
		if e.status() == kv.StatusFailed && o.reuse {
			ea = take(&o.arena.attrs, 2)
			ea[0], ea[1] = statusAttrs[statusIndex(e.status())], errAttr(e.reason())
		} else {
			ea = statusEventAttrs(e)
		}
		events[i] = sdktrace.Event{Name: StatusEvent, Time: o.wall(e.at(r.created)), Attributes: ea}
	}
	ra := roomAttrs(buf[:0:n], r, o.agentAttr(r.roomAgents()))
	buf = buf[n:n:cap(buf)]
	recs[0] = spanRecord{
		name: roomSpanName, traceID: tid, id: roomID, state: state, kind: uint8(trace.SpanKindInternal),
		parentID: parentID, parentFlags: parentFlags, parentRemote: r.parent.IsRemote(),
		start: r.created, end: r.retiredAt, attrs: ra, events: events,
		failed: r.status == kv.StatusFailed, reason: r.reason, droppedEvents: r.droppedEvents, childSpanCount: int32(len(spans)),
		common: &o.common,
	}
	o.batch = append(o.batch, &recs[0])
	for i := range spans {
		x := &spans[i]
		attrs, end, _ := xferAttrs(buf[:0:xferAttrMax], r, x, bpp)
		buf = buf[xferAttrMax:xferAttrMax:cap(buf)]
		recs[1+i] = spanRecord{
			name: transferSpanName, traceID: tid, id: o.ids.span(), state: state, kind: uint8(trace.SpanKindClient),
			parentID: roomID, parentFlags: trace.FlagsSampled,
			start: x.start, end: end, attrs: attrs,
			failed: !x.done() || x.fail != kv.ReasonNone, abandoned: !x.done(), reason: x.fail,
			common: &o.common,
		}
		o.batch = append(o.batch, &recs[1+i])
	}
	if len(o.batch) >= exportBatch {
		o.export(context.Background())
	}
}

// agentAttr is kv_transfer.peer.agent for a room that wrote to one agent,
// made once per agent (attribute.StringSlice copies through reflection and
// allocates); an empty attribute for several agents (roomAttrs builds it).
// Emitter goroutine only; the cache is dropped when it holds 1,024 agents.
func (o *Observer) agentAttr(agents []string) attribute.KeyValue {
	if len(agents) != 1 {
		return attribute.KeyValue{}
	}
	if kv, ok := o.agents[agents[0]]; ok {
		return kv
	}
	if o.agents == nil || len(o.agents) >= 1024 {
		o.agents = make(map[string]attribute.KeyValue)
	}
	kv := AttrPeerAgent.StringSlice(agents)
	o.agents[agents[0]] = kv
	return kv
}

// export hands the pending batch to the exporter (bounded by ExportTimeout
// and ctx); errors go to the OTel error handler.
func (o *Observer) export(ctx context.Context) {
	if len(o.batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, o.cfg.ExportTimeout)
	defer cancel()
	if err := o.exp.ExportSpans(ctx, o.batch); err != nil {
		o.exportErrors.Add(1)
		otel.Handle(err)
	}
	o.exported.Add(int64(len(o.batch)))
	if o.reuse { // the exporter kept nothing: the next batch overwrites this one
		o.arena.reset()
	} else {
		clear(o.batch)
	}
	o.batch = o.batch[:0]
}
