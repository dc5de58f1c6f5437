package telemetry

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvxfer/kvxfer/kv"
)

// copyingExporter keeps a deep copy of every batch, taken inside ExportSpans,
// and nothing of the batch itself: what Config.ReuseSpans asks of an exporter.
type copyingExporter struct {
	stubs   tracetest.SpanStubs
	batches int
}

func deepCopy(ss []sdktrace.ReadOnlySpan) tracetest.SpanStubs {
	out := tracetest.SpanStubsFromReadOnlySpans(ss)
	for i := range out {
		out[i].Attributes = slices.Clone(out[i].Attributes)
		out[i].Events = slices.Clone(out[i].Events)
		for j := range out[i].Events {
			out[i].Events[j].Attributes = slices.Clone(out[i].Events[j].Attributes)
		}
	}
	return out
}

func (e *copyingExporter) ExportSpans(_ context.Context, ss []sdktrace.ReadOnlySpan) error {
	e.stubs = append(e.stubs, deepCopy(ss)...)
	e.batches++
	return nil
}

func (e *copyingExporter) Shutdown(context.Context) error { return nil }

// retainingExporter keeps the spans it is given (as tracetest.InMemoryExporter
// does) and a deep copy of each taken inside ExportSpans.
type retainingExporter struct {
	held []sdktrace.ReadOnlySpan
	copy tracetest.SpanStubs
}

func (e *retainingExporter) ExportSpans(_ context.Context, ss []sdktrace.ReadOnlySpan) error {
	e.held = append(e.held, ss...)
	e.copy = append(e.copy, deepCopy(ss)...)
	return nil
}

func (e *retainingExporter) Shutdown(context.Context) error { return nil }

// reuseRooms is a mix of room records: successful with one and several
// agents, failed (status event with error.type), an abandoned transfer, a
// failed transfer, a parent trace context, dropped spans and events, a room
// with no transfer, and rooms with many transfers (more than a batch's
// worth of spans in all, so batches are exported and their memory reused).
func reuseRooms() []*roomRec {
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5},
		TraceFlags: trace.FlagsSampled, Remote: true})
	var out []*roomRec
	for i := range 400 {
		id := uint64(1000 + i)
		r := &roomRec{roomState: roomState{roomHead: roomHead{id: id, created: tick(i), retiredAt: tick(9e6 + i), status: kv.StatusSuccess, retired: true, keep: keepSampled}, roomBody: roomBody{chunks: 2, transfers: 2, pages: 4, bytes: 4096, required: 1}}}
		r.putEvent(1e6, kv.StatusWaitingForInput, 0)
		r.putEvent(2e6, kv.StatusTransferring, 0)
		r.putEvent(4e6, kv.StatusSuccess, 0)
		nx := 2
		if i%37 == 0 {
			nx = 40 // many transfers
		}
		for j := range nx {
			x := xferRec{seq: uint32(j + 1), chunk: int32(j), pages: 2,
				start: tick(2e6 + j), end: tick(3e6 + j), flags: xDone}
			if j == nx-1 {
				x.flags |= xLast
			}
			r.putSpan(x, fmt.Sprintf("agent-%d", j%(1+i%3)))
		}
		switch i % 7 {
		case 1: // failed, with a failed and an abandoned transfer
			r.status, r.reason, r.failedX = kv.StatusFailed, kv.ReasonTransferError, 1
			r.rare = true
			r.putEvent(5e6, kv.StatusFailed, kv.ReasonTransferError)
			r.spans()[0].fail = kv.ReasonTransferError
			r.spans()[1].flags &^= xDone
			r.keep = keepFailed
		case 2:
			r.parent, r.hasParent = parent, true
		case 3:
			r.rare, r.droppedSpans, r.droppedEvents, r.ignored = true, 3, 2, 1
		case 4:
			r.nX, r.nSpans, r.nAg, r.spill = 0, 0, 0, r.spill&spillE
		case 5:
			r.retired = false
		}
		out = append(out, r)
	}
	return out
}

// TestReuseSpansSameSpans: with Config.ReuseSpans the spans an exporter
// receives are the same, field for field (ids from the same seed), as those
// built in fresh memory, over batches that reuse the memory of those before.
func TestReuseSpansSameSpans(t *testing.T) {
	run := func(reuse bool) (tracetest.SpanStubs, int) {
		exp := &copyingExporter{}
		obs, err := New(Config{Exporter: exp, ReuseSpans: reuse, BytesPerPage: 1024})
		if err != nil {
			t.Fatal(err)
		}
		if err := obs.Close(context.Background()); err != nil { // stop the emitter: emit runs here
			t.Fatal(err)
		}
		obs.ids = ids{rand.NewChaCha8([32]byte{7})}
		obs.common.resource = nil // the same on both sides
		obs.base, obs.common.base = epoch, epoch
		for _, r := range reuseRooms() {
			obs.emit(r)
		}
		obs.export(context.Background())
		return exp.stubs, exp.batches
	}
	fresh, _ := run(false)
	reused, batches := run(true)
	if batches < 3 {
		t.Fatalf("%d batches exported, want at least 3 (memory reused)", batches)
	}
	if len(fresh) != len(reused) {
		t.Fatalf("%d spans reused, %d fresh", len(reused), len(fresh))
	}
	for i := range fresh {
		if !reflect.DeepEqual(fresh[i], reused[i]) {
			t.Fatalf("span %d differs:\nreused %+v\nfresh  %+v", i, reused[i], fresh[i])
		}
	}
}

