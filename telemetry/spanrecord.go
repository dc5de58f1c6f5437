package telemetry

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvxfer/kvxfer/kv"
)

// spanRecord is a finished span handed straight to the exporter (the direct path
// builds spans from a retired room rather than through a tracer). It implements
// sdktrace.ReadOnlySpan; the embedded interface is nil and only supplies the SDK's
// unexported marker method, which exporters never call.
//
// It keeps the parts of its span contexts and status, not the values (160
// bytes instead of 280): a kept room's spans are written to memory that has
// left the caches since the last export, and each line costs a miss.
type spanRecord struct {
	sdktrace.ReadOnlySpan

	common         *spanCommon // the Observer's: the same for every span
	attrs          []attribute.KeyValue
	events         []sdktrace.Event
	start, end     tick             // times as the Observer's ticks: StartTime and EndTime convert (no pointers to write)
	state          trace.TraceState // the trace's, on both span contexts
	traceID        trace.TraceID
	id, parentID   trace.SpanID // parentID zero: no parent
	droppedEvents  int32
	childSpanCount int32
	name           spanName
	kind           uint8 // a trace.SpanKind
	parentFlags    trace.TraceFlags
	parentRemote   bool
	failed         bool      // status Error, described by reason or abandonedMsg
	abandoned      bool      // in flight when the room retired
	reason         kv.Reason // why it failed
}

type spanName uint8

const (
	roomSpanName spanName = iota
	transferSpanName
)

var spanNames = [...]string{roomSpanName: RoomSpan, transferSpanName: TransferSpan}

// spanCommon is what every directly exported span shares.
type spanCommon struct {
	resource *resource.Resource
	scope    instrumentation.Scope
	base     time.Time // the Observer's base: a tick's origin (Observer.wall)
}

func (s *spanRecord) Name() string             { return spanNames[s.name] }
func (s *spanRecord) SpanKind() trace.SpanKind { return trace.SpanKind(s.kind) }

func (s *spanRecord) SpanContext() trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: s.traceID, SpanID: s.id, TraceFlags: trace.FlagsSampled,
		TraceState: s.state})
}

func (s *spanRecord) Parent() trace.SpanContext {
	if !s.parentID.IsValid() {
		return trace.SpanContext{}
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: s.traceID, SpanID: s.parentID, TraceFlags: s.parentFlags,
		TraceState: s.state, Remote: s.parentRemote})
}

func (s *spanRecord) Status() sdktrace.Status {
	switch {
	case !s.failed:
		return sdktrace.Status{}
	case s.abandoned:
		return sdktrace.Status{Code: codes.Error, Description: abandonedMsg}
	}
	return sdktrace.Status{Code: codes.Error, Description: s.reason.String()}
}

func (s *spanRecord) StartTime() time.Time                        { return s.common.base.Add(time.Duration(s.start)) }
func (s *spanRecord) EndTime() time.Time                          { return s.common.base.Add(time.Duration(s.end)) }
func (s *spanRecord) Attributes() []attribute.KeyValue            { return s.attrs }
func (s *spanRecord) Links() []sdktrace.Link                      { return nil }
func (s *spanRecord) Events() []sdktrace.Event                    { return s.events }
func (s *spanRecord) InstrumentationScope() instrumentation.Scope { return s.common.scope }
func (s *spanRecord) Resource() *resource.Resource                { return s.common.resource }
func (s *spanRecord) DroppedAttributes() int                      { return 0 }
func (s *spanRecord) DroppedLinks() int                           { return 0 }
func (s *spanRecord) DroppedEvents() int                          { return int(s.droppedEvents) }
func (s *spanRecord) ChildSpanCount() int                         { return int(s.childSpanCount) }

// InstrumentationLibrary is the deprecated twin of InstrumentationScope.
func (s *spanRecord) InstrumentationLibrary() instrumentation.Library { //nolint:staticcheck // part of the interface
	return instrumentation.Library(s.common.scope) //nolint:staticcheck // part of the interface
}
