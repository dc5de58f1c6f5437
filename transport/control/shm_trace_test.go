package control

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/telemetry"
)

// TestShmTracedOpen: an open submitted on the ring with a traceparent puts
// the room's span in the scheduler's trace, as a child of the given span; an
// invalid traceparent is ignored (the room starts its own trace, counted), an
// open without one starts its own trace too. The traceparents cross the
// index area's wrap (a small area, many opens).
func TestShmTracedOpen(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	clk := clock.NewFake(time.Unix(0, 0))
	obs, err := telemetry.New(telemetry.Config{Exporter: exp, Tracer: tp, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := actors.New(actors.Config{Transfers: instantTransfers{}, Clock: clk, Shards: 2, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Close(ctx)
		_ = obs.Close(ctx)
		_ = tp.Shutdown(ctx)
	})
	srv := startServer(t, realEngine{eng}, nil)
	s := attach(t, srv.Endpoint(), ShmOptions{RingEntries: 8, Slots: 4, IndexWords: 32})

	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	wantTrace, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	wantParent, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	const invalid = "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
	// A traceparent takes 15 words of the 32: rounds wrap the index area.
	const rounds = 5
	for i := range rounds {
		base := uint64(10 * (i + 1))
		for j, tpv := range []string{parent, invalid, ""} {
			id := base + uint64(j)
			if err := s.OpenTraced(id, tpv); err != nil {
				t.Fatal(err)
			}
			shmUntil(t, s, id, kv.StatusBootstrapping)
			if err := s.Abort(id); err != nil {
				t.Fatal(err)
			}
			shmUntil(t, s, id, kv.StatusFailed)
			if err := s.Clear(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Barrier(); err != nil {
		t.Fatal(err)
	}
	var all []uint64
	for i := range rounds {
		base := uint64(10 * (i + 1))
		all = append(all, base, base+1, base+2)
	}
	eng.PollSync(all, nil) // every room handled its Clear (and retired) before this answer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := obs.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	spans := map[uint64]tracetest.SpanStub{}
	for _, sp := range exp.GetSpans() {
		if sp.Name != telemetry.RoomSpan {
			continue
		}
		for _, a := range sp.Attributes {
			if a.Key == telemetry.AttrBootstrapRoom {
				spans[uint64(a.Value.AsInt64())] = sp
			}
		}
	}
	for i := range rounds {
		base := uint64(10 * (i + 1))
		for _, id := range []uint64{base, base + 1, base + 2} {
			sp, ok := spans[id]
			if !ok {
				t.Fatalf("room %d: no room span", id)
			}
			joined := sp.SpanContext.TraceID() == wantTrace && sp.Parent.SpanID() == wantParent && sp.Parent.IsRemote()
			if joined != (id == base) {
				t.Fatalf("room %d: trace %s parent %s remote %v", id, sp.SpanContext.TraceID(), sp.Parent.SpanID(), sp.Parent.IsRemote())
			}
			if id != base && sp.Parent.IsValid() {
				t.Fatalf("room %d without a valid traceparent has parent %s", id, sp.Parent.SpanID())
			}
		}
	}
	if st := srv.ShmStats(); st.TracedOpens != rounds || st.IgnoredTraceparents != rounds {
		t.Fatalf("stats %+v", st)
	}
	if err := s.OpenTraced(1, strings.Repeat("0", MaxTraceparent+1)); err == nil {
		t.Fatal("a traceparent beyond MaxTraceparent was submitted")
	}
}

// TestShmTraceparentWords round-trips traceparents through their index
// words and refuses words that do not hold one.
func TestShmTraceparentWords(t *testing.T) {
	for _, tp := range []string{"a", "abcd", "abcde", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", strings.Repeat("x", MaxTraceparent)} {
		w := appendTraceparent(nil, tp)
		if len(w) != traceparentWords(len(tp)) {
			t.Fatalf("%q: %d words", tp, len(w))
		}
		if got, ok := decodeTraceparent(w); !ok || got != tp {
			t.Fatalf("%q decodes to %q %v", tp, got, ok)
		}
	}
	for name, w := range map[string][]int32{
		"empty":          nil,
		"zero length":    {0},
		"too long":       append([]int32{MaxTraceparent + 1}, make([]int32, MaxTraceparent/4+1)...),
		"length too big": {5, 0x64636261},
		"extra word":     {4, 0x64636261, 0},
		"padding":        {3, 0x64636261},
	} {
		if tp, ok := decodeTraceparent(w); ok {
			t.Fatalf("%s: decoded %q", name, tp)
		}
	}
}
