package daemon

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/telemetry"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// otlpReceiver is a fake OTLP/HTTP collector: it decodes every POST
// /v1/traces and keeps the spans.
type otlpReceiver struct {
	mu       sync.Mutex
	requests int
	ctypes   []string
	spans    []receivedSpan
	service  string
}

type receivedSpan struct {
	name           string
	traceID        []byte
	parentSpanID   []byte
	spanID         []byte
	attrs          map[string]string
	status         int32
	start, end     uint64
	events         []string
	droppedEvents  uint32
	instrumentName string
}

func (rc *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.requests++
	rc.ctypes = append(rc.ctypes, r.Header.Get("Content-Type"))
	for _, rs := range req.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				rc.service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				got := receivedSpan{name: s.Name, traceID: s.TraceId, parentSpanID: s.ParentSpanId, spanID: s.SpanId,
					attrs: map[string]string{}, status: int32(s.GetStatus().GetCode()), start: s.StartTimeUnixNano,
					end: s.EndTimeUnixNano, droppedEvents: s.DroppedEventsCount, instrumentName: ss.GetScope().GetName()}
				for _, a := range s.Attributes {
					v := a.GetValue()
					switch {
					case v.GetStringValue() != "":
						got.attrs[a.Key] = v.GetStringValue()
					case v.GetArrayValue() != nil:
						var parts []string
						for _, e := range v.GetArrayValue().Values {
							parts = append(parts, e.GetStringValue())
						}
						got.attrs[a.Key] = strings.Join(parts, ",")
					default:
						got.attrs[a.Key] = strconv.FormatInt(v.GetIntValue(), 10)
					}
				}
				for _, e := range s.Events {
					st := ""
					for _, a := range e.Attributes {
						if a.Key == "kv_transfer.status" {
							st = a.GetValue().GetStringValue()
						}
					}
					got.events = append(got.events, st)
				}
				rc.spans = append(rc.spans, got)
			}
		}
	}
	rc.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Write(out)
}

func (rc *otlpReceiver) named(name string) []receivedSpan {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []receivedSpan
	for _, s := range rc.spans {
		if s.name == name {
			out = append(out, s)
		}
	}
	return out
}

// setupTelemetry builds telemetry from env (as kvxferd does) and a daemon
// that uses it: the observer in the engine, /metrics on the debug server.
func setupTelemetry(t *testing.T, env map[string]string, clk clock.Clock, dialect wire.Dialect) (*telemetry.Telemetry, *Daemon) {
	t.Helper()
	tel, err := telemetry.Setup(t.Context(), telemetry.Options{
		ServiceName: "kvxferd-test", BytesPerPage: 2 * layers * item, Clock: clk,
		Getenv: func(k string) string { return env[k] },
	})
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemonWith(t, func(c *Config) {
		c.Dialect = dialect
		c.Engine.Observer = tel.Observer
		c.Engine.Clock = clk
		c.Metrics = tel.Metrics
	})
	tel.Observer.Attach(d)
	// Cleanups run last-in first-out: the daemon's Shutdown (registered by
	// startDaemonWith) runs before this one, as in kvxferd.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tel.Shutdown(ctx)
	})
	return tel, d
}

const schedTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// kvxferd exports the room's spans over OTLP/HTTP to a collector named by
// the standard environment variables: one room span in the scheduler's trace
// (traceparent passed at Open over the control API), one child span per
// chunk, the status events, and the attributes.
func TestDaemonExportsRoomSpansOverOTLPHTTP(t *testing.T) {
	rc := &otlpReceiver{}
	col := httptest.NewServer(rc)
	defer col.Close()
	// The OTLP exporter reads these from the process environment.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": col.URL, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
	tel, d := setupTelemetry(t, env, clock.Real{}, wire.DialectUnknown)
	if !strings.Contains(tel.Tracing, "tracing on: OTLP http/protobuf") {
		t.Fatalf("tracing: %s", tel.Tracing)
	}
	s := newScheduler(t, d)
	dec := newDecode(t, d)

	const id = 3003
	src, dst := []int32{3, 4, 5, 6, 7}, []int32{20, 21, 22, 23, 24}
	for j, slot := range src {
		s.fill(id, int(slot), j)
	}
	s.writeAux(2, id)
	dec.checker.Expect(id, 1, false)
	dec.send(t, dec.info(id, dst, 5, 1))
	// Decode's transfer info creates the room first (it is WaitingForInput
	// before the sender exists, as upstream); the traced Open joins it.
	waitStatus(t, s, id, kv.StatusWaitingForInput)
	if traced, err := s.cli.Open(id, schedTraceparent); err != nil || !traced {
		t.Fatalf("open: traced=%v err=%v", traced, err)
	}
	s.cli.Init(id, len(src), 2)
	s.cli.Send(id, src[:3], nil)
	s.cli.Send(id, src[3:], nil)
	if rep := s.waitTerminal(t, id); rep.Status != kv.StatusSuccess {
		t.Fatalf("room ended %v/%v", rep.Status, rep.Reason)
	}
	dec.waitDone(t, id)
	s.cli.Clear(id)
	s.cli.Poll([]uint64{id}, nil) // the room handled Clear: it retired
	if err := tel.Observer.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}

	rooms := rc.named(telemetry.RoomSpan)
	if len(rooms) != 1 {
		t.Fatalf("%d room spans received, want 1", len(rooms))
	}
	r := rooms[0]
	if got := hexOf(r.traceID); got != "0af7651916cd43dd8448eb211c80319c" || hexOf(r.parentSpanID) != "b7ad6b7169203331" {
		t.Fatalf("room span trace %s parent %s: not in the scheduler's trace", got, hexOf(r.parentSpanID))
	}
	for k, v := range map[string]string{
		"pd.bootstrap_room": strconv.Itoa(id), "pd.role": "prefill", "kv_transfer.chunks": "2",
		"kv_transfer.transfers": "2", "kv_transfer.pages": "5", "kv_transfer.bytes": strconv.Itoa(5 * 2 * layers * item),
		"kv_transfer.status": "Success", "kv_transfer.peer.agent": dec.node.Agent.Name(),
	} {
		if r.attrs[k] != v {
			t.Fatalf("room span %s = %q, want %q (all: %v)", k, r.attrs[k], v, r.attrs)
		}
	}
	if strings.Join(r.events, ",") != "WaitingForInput,Transferring,Success" {
		t.Fatalf("events %v", r.events)
	}
	if r.end <= r.start {
		t.Fatal("room span has no duration")
	}
	children := rc.named(telemetry.TransferSpan)
	if len(children) != 2 {
		t.Fatalf("%d transfer spans, want one per chunk", len(children))
	}
	for _, c := range children {
		if hexOf(c.parentSpanID) != hexOf(r.spanID) || hexOf(c.traceID) != hexOf(r.traceID) {
			t.Fatal("transfer span is not the room span's child")
		}
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.service != "kvxferd-test" || rc.ctypes[0] != "application/x-protobuf" {
		t.Fatalf("service %q content-type %q", rc.service, rc.ctypes[0])
	}
}

