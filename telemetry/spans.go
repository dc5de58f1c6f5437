package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvxfer/kvxfer/actors/room"
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
	roleAttr    = AttrRole.String("prefill")
	backendAttr = AttrBackend.String("nixl")
	statusAttrs [5]attribute.KeyValue
	errAttrs    [16]attribute.KeyValue
)

func init() {
	for s := range statusAttrs {
		statusAttrs[s] = AttrStatus.String(room.Status(s).String())
	}
	for r := range errAttrs {
		errAttrs[r] = AttrErrorType.String(room.Reason(r).String())
	}
}

func errAttr(r room.Reason) attribute.KeyValue {
	if int(r) < len(errAttrs) {
		return errAttrs[r]
	}
	return AttrErrorType.String(r.String())
}

// emit turns a finished room record into its spans. It runs on the emitter
// goroutine (or in Close), never on an actor.
func (o *Observer) emit(r *roomRec) {
	ctx := context.Background()
	if r.parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, r.parent)
	}
	ctx, sp := o.tracer.Start(ctx, RoomSpan, trace.WithTimestamp(r.created), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrBootstrapRoom.Int64(int64(r.id)), roleAttr, backendAttr))
	for _, e := range r.events {
		if e.status == room.Failed {
			sp.AddEvent(StatusEvent, trace.WithTimestamp(e.at), trace.WithAttributes(statusAttrs[statusIndex(e.status)], errAttr(e.reason)))
		} else {
			sp.AddEvent(StatusEvent, trace.WithTimestamp(e.at), trace.WithAttributes(statusAttrs[statusIndex(e.status)]))
		}
	}
	for i := range r.spans {
		x := &r.spans[i]
		_, c := o.tracer.Start(ctx, TransferSpan, trace.WithTimestamp(x.start), trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(AttrBootstrapRoom.Int64(int64(r.id)), AttrPeerAgent.String(x.agent), AttrChunk.Int(x.chunk),
				AttrLast.Bool(x.last), AttrSeq.Int64(int64(x.seq)), AttrPages.Int(x.pages), AttrBytes.Int64(x.bytes)))
		end := x.end
		switch {
		case !x.done:
			// Still in flight when the room retired (drain deadline expired).
			end = r.retiredAt
			c.SetAttributes(AttrAbandoned.Bool(true))
			c.SetStatus(codes.Error, "in flight when the room retired")
		case x.fail != room.ReasonNone:
			c.SetAttributes(errAttr(x.fail))
			c.SetStatus(codes.Error, x.fail.String())
		}
		c.End(trace.WithTimestamp(end))
	}
	attrs := make([]attribute.KeyValue, 0, 14)
	attrs = append(attrs, statusAttrs[statusIndex(r.status)], AttrChunks.Int(r.chunks), AttrTransfers.Int(r.transfers),
		AttrPages.Int64(r.pages), AttrBytes.Int64(r.bytes), AttrSampled.String(r.keep.String()))
	if len(r.agents) > 0 {
		attrs = append(attrs, AttrPeerAgent.StringSlice(r.agents))
	}
	if r.failedX > 0 {
		attrs = append(attrs, AttrFailedTransfers.Int(r.failedX))
	}
	if r.ignored > 0 {
		attrs = append(attrs, AttrIgnored.Int(r.ignored))
	}
	if r.droppedSpans > 0 {
		attrs = append(attrs, AttrDroppedSpans.Int(r.droppedSpans))
	}
	if r.droppedEvents > 0 {
		attrs = append(attrs, AttrDroppedEvents.Int(r.droppedEvents))
	}
	if !r.retired {
		attrs = append(attrs, AttrRetired.Bool(false))
	}
	if r.status == room.Failed {
		attrs = append(attrs, errAttr(r.reason))
		sp.SetStatus(codes.Error, r.reason.String())
	}
	sp.SetAttributes(attrs...)
	sp.End(trace.WithTimestamp(r.retiredAt))
}
