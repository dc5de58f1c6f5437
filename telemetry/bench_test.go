package telemetry

import (
	"context"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// benchEngine is an engine whose writes complete at once (async: from
// another goroutine, as the NIXL pool's completions do), observed by obs
// (nil: no observer, the engine's NopObserver).
func benchEngine(b *testing.B, obs actors.Observer, async bool) *actors.Engine {
	return benchEngineOver(b, obs, &manualXfers{auto: true, async: async})
}

// benchEngineOver is an engine over xfers, observed by obs (nil: none). It
// runs on the wall clock, as in kvxferd and as the Observers here do: a fake
// clock (a mutex and a heap of timers) made each room about 1.5 µs dearer
// than in production, which understated the relative overhead.
func benchEngineOver(b *testing.B, obs actors.Observer, xfers actors.Transfers) *actors.Engine {
	cfg := actors.Config{Clock: clock.Real{}, Transfers: xfers}
	if obs != nil {
		cfg.Observer = obs
	}
	eng, err := actors.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = eng.Close(ctx)
	})
	return eng
}

// benchTelemetry is tracing and metrics as kvxferd runs them: spans built at
// retirement and exported directly in batches to an exporter that discards
// (sdk: through an SDK TracerProvider with a blocking batch span processor
// instead), and the Prometheus exporter over a private registry.
func benchTelemetry(b *testing.B, s Sampling, sdk bool) *Observer {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter(), sdktrace.WithBlocking()),
		sdktrace.WithSampler(sdktrace.AlwaysSample()))
	cfg := Config{Sampling: &s, BytesPerPage: 1 << 20} // the wall clock, as in production
	if sdk {
		cfg.Tracer = tp
	} else {
		// It keeps nothing after ExportSpans, as the OTLP exporters kvxferd
		// uses (Setup sets ReuseSpans for them).
		cfg.Exporter, cfg.ReuseSpans = tracetest.NewNoopExporter(), true
	}
	obs, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pe, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithProducer(obs))
	if err != nil {
		b.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(pe))
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = obs.Close(ctx)
		_ = tp.Shutdown(ctx)
		_ = mp.Shutdown(ctx)
	})
	return obs
}

