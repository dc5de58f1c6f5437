package telemetry

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/kv"
)

type grpcCollector struct {
	coltrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names []string
}

func (c *grpcCollector) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.names = append(c.names, s.Name)
			}
		}
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// OTEL_EXPORTER_OTLP_PROTOCOL=grpc exports to a gRPC collector; a failed
// room is kept although the sampler keeps nothing else.
func TestSetupOTLPGRPC(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &grpcCollector{}
	srv := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(srv, col)
	go srv.Serve(ln)
	defer srv.Stop()
	env := map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + ln.Addr().String(), // http: insecure gRPC
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_TRACES_SAMPLER":         "always_off",
	}
	for k, v := range env {
		t.Setenv(k, v) // the exporter reads the process environment
	}
	tel, err := Setup(t.Context(), Options{Getenv: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tel.Tracing, "OTLP grpc") {
		t.Fatalf("tracing: %s", tel.Tracing)
	}
	if !tel.Observer.reuse { // the OTLP exporter keeps nothing after ExportSpans
		t.Fatal("direct export to OTLP does not reuse span memory")
	}
	eng, err := actors.New(actors.Config{Transfers: &manualXfers{auto: true}, Observer: tel.Observer, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 2; id++ {
		eng.Open(id)
		eng.TransferInfo(id, info("a", 2, 1))
		eng.Init(id, 2, 0)
		if id == 1 {
			eng.Send(id, []int32{1, 2}, nil) // succeeds: sampled away
			waitStatus(t, eng, id, kv.StatusSuccess)
		} else {
			eng.Abort(id) // fails: kept
		}
		eng.Clear(id)
	}
	eng.PollSync([]uint64{1, 2}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if strings.Join(col.names, ",") != RoomSpan {
		t.Fatalf("collector got %v, want the failed room's span only", col.names)
	}
}

func TestSetupFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		tracing string // substring of Telemetry.Tracing; "" means Setup fails
	}{
		{map[string]string{}, "tracing off: no OTEL_EXPORTER_OTLP_ENDPOINT"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}, "tracing off: OTEL_SDK_DISABLED"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none"}, "tracing off: OTEL_TRACES_EXPORTER=none"},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"}, "OTLP http/protobuf, direct export; tail sampling ratio 1 parent-based false slow 5s"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "KVXFER_TRACE_VIA_SDK": "1",
			"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25", "KVXFER_TRACE_SLOW": "2s"},
			"via the SDK batch span processor; tail sampling ratio 0.25 parent-based true slow 2s"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "KVXFER_TRACE_SLOW": "off"}, "slow off"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_SAMPLER": "jaeger_remote"}, ""},
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, ""},
	} {
		tel, err := Setup(t.Context(), Options{Getenv: func(k string) string { return tc.env[k] }})
		if tc.tracing == "" {
			if err == nil {
				tel.Shutdown(t.Context())
				t.Fatalf("%v: Setup accepted it", tc.env)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		if !strings.Contains(tel.Tracing, tc.tracing) {
			t.Fatalf("%v: %q, want %q", tc.env, tel.Tracing, tc.tracing)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		if err := tel.Shutdown(ctx); err != nil && !strings.Contains(tc.tracing, "OTLP") {
			t.Fatalf("%v: shutdown: %v", tc.env, err)
		}
		cancel()
	}
	if s, err := SamplingFromEnv(func(k string) string {
		return map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_always_off"}[k]
	}); err != nil || s.Ratio != 0 || !s.ParentBased {
		t.Fatalf("parentbased_always_off: %+v %v", s, err)
	}
}
