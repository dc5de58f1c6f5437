package telemetry

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

func attrOf(kvs []attribute.KeyValue, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range kvs {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func mustAttr(t *testing.T, what string, kvs []attribute.KeyValue, k attribute.Key) attribute.Value {
	t.Helper()
	v, ok := attrOf(kvs, k)
	if !ok {
		t.Fatalf("%s: no attribute %s in %v", what, k, kvs)
	}
	return v
}

func roomSpanOf(t *testing.T, h *harness, id uint64) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range h.spans(RoomSpan) {
		if v, _ := attrOf(s.Attributes, AttrBootstrapRoom); v.AsInt64() == int64(id) {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("room %d: %d room spans, want exactly 1", id, len(found))
	}
	return found[0]
}

func statusEvents(t *testing.T, s tracetest.SpanStub) []string {
	t.Helper()
	var out []string
	for _, e := range s.Events {
		if e.Name != StatusEvent {
			t.Fatalf("unexpected event %q", e.Name)
		}
		st := mustAttr(t, "event", e.Attributes, AttrStatus).AsString()
		if et, ok := attrOf(e.Attributes, AttrErrorType); ok {
			st += "/" + et.AsString()
		}
		out = append(out, st)
	}
	return out
}

// A room with two decode agents and three chunks, every step chosen by the
// test on a fake clock: one room span, one status event per change at the
// exact time, six child spans (3 chunks × 2 agents) with their own times, and
// the room attributes.
func TestSuccessfulMultiChunkRoom(t *testing.T) {
	t.Run("direct", func(t *testing.T) { testSuccessfulMultiChunkRoom(t, nil) })
	t.Run("sdk", func(t *testing.T) { testSuccessfulMultiChunkRoom(t, func(c *Config) { c.Exporter = nil }) })
}

func testSuccessfulMultiChunkRoom(t *testing.T, mod func(*Config)) {
	xf := &manualXfers{}
	h := newHarness(t, xf, mod)
	const id = 4242
	step := 10 * time.Millisecond
	h.eng.Open(id)
	h.eng.TransferInfo(id, info("agent-a", 6, 2))
	h.expect(id, kv.StatusBootstrapping) // one of two infos; created at +0
	h.clk.Advance(step)
	h.eng.TransferInfo(id, info("agent-b", 6, 2))
	h.expect(id, kv.StatusWaitingForInput) // at +10ms
	h.eng.Init(id, 6, 3)
	for c := range 3 {
		h.clk.Advance(step)
		h.eng.Send(id, []int32{int32(2 * c), int32(2*c + 1)}, nil)
		h.expect(id, kv.StatusTransferring)
		if n := xf.count(); n != 2 {
			t.Fatalf("chunk %d: %d transfers posted, want one per agent", c, n)
		}
		h.clk.Advance(step)
		xf.complete(kv.ReasonNone)
		h.poll(id) // the completions reached the room first (same mailbox, sent before)
	}
	h.expect(id, kv.StatusSuccess) // at +70ms
	h.clk.Advance(step)
	h.retire(id) // at +80ms

	sp := roomSpanOf(t, h, id)
	if len(h.spans(RoomSpan)) != 1 {
		t.Fatalf("%d room spans", len(h.spans(RoomSpan)))
	}
	// The published status stays Transferring between chunks (as upstream).
	want := []string{"WaitingForInput", "Transferring", "Success"}
	if got := statusEvents(t, sp); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	wantAt := []time.Duration{10, 20, 70}
	for i, e := range sp.Events {
		if got := e.Time.Sub(epoch); got != wantAt[i]*time.Millisecond {
			t.Fatalf("event %d at %v, want %v", i, got, wantAt[i]*time.Millisecond)
		}
	}
	if !sp.StartTime.Equal(epoch) || !sp.EndTime.Equal(epoch.Add(80*time.Millisecond)) {
		t.Fatalf("room span %v..%v", sp.StartTime.Sub(epoch), sp.EndTime.Sub(epoch))
	}
	if sp.Status.Code == codes.Error {
		t.Fatalf("status %+v", sp.Status)
	}
	for k, v := range map[attribute.Key]any{
		AttrRole: "prefill", AttrChunks: int64(3), AttrTransfers: int64(6), AttrPages: int64(12),
		AttrBytes: int64(12 << 20), AttrStatus: "Success", AttrBackend: "nixl", AttrRequired: int64(2),
	} {
		if got := mustAttr(t, "room span", sp.Attributes, k).AsInterface(); got != v {
			t.Fatalf("%s = %v, want %v", k, got, v)
		}
	}
	if got := mustAttr(t, "room span", sp.Attributes, AttrPeerAgent).AsStringSlice(); fmt.Sprint(got) != "[agent-a agent-b]" {
		t.Fatalf("agents %v", got)
	}
	if _, ok := attrOf(sp.Attributes, AttrErrorType); ok {
		t.Fatal("error.type on a successful room")
	}
	children := h.spans(TransferSpan)
	if len(children) != 6 {
		t.Fatalf("%d transfer spans, want 6", len(children))
	}
	perAgent := map[string]int{}
	for _, c := range children {
		if c.Parent.SpanID() != sp.SpanContext.SpanID() || c.SpanContext.TraceID() != sp.SpanContext.TraceID() {
			t.Fatal("transfer span is not a child of the room span")
		}
		perAgent[mustAttr(t, "transfer", c.Attributes, AttrPeerAgent).AsString()]++
		chunk := mustAttr(t, "transfer", c.Attributes, AttrChunk).AsInt64()
		start := time.Duration(20+20*chunk) * time.Millisecond
		if c.StartTime.Sub(epoch) != start || c.EndTime.Sub(c.StartTime) != step {
			t.Fatalf("chunk %d span %v..%v", chunk, c.StartTime.Sub(epoch), c.EndTime.Sub(epoch))
		}
		if mustAttr(t, "transfer", c.Attributes, AttrBytes).AsInt64() != 2<<20 {
			t.Fatal("transfer bytes")
		}
		if last := mustAttr(t, "transfer", c.Attributes, AttrLast).AsBool(); last != (chunk == 2) {
			t.Fatalf("chunk %d last=%v", chunk, last)
		}
	}
	if perAgent["agent-a"] != 3 || perAgent["agent-b"] != 3 {
		t.Fatalf("transfer spans per agent %v", perAgent)
	}

	ms := h.metrics()
	if v := h.value(ms, "kvxfer_transfer_bytes", "outcome", "ok"); v != 12<<20 {
		t.Fatalf("bytes ok %d", v)
	}
	if v := h.value(ms, "kvxfer_rooms_retired", "status", "Success"); v != 1 {
		t.Fatalf("retired success %d", v)
	}
	if v := h.value(ms, "kvxfer_trace_rooms", "decision", "kept_by_ratio"); v != 1 {
		t.Fatalf("kept %d", v)
	}
	hist := ms["kvxfer_room_status_duration"].Data.(metricdataHistogram)
	for _, p := range hist.DataPoints {
		st, _ := p.Attributes.Value("status")
		want := map[string]uint64{"Bootstrapping": 1, "WaitingForInput": 1, "Transferring": 1, "Success": 1}[st.AsString()]
		if p.Count != want {
			t.Fatalf("time in %s: %d observations, want %d", st.AsString(), p.Count, want)
		}
	}
}

// Every failure reason ends up as error.type on the room span, on the Failed
// event and in the failures counter.
func TestEveryFailureReasonIsErrorType(t *testing.T) {
	cfg := room.DefaultConfig()
	drive := map[kv.Reason]func(h *harness, id uint64){
		kv.ReasonDecodeAbort: func(h *harness, id uint64) {
			h.eng.Open(id)
			h.eng.DecodeAbort(id, kv.Endpoint{IP: "127.0.0.1", Port: 1})
		},
		kv.ReasonClientAbort: func(h *harness, id uint64) { h.eng.Open(id); h.eng.Abort(id) },
		kv.ReasonBootstrapTimeout: func(h *harness, id uint64) {
			h.eng.Open(id)
			h.expect(id, kv.StatusBootstrapping)
			h.clk.Advance(cfg.Bootstrap)
		},
		kv.ReasonWaitingTimeout: func(h *harness, id uint64) {
			h.eng.Open(id)
			h.eng.TransferInfo(id, info("a", 2, 1))
			h.expect(id, kv.StatusWaitingForInput)
			h.clk.Advance(cfg.Waiting)
		},
		kv.ReasonTransferTimeout: func(h *harness, id uint64) {
			h.eng.Open(id)
			h.eng.TransferInfo(id, info("a", 2, 1))
			h.eng.Init(id, 2, 0)
			h.eng.Send(id, []int32{1, 2}, nil)
			h.expect(id, kv.StatusTransferring)
			h.clk.Advance(cfg.Transfer)
			h.expect(id, kv.StatusFailed)
			h.clk.Advance(cfg.Drain) // the write never completes: drain expires
		},
		kv.ReasonTransferError: func(h *harness, id uint64) {
			h.eng.Open(id)
			h.eng.TransferInfo(id, info("a", 2, 1))
			h.eng.Init(id, 2, 0)
			h.eng.Send(id, []int32{1, 2}, nil)
			h.expect(id, kv.StatusTransferring)
			h.xf.complete(kv.ReasonTransferError)
		},
		kv.ReasonPeerLost: func(h *harness, id uint64) {
			h.eng.Open(id)
			h.eng.TransferInfo(id, info("a", 2, 1))
			h.expect(id, kv.StatusWaitingForInput)
			h.eng.PeerLost("a")
		},
		kv.ReasonInvalidRequest: func(h *harness, id uint64) { h.eng.Open(id); h.eng.Init(id, -1, 0) },
		kv.ReasonInternalError: func(h *harness, id uint64) {
			h.xf.panicOn = func(kv.Transfer) bool { return true }
			h.eng.Open(id)
			h.eng.TransferInfo(id, info("a", 2, 1))
			h.eng.Init(id, 2, 0)
			h.eng.Send(id, []int32{1, 2}, nil)
			h.expect(id, kv.StatusFailed)
			h.clk.Advance(cfg.Drain) // the post panicked: nothing will complete
		},
		kv.ReasonShutdown: func(h *harness, id uint64) { h.eng.Open(id); h.eng.Fail(id, kv.ReasonShutdown) },
		kv.ReasonPeerRejected: func(h *harness, id uint64) {
			h.eng.Open(id)
			h.eng.TransferInfo(id, info("a", 2, 1))
			h.eng.Fail(id, kv.ReasonPeerRejected) // what kvxferd does for a rejected agent's info
		},
		kv.ReasonClientLost: func(h *harness, id uint64) {
			h.eng.Open(id)
			h.expect(id, kv.StatusBootstrapping)
			h.eng.Fail(id, kv.ReasonClientLost) // what kvxferd does for a lost shared-memory client's open rooms
		},
		kv.ReasonTransferProcessLost: func(h *harness, id uint64) {
			h.eng.Fail(id, kv.ReasonTransferProcessLost) // a lost predecessor's room, named by the scheduler
		},
		kv.ReasonRoomCap: func(h *harness, id uint64) {
			h.capped(1)
			h.eng.Open(id + 1)
			h.expect(id+1, kv.StatusBootstrapping)
			h.eng.Open(id) // beyond the cap: refused
		},
	}
	for _, why := range kv.Reasons() {
		t.Run(why.String(), func(t *testing.T) {
			run, ok := drive[why]
			if !ok {
				t.Fatalf("no scenario for reason %s: add one", why)
			}
			// Sampling would drop every successful room: failures are kept anyway.
			h := newHarness(t, &manualXfers{}, func(c *Config) { c.Sampling = &Sampling{Ratio: 0} })
			const id = 99
			run(h, id)
			h.expect(id, kv.StatusFailed)
			h.retire(id)
			sp := roomSpanOf(t, h, id)
			if got := mustAttr(t, "room span", sp.Attributes, AttrErrorType).AsString(); got != why.String() {
				t.Fatalf("error.type %q", got)
			}
			if sp.Status.Code != codes.Error || sp.Status.Description != why.String() {
				t.Fatalf("span status %+v", sp.Status)
			}
			ev := statusEvents(t, sp)
			if len(ev) == 0 || ev[len(ev)-1] != "Failed/"+why.String() {
				t.Fatalf("events %v", ev)
			}
			if got := mustAttr(t, "room span", sp.Attributes, AttrSampled).AsString(); got != "kept_failed" {
				t.Fatalf("sampling %q", got)
			}
			ms := h.metrics()
			if v := h.value(ms, "kvxfer_room_failures", "reason", why.String()); v != 1 {
				t.Fatalf("failures{reason=%s} = %d", why, v)
			}
			switch why {
			case kv.ReasonRoomCap:
				if v := h.value(ms, "kvxfer_rooms_refused", "cause", "room_cap"); v != 1 {
					t.Fatalf("refused{cause=room_cap} = %d", v)
				}
			case kv.ReasonTransferError:
				c := h.spans(TransferSpan)
				if len(c) != 1 || mustAttr(t, "transfer", c[0].Attributes, AttrErrorType).AsString() != "transfer_error" || c[0].Status.Code != codes.Error {
					t.Fatalf("transfer spans %+v", c)
				}
			case kv.ReasonTransferTimeout:
				c := h.spans(TransferSpan)
				if len(c) != 1 || !mustAttr(t, "transfer", c[0].Attributes, AttrAbandoned).AsBool() {
					t.Fatalf("abandoned transfer span %+v", c)
				}
			}
		})
	}
}

// capped replaces h's engine with one of a single shard that keeps at most
// rooms live rooms.
func (h *harness) capped(rooms int) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = h.eng.Close(ctx)
	eng, err := actors.New(actors.Config{Clock: h.clk, Transfers: h.xf, Observer: h.obs, Shards: 1, RoomCap: rooms})
	if err != nil {
		h.t.Fatal(err)
	}
	h.eng = eng
	h.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Close(ctx)
	})
}

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// The scheduler's traceparent puts the room span in its trace, whether the
// room was created by decode's transfer info first or by the Open itself,
// and even when the parent was not sampled (the tail sampler decides).
func TestTraceparentJoinsSchedulerTrace(t *testing.T) {
	parent, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	parentSpan, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sdk := func(c *Config) { c.Exporter = nil }
	for _, tc := range []struct {
		name        string
		decodeFirst bool
		mod         func(*Config)
	}{{"decode info first", true, nil}, {"open first", false, nil}, {"decode info first via sdk", true, sdk}, {"open first via sdk", false, sdk}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, &manualXfers{auto: true}, tc.mod)
			const id = 7
			if tc.decodeFirst {
				h.eng.TransferInfo(id, info("a", 2, 1))
				h.expect(id, kv.StatusWaitingForInput) // as upstream, before the sender exists
			}
			h.clk.Advance(time.Millisecond)
			h.eng.OpenTraced(id, traceparent)
			if !tc.decodeFirst {
				h.eng.TransferInfo(id, info("a", 2, 1))
			}
			h.eng.Init(id, 2, 0)
			h.eng.Send(id, []int32{1, 2}, nil)
			h.expect(id, kv.StatusSuccess)
			h.retire(id)
			sp := roomSpanOf(t, h, id)
			if sp.SpanContext.TraceID() != parent || sp.Parent.SpanID() != parentSpan || !sp.Parent.IsRemote() {
				t.Fatalf("room span trace %s parent %s", sp.SpanContext.TraceID(), sp.Parent.SpanID())
			}
			created := epoch
			if !tc.decodeFirst {
				created = epoch.Add(time.Millisecond)
			}
			if !sp.StartTime.Equal(created) {
				t.Fatalf("room span starts at +%v, want the room's creation", sp.StartTime.Sub(epoch))
			}
			for _, c := range h.spans(TransferSpan) {
				if c.SpanContext.TraceID() != parent {
					t.Fatal("transfer span outside the scheduler's trace")
				}
			}
		})
	}
}