// benchMetricsOnly is metrics alone (no tracing), with the Prometheus
// exporter over a private registry.
func benchMetricsOnly(b *testing.B) *Observer {
	obs, err := New(Config{BytesPerPage: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pe, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithProducer(obs))
	if err != nil {
		b.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(pe))
	b.Cleanup(func() {
		_ = obs.Close(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return obs
}

// lifecycle drives n whole rooms (Open, one transfer info, Init, two chunks,
// Success, Clear) through eng, starting at room next.
func lifecycle(eng *actors.Engine, ids []uint64, next uint64) {
	startRooms(eng, ids, next)
	out := make([]kv.Reply, len(ids))
	for {
		all := true
		out = eng.Poll(ids, out)
		for _, r := range out {
			all = all && r.Status == kv.StatusSuccess
		}
		if all {
			break
		}
		// As a scheduler between its iterations: the poller does not take a
		// core from the shards while it waits. (Engine.Poll answers most
		// rooms from the directory without blocking, so a bare loop spins.)
		runtime.Gosched()
	}
	for _, id := range ids {
		eng.Clear(id)
	}
	eng.Poll(ids, out) // every Clear handled: every room retired
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTelemetryOverhead measures rooms/s through the engine without an
// observer ("off") and with tracing and metrics on, in one run: batches of
// 1,000 rooms alternate between the two engines (which one goes first
// alternates too), so that the shared machine's noise hits both alike. The
// emission of the spans (the Observer's goroutine) is inside the timed
// region: each traced batch ends with a Flush, which also exports, and each
// off batch with an idle Observer's Flush, the same barrier.
//
// Reported: rooms/s off and on and the wall-clock overhead over the whole
// run; the median of the per-pair overheads (robust to a batch that another
// process disturbed); and process CPU per room off and on with its overhead,
// over the run and as the median of the per-pair CPU overheads.
//
// keep-all keeps every room (the worst case); ratio-0.1 keeps 10% of the
// successful rooms and every failed or slow one, as production would;
// ratio-0 records every room for tracing but keeps none (no span is built);
// metrics-only has no tracing;
// -via-sdk builds the spans through the SDK's TracerProvider and batch span
// processor instead of exporting them directly. Writes complete inside Post
// (the engine does nothing but bookkeeping: the worst case for the relative
// overhead), or with -async-writes from another goroutine, as the NIXL
// pool's completions do.
func BenchmarkTelemetryOverhead(b *testing.B) {
	for _, tc := range []struct {
		name              string
		s                 Sampling
		sdk, async, noTrc bool
	}{
		{"keep-all", Sampling{Ratio: 1}, false, false, false},
		{"ratio-0.1", Sampling{Ratio: 0.1}, false, false, false},
		{"keep-all-async-writes", Sampling{Ratio: 1}, false, true, false},
		{"ratio-0.1-async-writes", Sampling{Ratio: 0.1}, false, true, false},
		{"keep-all-via-sdk", Sampling{Ratio: 1}, true, false, false},
		{"ratio-0.1-via-sdk", Sampling{Ratio: 0.1}, true, false, false},
		{"ratio-0", Sampling{Ratio: 0}, false, false, false},
		{"metrics-only", Sampling{}, false, false, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			off := benchEngine(b, nil, tc.async)
			var obs *Observer
			if tc.noTrc {
				obs = benchMetricsOnly(b)
			} else {
				obs = benchTelemetry(b, tc.s, tc.sdk)
			}
			on := benchEngine(b, obs, tc.async)
			// The off side ends its batches with the same barrier as the on
			// side (the Flush of an Observer of its kind that observes no
			// engine): a Flush waits for the emitter's goroutine, which
			// runs once a processor is free of the batch's tail (actors
			// stopping after the last poll); without it, the on side
			// waited out its own tail and the off side passed its tail on
			// to the next batch, about 300 ns per room (an idle Flush after
			// an off batch measured so).
			var idle *Observer
			if !tc.noTrc {
				idle = benchTelemetry(b, tc.s, tc.sdk)
			}
			alternate(b, obs, idle,
				func(ids []uint64, next uint64) { lifecycle(off, ids, next) },
				func(ids []uint64, next uint64) { lifecycle(on, ids, next) }).report(b)
		})
	}
}

// BenchmarkObserverCalls is the caller-side cost of one room's record
// (what an actor goroutine pays), tracing on, emission excluded: the steps
// of a room with two chunks, as the room actor hands them over.
func BenchmarkObserverCalls(b *testing.B) {
	obs := benchTelemetry(b, Sampling{Ratio: 0}, false)
	t1 := kv.Transfer{Agent: "a", Chunk: 0, Seq: 1, SrcPages: []int32{1, 2}}
	t2 := kv.Transfer{Agent: "a", Chunk: 1, Seq: 2, Last: true, SrcPages: []int32{3, 4}}
	info := room.TransferInfo{Agent: "a", Required: 1}
	fx := []room.Effects{
		{Info: room.InfoSeen{Seen: true, Agent: "a", Required: 1}, Published: true, Status: kv.StatusWaitingForInput},
		{Posts: []kv.Transfer{t1}, Published: true, Status: kv.StatusTransferring},
		{Done: room.DoneSeen{Seen: true, Seq: 1}},
		{Posts: []kv.Transfer{t2}},
		{Done: room.DoneSeen{Seen: true, Seq: 2}, Published: true, Status: kv.StatusSuccess},
		{Retire: true},
	}
	msgs := []room.Msg{info, room.Send{}, room.XferDone{Seq: 1}, room.Send{}, room.XferDone{Seq: 2}, room.Clear{}}
	b.ReportAllocs()
	id := uint64(0)
	for b.Loop() {
		id++
		fx[1].Posts[0].Room, fx[3].Posts[0].Room = id, id
		fx[5].Tomb = room.Tombstone{Room: id, Status: kv.StatusSuccess, Opened: true}
		r := obs.created(id)
		for i := range fx {
			r.Step(msgs[i], fx[i])
		}
	}
}

// BenchmarkEmit is the emitter's cost for one kept room (a room span with
// three status events and two transfer spans): built and batched for the
// exporter directly (allocating, or -reuse in memory reused batch after
// batch, Config.ReuseSpans), or through the SDK's TracerProvider and batch span
// processor.
func BenchmarkEmit(b *testing.B) {
	for _, mode := range []string{"direct", "direct-reuse", "via-sdk"} {
		sdk := mode == "via-sdk"
		b.Run(mode, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter(), sdktrace.WithBlocking()),
				sdktrace.WithSampler(sdktrace.AlwaysSample()))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			cfg := Config{Exporter: tracetest.NewNoopExporter(), ReuseSpans: mode == "direct-reuse", BytesPerPage: 1024}
			if sdk {
				cfg = Config{Tracer: tp, BytesPerPage: 1024}
			}
			obs, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			if err := obs.Close(context.Background()); err != nil { // stop the emitter: emit runs here
				b.Fatal(err)
			}
			r := &roomRec{roomState: roomState{roomHead: roomHead{id: 5, created: 0, retiredAt: 5e6, status: kv.StatusSuccess, retired: true, keep: keepSampled}, roomBody: roomBody{chunks: 2, transfers: 2, pages: 4, bytes: 4096}}}
			r.putEvent(1e6, kv.StatusWaitingForInput, 0)
			r.putEvent(2e6, kv.StatusTransferring, 0)
			r.putEvent(4e6, kv.StatusSuccess, 0)
			r.putSpan(xferRec{seq: 1, chunk: 0, pages: 2, start: 2e6, end: 3e6, flags: xDone}, "a")
			r.putSpan(xferRec{seq: 2, chunk: 1, pages: 2, start: 3e6, end: 4e6, flags: xDone | xLast}, "a")
			b.ReportAllocs()
			for b.Loop() {
				obs.emit(r)
			}
		})
	}
}

// BenchmarkRoomsAlone drives whole rooms (as BenchmarkTelemetryOverhead) in
// batches of 1,000 through one engine alone, without an observer ("off") or
// with tracing at ratio 0.1 and metrics ("on"): for CPU profiles and
// allocation counts of one side (-benchmem: per room).
func BenchmarkRoomsAlone(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			var obs *Observer
			eng := benchEngine(b, nil, false)
			if on {
				obs = benchTelemetry(b, Sampling{Ratio: 0.1}, false)
				eng = benchEngine(b, obs, false)
			}
			b.ReportAllocs()
			cpu := runBatches(b, obs, func(ids []uint64, next uint64) { lifecycle(eng, ids, next) })
			b.ReportMetric(float64(cpu.Nanoseconds())/1e3, "cpu-us/room")
		})
	}
}