// TestNoReuseSpansStayIntact: without ReuseSpans (the default) an exporter
// may keep the spans it was given; later batches never change them.
func TestNoReuseSpansStayIntact(t *testing.T) {
	exp := &retainingExporter{}
	obs, err := New(Config{Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, r := range reuseRooms() {
		obs.emit(r)
	}
	obs.export(context.Background())
	if len(exp.held) <= exportBatch {
		t.Fatalf("%d spans, want more than a batch", len(exp.held))
	}
	now := deepCopy(exp.held)
	for i := range now {
		if !reflect.DeepEqual(now[i], exp.copy[i]) {
			t.Fatalf("held span %d changed after its export:\nnow  %+v\nthen %+v", i, now[i], exp.copy[i])
		}
	}
}

// TestSetupReusesOnlyForItsOwnExporter: Setup reuses span memory for the
// OTLP exporter it builds (TestSetupOTLPGRPC), not for a given exporter,
// which may keep what it is given (as this in-memory one does).
func TestSetupReusesOnlyForItsOwnExporter(t *testing.T) {
	tel, err := Setup(t.Context(), Options{Exporter: tracetest.NewInMemoryExporter(), Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()
	if tel.Observer.exp == nil || tel.Observer.reuse {
		t.Fatalf("given exporter: direct %v, reuse %v; want direct without reuse", tel.Observer.exp != nil, tel.Observer.reuse)
	}
}

// TestDirectSpansMatchSDK: the direct path's spans (spanRecord) say what the
// SDK's spans built through the trace API say, field for field, over the mix
// of reuseRooms (failed and abandoned transfers, a joined trace, drops):
// everything but the generated ids, which are compared by structure (each
// transfer span's parent is its room span, in its trace; a joined room's
// trace and parent are the remote parent's).
func TestDirectSpansMatchSDK(t *testing.T) {
	direct := &copyingExporter{}
	obs, err := New(Config{Exporter: direct, BytesPerPage: 1024})
	if err != nil {
		t.Fatal(err)
	}
	viaExp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(viaExp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	api, err := New(Config{Tracer: tp, BytesPerPage: 1024})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []*Observer{obs, api} {
		if err := o.Close(context.Background()); err != nil { // stop the emitters: emit runs here
			t.Fatal(err)
		}
		o.base = epoch
	}
	obs.common.base = epoch
	rooms := reuseRooms()
	for _, r := range rooms {
		obs.emit(r)
		api.emit(r)
	}
	obs.export(context.Background())
	// The SDK exports a span when it ends: a room's transfer spans before it.
	got, want := direct.stubs, tracetest.SpanStubs{}
	var children tracetest.SpanStubs
	for _, s := range viaExp.GetSpans() {
		if s.Name != RoomSpan {
			children = append(children, s)
			continue
		}
		want = append(append(want, s), children...)
		children = nil
	}
	if len(got) != len(want) {
		t.Fatalf("%d spans direct, %d through the SDK", len(got), len(want))
	}
	roomOf := map[trace.SpanID]int{} // room span id → its index, per side
	wantRoomOf := map[trace.SpanID]int{}
	for i := range got {
		g, w := got[i], want[i]
		if g.Name == RoomSpan {
			roomOf[g.SpanContext.SpanID()] = i
			wantRoomOf[w.SpanContext.SpanID()] = i
		}
		// Structure: the same parent span (by index) and remoteness, the
		// same trace as that parent, sampled.
		var gp, wp int = -1, -1
		if j, ok := roomOf[g.Parent.SpanID()]; ok {
			gp = j
			if g.SpanContext.TraceID() != got[j].SpanContext.TraceID() {
				t.Errorf("span %d is not in its room's trace", i)
			}
		}
		if j, ok := wantRoomOf[w.Parent.SpanID()]; ok {
			wp = j
		}
		if gp != wp || g.Parent.IsValid() != w.Parent.IsValid() || g.Parent.IsRemote() != w.Parent.IsRemote() ||
			g.Parent.TraceFlags() != w.Parent.TraceFlags() || !g.SpanContext.IsSampled() || !g.SpanContext.IsValid() {
			t.Errorf("span %d: parent %d (%v) direct, %d (%v) via the SDK", i, gp, g.Parent, wp, w.Parent)
		}
		if w.Parent.IsRemote() && (!g.Parent.Equal(w.Parent) || g.SpanContext.TraceID() != w.SpanContext.TraceID()) {
			t.Errorf("span %d: joined trace %v direct, %v via the SDK", i, g.Parent, w.Parent)
		}
		// The direct path also reports the record's dropped events as the
		// span's (the SDK dropped none: it never saw them).
		if v, ok := attrOf(g.Attributes, AttrDroppedEvents); ok && int64(g.DroppedEvents) == v.AsInt64() {
			g.DroppedEvents = w.DroppedEvents
		}
		// Everything else, as the SDK has it.
		g.SpanContext, w.SpanContext, g.Parent, w.Parent = trace.SpanContext{}, trace.SpanContext{}, trace.SpanContext{}, trace.SpanContext{}
		g.Resource, w.Resource = nil, nil
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("span %d differs:\ndirect %+v\nSDK    %+v", i, g, w)
		}
	}
	if len(roomOf) != len(rooms) {
		t.Fatalf("%d room spans, want %d", len(roomOf), len(rooms))
	}
}