// The tail sampler: with ratio 0 a quick successful room is dropped, a slow
// one and a failed one are kept; parent-based sampling follows the flag.
func TestTailSampling(t *testing.T) {
	h := newHarness(t, &manualXfers{auto: true}, func(c *Config) { c.Sampling = &Sampling{Ratio: 0, Slow: time.Second} })
	run := func(id uint64, wait time.Duration, fail bool) {
		if id == 3 {
			h.eng.OpenTraced(id, traceparent) // sampled parent, but not parent-based
		} else {
			h.eng.Open(id)
		}
		h.eng.TransferInfo(id, info("a", 2, 1))
		h.expect(id, kv.StatusWaitingForInput)
		h.clk.Advance(wait)
		if fail {
			h.eng.Abort(id)
			h.expect(id, kv.StatusFailed)
		} else {
			h.eng.Init(id, 2, 0)
			h.eng.Send(id, []int32{1, 2}, nil)
			h.expect(id, kv.StatusSuccess)
		}
		h.retire(id)
	}
	run(1, time.Millisecond, false) // quick: dropped
	run(2, 2*time.Second, false)    // slow: kept
	run(3, time.Millisecond, false) // quick, parent sampled, ratio 0: dropped
	run(4, time.Millisecond, true)  // failed: kept
	got := map[int64]string{}
	for _, s := range h.spans(RoomSpan) {
		got[mustAttr(t, "room", s.Attributes, AttrBootstrapRoom).AsInt64()] = mustAttr(t, "room", s.Attributes, AttrSampled).AsString()
	}
	if fmt.Sprint(got) != "map[2:kept_slow 4:kept_failed]" {
		t.Fatalf("kept %v", got)
	}
	ms := h.metrics()
	if v := h.value(ms, "kvxfer_trace_rooms", "decision", "dropped_by_ratio"); v != 2 {
		t.Fatalf("dropped %d", v)
	}

	pb := Sampling{Ratio: 0, ParentBased: true, Slow: -1}
	h2 := newHarness(t, &manualXfers{auto: true}, func(c *Config) { c.Sampling = &pb })
	h = h2
	run(3, time.Millisecond, false)
	if n := len(h2.spans(RoomSpan)); n != 1 {
		t.Fatalf("parent-based: %d room spans, want the sampled parent's room", n)
	}

	// Ratio sampling is by room id (no parent): about half of 400 rooms at 0.5.
	h3 := newHarness(t, &manualXfers{auto: true}, func(c *Config) { c.Sampling = &Sampling{Ratio: 0.5, Slow: -1} })
	kept := 0
	for id := uint64(1); id <= 400; id++ {
		r := &roomRec{roomState: roomState{roomHead: roomHead{id: id, status: kv.StatusSuccess}}}
		if h3.obs.sampling.decide(r) == keepSampled {
			kept++
		}
	}
	if kept < 150 || kept > 250 {
		t.Fatalf("ratio 0.5 kept %d of 400", kept)
	}
}