// waitStatus polls over the control API until the room reports want; frames
// from decode arrive asynchronously, and the bound only turns a hang into a
// failure.
func waitStatus(t *testing.T, s *scheduler, id uint64, want kv.Status) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		reps, err := s.cli.Poll([]uint64{id}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if reps[0].Status == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("room %d: %v, want %v", id, reps[0].Status, want)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// scrape reads /metrics from the daemon's debug server.
func scrape(t *testing.T, d *Daemon) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + d.DebugAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

func wantMetrics(t *testing.T, m map[string]float64, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		got, ok := m[k]
		if !ok || got != v {
			t.Fatalf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
}

// /metrics on kvxferd's debug server during a workload: rooms by status,
// bytes, bad frames from the daemon's counters, the pool's queue depth, and
// the oldest-non-terminal age, which grows with stuck rooms (the engine's
// fake clock) and falls back once they are aborted.
func TestDaemonMetricsDuringWorkload(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	_, d := setupTelemetry(t, map[string]string{}, clk, wire.DialectUnknown)
	m := scrape(t, d)
	wantMetrics(t, m, map[string]float64{`kvxfer_rooms_created_total`: 0, `kvxfer_pool_inflight`: 0, `kvxfer_bad_frames_total`: 0})
	s := newScheduler(t, d)
	dec := newDecode(t, d)

	// One room moves end to end.
	const ok = 4001
	dec.checker.Expect(ok, 1, false)
	dec.send(t, dec.info(ok, []int32{30, 31}, 3, 1))
	s.start(t, roomSpec{id: ok, src: []int32{10, 11}, chunks: []int{2}, aux: 3})
	if rep := s.waitTerminal(t, ok); rep.Status != kv.StatusSuccess {
		t.Fatalf("room %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, ok, []int32{30, 31}, 3)
	// A garbage frame: counted by the daemon, scraped from Counters().
	dec.send(t, [][]byte{[]byte("GARBAGE")})
	// Twenty rooms the scheduler opens but decode never names: they sit in
	// Bootstrapping (silent pins, if nothing bounded them).
	var stuck []uint64
	for i := range 20 {
		stuck = append(stuck, uint64(5000+i))
		s.cli.Open(stuck[i], "")
	}
	s.cli.Poll(stuck, nil)
	clk.Advance(120 * time.Second) // below the 300 s bootstrap deadline

	waitBadFrames(t, d, 1)
	m = scrape(t, d)
	wantMetrics(t, m, map[string]float64{
		`kvxfer_decode_peers{sglang_dialect="0.5.20"}`:   1,
		`kvxfer_decode_peers{sglang_dialect="0.5.23"}`:   0,
		`kvxfer_decode_peers{sglang_dialect="rejected"}`: 0,
		`kvxfer_rooms_created_total`:                     21,
		`kvxfer_rooms{status="Bootstrapping"}`:           20,
		`kvxfer_rooms{status="Success"}`:                 1,
		`kvxfer_transfers_posted_total`:                  1,
		`kvxfer_transfers_completed_total{outcome="ok"}`: 1,
		`kvxfer_transfer_bytes_total{outcome="ok"}`:      2 * 2 * layers * item,
		`kvxfer_nonterminal_rooms`:                       20,
		`kvxfer_oldest_nonterminal_room_age_seconds`:     120,
		`kvxfer_bad_frames_total`:                        1,
		`kvxfer_pool_posted_total`:                       1,
		`kvxfer_pool_inflight`:                           0,
		`kvxfer_pool_quarantined_total`:                  0,
	})

	// The scheduler aborts the stuck rooms: the gauge stays bounded.
	if err := s.cli.Abort(stuck...); err != nil {
		t.Fatal(err)
	}
	s.cli.Poll(stuck, nil)
	s.cli.Clear(append(stuck, ok)...)
	s.cli.Poll(append(stuck, ok), nil)
	m = scrape(t, d)
	wantMetrics(t, m, map[string]float64{
		`kvxfer_oldest_nonterminal_room_age_seconds`:                                  0,
		`kvxfer_nonterminal_rooms`:                                                    0,
		`kvxfer_room_failures_total{reason="client_abort"}`:                           20,
		`kvxfer_rooms_retired_total{status="Failed"}`:                                 20,
		`kvxfer_rooms_retired_total{status="Success"}`:                                1,
		`kvxfer_rooms{status="Bootstrapping"}`:                                        0,
		`kvxfer_room_status_duration_seconds_bucket{status="Bootstrapping",le="120"}`: 21, // 20 stuck for 120 s, one for 0 s
	})
	// Every daemon counter is exported (a new one must be added to
	// telemetry's list).
	for k := range d.Counters() {
		if !exported(m, k) {
			t.Errorf("daemon counter %q is not exported (as kvxfer_%s_total, the gauge kvxfer_%s, or a labelled kvxfer_<head>_total{…=\"<tail>\"})", k, k, k)
		}
	}
	if _, ok := m[`target_info{service_name="kvxferd-test",telemetry_sdk_language="go",telemetry_sdk_name="opentelemetry",telemetry_sdk_version="1.47.0"}`]; !ok {
		t.Fatal("no target_info")
	}
}

// waitBadFrames waits until the ingest loop counted n bad frames: a frame
// travels from decode's PUSH socket to the daemon's PULL socket
// asynchronously. Bounded polling: the bound only turns a hang into a failure.
func waitBadFrames(t *testing.T, d *Daemon, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for d.Counters()["bad_frames"] < n {
		if time.Now().After(deadline) {
			t.Fatalf("bad frames %d, want %d", d.Counters()["bad_frames"], n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// exported says whether daemon counter k is in the scrape m: as a counter
// kvxfer_k_total, a gauge kvxfer_k, or split at an underscore into a
// counter kvxfer_<head>_total with a label whose value is <tail>
// (shm_clients_lost_bad_record → kvxfer_shm_clients_lost_total{cause="bad_record"}).
func exported(m map[string]float64, k string) bool {
	if _, ok := m["kvxfer_"+k+"_total"]; ok {
		return true
	}
	if _, ok := m["kvxfer_"+k]; ok {
		return true
	}
	for i := strings.Index(k, "_"); i > 0; i = nextUnderscore(k, i) {
		head, tail := k[:i], k[i+1:]
		for name := range m {
			if strings.HasPrefix(name, "kvxfer_"+head+"_total{") && strings.Contains(name, `="`+tail+`"`) {
				return true
			}
		}
	}
	return false
}

func nextUnderscore(k string, i int) int {
	j := strings.Index(k[i+1:], "_")
	if j < 0 {
		return -1
	}
	return i + 1 + j
}