// runBatches has drive run batches of 1,000 rooms from room next on (ids
// is the batch's), flushing obs (if any) after each: one to warm up, then
// b.N rooms timed. It returns the process's CPU per room.
func runBatches(b *testing.B, obs *Observer, drive func(ids []uint64, next uint64)) time.Duration {
	const batch = 1000
	ids := make([]uint64, batch)
	run := func(next uint64) {
		drive(ids, next)
		if obs != nil {
			if err := obs.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}
	run(1 << 40)
	b.ResetTimer()
	c0 := cpuTime()
	next := uint64(1)
	for ; int(next-1) < b.N; next += batch {
		run(next)
	}
	b.StopTimer()
	return (cpuTime() - c0) / time.Duration(next-1)
}

// BenchmarkRoomsCounted drives whole rooms as BenchmarkRoomsAlone does, but
// with blocking polls (Engine.PollSync: no poll loop that spins while rooms
// finish), through one engine per configuration: off, metrics only,
// tracing at ratio 0 and at ratio 0.1. It is the workload of
// scripts/telemetry-counts.sh, which runs it under cachegrind (one thread
// at a time, no garbage collector) to count each configuration's
// instructions and simulated cache misses per room: counts that do not
// move with the machine's load, where times on a shared 2-core box move by
// a few percent from run to run.
func BenchmarkRoomsCounted(b *testing.B) {
	for _, mode := range []string{"off", "metrics-only", "ratio-0", "ratio-0.1"} {
		b.Run(mode, func(b *testing.B) {
			var obs *Observer
			switch mode {
			case "metrics-only":
				obs = benchMetricsOnly(b)
			case "ratio-0":
				obs = benchTelemetry(b, Sampling{Ratio: 0}, false)
			case "ratio-0.1":
				obs = benchTelemetry(b, Sampling{Ratio: 0.1}, false)
			}
			eng := benchEngine(b, nil, false)
			if obs != nil {
				eng = benchEngine(b, obs, false)
			}
			var out []kv.Reply
			cpu := runBatches(b, obs, func(ids []uint64, next uint64) { out = syncLifecycle(b, eng, ids, out, next) })
			b.ReportMetric(float64(cpu.Nanoseconds()), "cpu-ns/room")
		})
	}
}

// syncLifecycle is lifecycle with one blocking poll per phase: the rooms'
// writes complete inside Post, so once the shards handled every Send the
// rooms have succeeded, and once they handled every Clear they retired.
// It returns out, grown to len(ids) if it was shorter, for the next batch.
func syncLifecycle(b *testing.B, eng *actors.Engine, ids []uint64, out []kv.Reply, next uint64) []kv.Reply {
	startRooms(eng, ids, next)
	out = eng.PollSync(ids, out)
	for i, r := range out {
		if r.Status != kv.StatusSuccess {
			b.Fatalf("room %d: %v/%v after its Sends, want Success", ids[i], r.Status, r.Reason)
		}
	}
	for _, id := range ids {
		eng.Clear(id)
	}
	return eng.PollSync(ids, out)
}

// startRooms names len(ids) rooms from next on in ids, and sends each of them
// its whole story up to Success: Open, one transfer info, Init, two chunks.
func startRooms(eng *actors.Engine, ids []uint64, next uint64) {
	ti := room.TransferInfo{Agent: "a", DstPages: []int32{1, 2, 3, 4}, Required: 1}
	p1, p2 := []int32{1, 2}, []int32{3, 4}
	for i := range ids {
		ids[i] = next + uint64(i)
		eng.Open(ids[i])
		eng.TransferInfo(ids[i], ti)
		eng.Init(ids[i], 4, 0)
		eng.Send(ids[i], p1, nil)
		eng.Send(ids[i], p2, nil)
	}
}
