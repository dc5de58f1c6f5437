package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kvxfer/kvxfer/internal/clock"
)

// Options configures Setup.
type Options struct {
	// ServiceName is the default service.name; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES override it. Default "kvxferd".
	ServiceName    string
	ServiceVersion string
	// Attributes are added to the resource (e.g. the rank).
	Attributes []attribute.KeyValue
	// BytesPerPage: see Config.BytesPerPage.
	BytesPerPage int64
	// NoMetrics leaves Telemetry.Metrics nil (no Prometheus handler).
	NoMetrics bool
	// Exporter replaces the OTLP exporter chosen from the environment (tests,
	// benchmarks); OTEL_SDK_DISABLED and OTEL_TRACES_EXPORTER=none still
	// turn tracing off.
	Exporter sdktrace.SpanExporter
	// ViaSDK sends the spans through an SDK TracerProvider with a batch span
	// processor instead of exporting them directly (KVXFER_TRACE_VIA_SDK=1
	// sets it). The direct path is the default: about a third of the cost.
	ViaSDK bool
	// Getenv reads the environment (default os.Getenv). The OTLP exporters
	// read their OTEL_EXPORTER_OTLP_* settings from the process environment.
	Getenv func(string) string
	Clock  clock.Clock
	// Observer tunes the observer (caps, queue); its Tracer, Sampling,
	// BytesPerPage and Clock are set by Setup. Export errors go to the OTel
	// global error handler (otel.SetErrorHandler).
	Observer Config
}

// Telemetry is the process's tracing and metrics, ready to be wired into
// daemon.Config (Observer into Engine.Observer, Metrics into Metrics).
type Telemetry struct {
	Observer *Observer
	// Metrics is the Prometheus handler over a private registry (nil with
	// Options.NoMetrics).
	Metrics http.Handler
	// Registry is that registry, for callers that add their own collectors.
	Registry *prometheus.Registry
	// TracerProvider is the SDK provider (batch span processor in front of
	// the exporter, AlwaysSample): the room spans go through it with
	// Options.ViaSDK, and other instrumentation may use it. Nil when tracing
	// is off.
	TracerProvider *sdktrace.TracerProvider
	MeterProvider  *sdkmetric.MeterProvider
	// Tracing says why tracing is on or off, for the startup log.
	Tracing string
}

// Setup builds tracing and metrics from the standard environment:
//
//   - tracing is on when OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (or Options.Exporter is), and
//     off when OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none;
//   - OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL picks
//     grpc or http/protobuf (the default); the exporters read the remaining
//     OTEL_EXPORTER_OTLP_* variables (headers, TLS, timeout, compression);
//   - OTEL_TRACES_SAMPLER / _ARG and KVXFER_TRACE_SLOW set the tail sampler;
//   - OTEL_BSP_* tune the batch span processor;
//   - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES the resource.
//
// Shut it down with Shutdown after the daemon.
func Setup(ctx context.Context, opt Options) (*Telemetry, error) {
	getenv := opt.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if opt.ServiceName == "" {
		opt.ServiceName = "kvxferd"
	}
	attrs := append([]attribute.KeyValue{attribute.String("service.name", opt.ServiceName)}, opt.Attributes...)
	if opt.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", opt.ServiceVersion))
	}
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	t := &Telemetry{}
	oc := opt.Observer
	oc.BytesPerPage, oc.Clock = opt.BytesPerPage, opt.Clock

	exp, why, err := traceExporter(ctx, opt.Exporter, getenv)
	if err != nil {
		return nil, err
	}
	t.Tracing = why
	if exp != nil {
		s, err := SamplingFromEnv(getenv)
		if err != nil {
			_ = exp.Shutdown(ctx)
			return nil, err
		}
		// The Observer samples at retirement; the SDK must keep what it gets
		// (an explicit WithSampler overrides OTEL_TRACES_SAMPLER). Blocking:
		// the batch processor pushes back on the Observer's emitter, whose
		// bounded queue drops (and counts) instead of the SDK silently.
		t.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBlocking()),
			sdktrace.WithResource(res), sdktrace.WithSampler(sdktrace.AlwaysSample()))
		path := "direct export"
		if opt.ViaSDK || getenv("KVXFER_TRACE_VIA_SDK") == "1" {
			oc.Tracer, path = t.TracerProvider, "via the SDK batch span processor"
		} else {
			oc.Exporter, oc.Resource = exp, res
			// The OTLP exporters built here encode a batch within ExportSpans
			// and keep none of it; a given exporter may (tests keep spans).
			oc.ReuseSpans = oc.ReuseSpans || opt.Exporter == nil
		}
		oc.Sampling = &s
		t.Tracing = fmt.Sprintf("%s, %s; tail sampling ratio %g parent-based %v slow %v", why, path, s.Ratio, s.ParentBased, slowString(s.Slow))
	}
	if t.Observer, err = New(oc); err != nil {
		t.shutdownTracer(ctx)
		return nil, err
	}
	if !opt.NoMetrics {
		t.Registry = prometheus.NewRegistry()
		pe, err := otelprom.New(otelprom.WithRegisterer(t.Registry), otelprom.WithProducer(t.Observer), otelprom.WithoutScopeInfo())
		if err != nil {
			t.shutdownTracer(ctx)
			return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
		}
		t.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(pe), sdkmetric.WithResource(res))
		t.Metrics = promhttp.HandlerFor(t.Registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	}
	return t, nil
}

func slowString(d time.Duration) string {
	switch {
	case d < 0:
		return "off"
	case d == 0:
		return DefaultSlow.String()
	}
	return d.String()
}

// traceExporter picks the span exporter from the environment; nil means
// tracing is off, and why says why (or what was chosen).
func traceExporter(ctx context.Context, given sdktrace.SpanExporter, getenv func(string) string) (sdktrace.SpanExporter, string, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, "tracing off: OTEL_SDK_DISABLED=true", nil
	}
	switch v := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); v {
	case "", "otlp":
	case "none":
		return nil, "tracing off: OTEL_TRACES_EXPORTER=none", nil
	default:
		return nil, "", fmt.Errorf("telemetry: OTEL_TRACES_EXPORTER %q: only otlp and none are supported", v)
	}
	if given != nil {
		return given, "tracing on: given exporter", nil
	}
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, "tracing off: no OTEL_EXPORTER_OTLP_ENDPOINT", nil
	}
	proto := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	if proto == "" {
		proto = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	var exp sdktrace.SpanExporter
	var err error
	switch proto {
	case "", "http/protobuf":
		proto = "http/protobuf"
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, "", fmt.Errorf("telemetry: OTLP protocol %q: want grpc or http/protobuf", proto)
	}
	if err != nil {
		return nil, "", fmt.Errorf("telemetry: OTLP %s exporter: %w", proto, err)
	}
	return exp, "tracing on: OTLP " + proto, nil
}

func (t *Telemetry) shutdownTracer(ctx context.Context) {
	if t.TracerProvider != nil {
		_ = t.TracerProvider.Shutdown(ctx)
	}
}

// Shutdown emits the spans of rooms still buffered (call it after the
// daemon's Shutdown, so that rooms failed by the shutdown are included), then
// flushes and stops the exporters. Bound ctx: an unreachable gRPC collector
// makes the flush retry until ctx ends.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	if t.Observer != nil {
		errs = append(errs, t.Observer.Close(ctx))
	}
	if t.TracerProvider != nil {
		// Flushes the batch processor, then shuts the exporter down (which
		// the direct path shares).
		errs = append(errs, t.TracerProvider.Shutdown(ctx))
	}
	if t.MeterProvider != nil {
		errs = append(errs, t.MeterProvider.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
