package telemetry

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// spanRecord is a finished span handed straight to the exporter (the direct path
// builds spans from a retired room rather than through a tracer). It implements
// sdktrace.ReadOnlySpan; the embedded interface is nil and only supplies the SDK's
// unexported marker method, which exporters never call.
type spanRecord struct {
	sdktrace.ReadOnlySpan

	name           string
	sc, parent     trace.SpanContext
	kind           trace.SpanKind
	start, end     tick // times as the Observer's ticks: StartTime and EndTime convert (no pointers to write)
	attrs          []attribute.KeyValue
	events         []sdktrace.Event
	status         sdktrace.Status
	droppedEvents  int
	childSpanCount int
	common         *spanCommon // the Observer's: the same for every span
}

// spanCommon is what every directly exported span shares.
type spanCommon struct {
	resource *resource.Resource
	scope    instrumentation.Scope
	base     time.Time // the Observer's base: a tick's origin (Observer.wall)
}

func (s *spanRecord) Name() string                                { return s.name }
func (s *spanRecord) SpanContext() trace.SpanContext              { return s.sc }
func (s *spanRecord) Parent() trace.SpanContext                   { return s.parent }
func (s *spanRecord) SpanKind() trace.SpanKind                    { return s.kind }
func (s *spanRecord) StartTime() time.Time                        { return s.common.base.Add(time.Duration(s.start)) }
func (s *spanRecord) EndTime() time.Time                          { return s.common.base.Add(time.Duration(s.end)) }
func (s *spanRecord) Attributes() []attribute.KeyValue            { return s.attrs }
func (s *spanRecord) Links() []sdktrace.Link                      { return nil }
func (s *spanRecord) Events() []sdktrace.Event                    { return s.events }
func (s *spanRecord) Status() sdktrace.Status                     { return s.status }
func (s *spanRecord) InstrumentationScope() instrumentation.Scope { return s.common.scope }
func (s *spanRecord) Resource() *resource.Resource                { return s.common.resource }
func (s *spanRecord) DroppedAttributes() int                      { return 0 }
func (s *spanRecord) DroppedLinks() int                           { return 0 }
func (s *spanRecord) DroppedEvents() int                          { return s.droppedEvents }
func (s *spanRecord) ChildSpanCount() int                         { return s.childSpanCount }

// InstrumentationLibrary is the deprecated twin of InstrumentationScope.
func (s *spanRecord) InstrumentationLibrary() instrumentation.Library { //nolint:staticcheck // part of the interface
	return instrumentation.Library(s.common.scope) //nolint:staticcheck // part of the interface
}