// Memory stays bounded: rooms over MaxRooms are counted, not tracked; child spans over MaxTransferSpans and events over MaxEvents
// are counted on the room span.
func TestBounds(t *testing.T) {
	h := newHarness(t, &manualXfers{auto: true}, func(c *Config) {
		c.MaxRooms = 2
		c.MaxTransferSpans = 2
		c.MaxEvents = 2
	})
	ids := []uint64{1, 2, 3, 4}
	for _, id := range ids[:3] {
		h.eng.Open(id)
		h.poll(id) // created in this order
	}
	ms := h.metrics()
	if v := h.value(ms, "kvxfer_telemetry_untracked_rooms", "", ""); v != 1 {
		t.Fatalf("untracked %d", v)
	}
	// The live gauge counts every live room (the engine's shards report
	// them), tracked or not; two records are kept.
	if v := h.value(ms, "kvxfer_rooms", "status", "Bootstrapping"); v != 3 {
		t.Fatalf("live %d", v)
	}
	if n := h.obs.totals().tracked; n != 2 {
		t.Fatalf("tracked %d", n)
	}
	// The first room sends 4 chunks: 4 transfers, 2 spans, and more status
	// changes than MaxEvents.
	id := ids[0]
	h.eng.TransferInfo(id, info("a", 8, 1))
	h.eng.Init(id, 8, 0)
	for c := range 4 {
		h.eng.Send(id, []int32{int32(2 * c), int32(2*c + 1)}, nil)
	}
	h.expect(id, kv.StatusSuccess)
	h.retire(id)
	sp := roomSpanOf(t, h, id)
	if len(sp.Events) != 2 || mustAttr(t, "room", sp.Attributes, AttrDroppedEvents).AsInt64() < 1 {
		t.Fatalf("events %d (dropped attr %v)", len(sp.Events), sp.Attributes)
	}
	if n := len(h.spans(TransferSpan)); n != 2 || mustAttr(t, "room", sp.Attributes, AttrDroppedSpans).AsInt64() != 2 ||
		mustAttr(t, "room", sp.Attributes, AttrTransfers).AsInt64() != 4 {
		t.Fatalf("%d transfer spans, attrs %v", n, sp.Attributes)
	}
	if n := h.obs.totals().tracked; n != 1 {
		t.Fatalf("tracked %d after retiring one of two", n)
	}
	// The freed slot is reused.
	h.eng.Open(ids[3])
	h.poll(ids[3])
	if n := h.obs.totals().tracked; n != 2 {
		t.Fatalf("tracked %d", n)
	}
}

// Close emits the rooms still live, marked as not retired.
func TestCloseEmitsLiveRooms(t *testing.T) {
	h := newHarness(t, &manualXfers{}, nil)
	h.eng.Open(5)
	h.expect(5, kv.StatusBootstrapping)
	h.clk.Advance(time.Second)
	if err := h.obs.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	sp := roomSpanOf(t, h, 5)
	if v, ok := attrOf(sp.Attributes, AttrRetired); !ok || v.AsBool() {
		t.Fatalf("attrs %v", sp.Attributes)
	}
	if sp.EndTime.Sub(sp.StartTime) != time.Second {
		t.Fatalf("duration %v", sp.EndTime.Sub(sp.StartTime))
	}
}
