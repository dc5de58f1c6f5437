package telemetry

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// manualXfers is a test double of the NIXL transfer pool: posted transfers
// wait until the test completes them, so every interleaving is chosen by the
// test. It can also complete at once (auto) or panic on a transfer.
type manualXfers struct {
	mu      sync.Mutex
	pending []pendingXfer
	auto    bool // complete at once, inside Post
	async   bool // with auto: complete from another goroutine, as the pool does
	panicOn func(kv.Transfer) bool
}

type pendingXfer struct {
	t    kv.Transfer
	done kv.DoneFunc
}

func (m *manualXfers) Post(t kv.Transfer, done kv.DoneFunc) {
	if m.panicOn != nil && m.panicOn(t) {
		panic("transfer layer bug")
	}
	if m.auto && m.async {
		go done(kv.ReasonNone, nil)
		return
	}
	if m.auto {
		done(kv.ReasonNone, nil)
		return
	}
	m.mu.Lock()
	m.pending = append(m.pending, pendingXfer{t, done})
	m.mu.Unlock()
}

// complete finishes every pending transfer with fail and returns how many.
func (m *manualXfers) complete(fail kv.Reason) int {
	m.mu.Lock()
	p := m.pending
	m.pending = nil
	m.mu.Unlock()
	for _, x := range p {
		x.done(fail, nil)
	}
	return len(p)
}

func (m *manualXfers) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pending)
}

// harness is a real actors.Engine on a fake clock, observed by an Observer
// whose spans go synchronously to an in-memory exporter and whose metrics are
// read with a manual reader.
type harness struct {
	t      *testing.T
	eng    *actors.Engine
	clk    *clock.Fake
	xf     *manualXfers
	obs    *Observer
	exp    *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
}

var epoch = time.Unix(1_700_000_000, 0)

func newHarness(t *testing.T, xf *manualXfers, mod func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, clk: clock.NewFake(epoch), xf: xf, exp: tracetest.NewInMemoryExporter()}
	h.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(h.exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	// The direct path by default; mod clears Exporter for the API path.
	cfg := Config{Exporter: h.exp, Tracer: h.tp, Clock: h.clk, BytesPerPage: 1 << 20}
	if mod != nil {
		mod(&cfg)
	}
	obs, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.obs = obs
	h.reader = sdkmetric.NewManualReader(sdkmetric.WithProducer(obs))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))
	eng, err := actors.New(actors.Config{Clock: h.clk, Transfers: xf, Observer: obs, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	h.eng = eng
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Close(ctx)
		_ = obs.Close(ctx)
		_ = h.tp.Shutdown(ctx)
		_ = mp.Shutdown(ctx)
	})
	return h
}

func (h *harness) poll(id uint64) kv.Reply { return h.eng.PollSync([]uint64{id}, nil)[0] }

// expect polls once: every message sent before has been handled by then (a
// poll travels the same shard and room mailboxes), except completions and
// deadlines, which the test sends itself before calling expect.
func (h *harness) expect(id uint64, want kv.Status) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := h.poll(id)
		if r.Status == want {
			return
		}
		// Completions and deadline messages travel from another goroutine
		// straight to the room's mailbox; bounded polling covers that hop.
		if time.Now().After(deadline) {
			h.t.Fatalf("room %d: %v/%v, want %v", id, r.Status, r.Reason, want)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// retire clears a concluded room and waits until the observer emitted it.
func (h *harness) retire(id uint64) {
	h.t.Helper()
	h.eng.Clear(id)
	h.poll(id) // the room handled Clear (and called RoomRetired) before this answer
	h.flush()
}

func (h *harness) flush() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.obs.Flush(ctx); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) spans(name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range h.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func (h *harness) metrics() map[string]metricdata.Metrics {
	h.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		h.t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// value returns the int64 data point of metric name whose attribute key has
// value val ("" for the point without attributes).
func (h *harness) value(ms map[string]metricdata.Metrics, name, key, val string) int64 {
	h.t.Helper()
	m, ok := ms[name]
	if !ok {
		h.t.Fatalf("no metric %s", name)
	}
	var pts []metricdata.DataPoint[int64]
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		pts = d.DataPoints
	case metricdata.Gauge[int64]:
		pts = d.DataPoints
	default:
		h.t.Fatalf("%s: %T", name, m.Data)
	}
	for _, p := range pts {
		if key == "" && p.Attributes.Len() == 0 {
			return p.Value
		}
		if v, ok := p.Attributes.Value(attribute.Key(key)); ok && v.AsString() == val {
			return p.Value
		}
	}
	return 0
}

func info(agent string, n, required int) room.TransferInfo {
	ps := make([]int32, n)
	for i := range ps {
		ps[i] = int32(100 + i)
	}
	return room.TransferInfo{Agent: agent, From: kv.Endpoint{IP: "127.0.0.1", Port: 9000}, DstPages: ps, DstAux: 1, Required: required}
}

type metricdataHistogram = metricdata.Histogram[float64]

// byFact drives a room's record one fact at a time, each fact a step of its
// own (RoomObserver.Step), for tests that build a room's story by hand.
type byFact struct{ actors.RoomObserver }

func (f byFact) TransferInfo(agent string, required int) {
	f.Step(room.TransferInfo{Agent: agent, Required: required},
		room.Effects{Info: room.InfoSeen{Seen: true, Agent: agent, Required: required}})
}
func (f byFact) StatusChanged(s kv.Status, why kv.Reason) {
	f.Step(nil, room.Effects{Published: true, Status: s, Reason: why})
}
func (f byFact) Posted(t *kv.Transfer) { f.Step(nil, room.Effects{Posts: []kv.Transfer{*t}}) }
func (f byFact) TransferDone(seq uint32, fail kv.Reason) {
	f.Step(room.XferDone{Seq: seq, Fail: fail}, room.Effects{Done: room.DoneSeen{Seen: true, Seq: seq, Fail: fail}})
}
func (f byFact) Ignored(msg room.Msg)     { f.Step(msg, room.Effects{Ignored: true}) }
func (f byFact) Retired(t room.Tombstone) { f.Step(nil, room.Effects{Retire: true, Tomb: t}) }

// created is RoomCreated at the Observer's clock's now, as an engine on
// that clock would call it.
func (o *Observer) created(id uint64) actors.RoomObserver { return o.RoomCreated(id, o.clk.Now()) }
