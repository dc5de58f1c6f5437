package telemetry

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// putSpan appends x as a child span to agent a (tests that build records).
func (r *roomRec) putSpan(x xferRec, a string) {
	i := r.agentIndex(a, true)
	e := r.addXfer()
	*e = x
	e.agent = uint16(i)
	r.nSpans++
}

// putEvent appends a status event at time at (tests that build records).
func (r *roomRec) putEvent(at tick, s kv.Status, why kv.Reason) {
	r.addEvent(newEvent(r.created, at, s, why))
}

// MaxRooms caps the rooms tracked at once: over it a room is untracked
// (counted), and a retired room's record, recycled, makes room for the next.
func TestMaxRoomsCountsRoomsInUse(t *testing.T) {
	o, err := New(Config{MaxRooms: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close(context.Background())
	retire := func(r actors.RoomObserver, id uint64) {
		byFact{r}.Retired(room.Tombstone{Room: id, Status: kv.StatusSuccess, Opened: true})
	}
	r1, r2 := o.created(1), o.created(2)
	if _, ok := r2.(*roomRec); !ok {
		t.Fatal("second room untracked under MaxRooms 2")
	}
	if _, ok := o.created(3).(*untracked); !ok {
		t.Fatal("a third live room was tracked under MaxRooms 2")
	}
	retire(r1, 1)
	r4 := o.created(4)
	if _, ok := r4.(*roomRec); !ok {
		t.Fatal("room untracked although a tracked room retired")
	}
	tt := o.totals()
	if tt.tracked != 2 || tt.untracked != 1 || o.inUse() != 2 {
		t.Fatalf("tracked %d, untracked %d, records in use %d; want 2, 1, 2", tt.tracked, tt.untracked, o.inUse())
	}
	retire(r2, 2)
	retire(r4, 4)
	if n := o.inUse(); n != 0 {
		t.Fatalf("%d records in use after every room retired, want 0", n)
	}

	// A large cap is shared out over stripes: never more than MaxRooms
	// tracked, nearly all of it used by many rooms, all of it given back.
	const max = 4096
	o2, err := New(Config{MaxRooms: max})
	if err != nil {
		t.Fatal(err)
	}
	defer o2.Close(context.Background())
	if o2.capMask == 0 {
		t.Fatal("MaxRooms 4096 counted on one stripe")
	}
	var recs []actors.RoomObserver
	for id := uint64(1); id <= 2*max; id++ {
		recs = append(recs, o2.created(id))
	}
	if n := o2.totals().tracked; n > max || n < max*9/10 || n != o2.inUse() {
		t.Fatalf("%d rooms tracked (%d records in use) of %d, want at most %d and most of it", n, o2.inUse(), 2*max, max)
	}
	for i, r := range recs {
		retire(r, uint64(i+1))
	}
	if n := o2.inUse(); n != 0 {
		t.Fatalf("%d records in use after every room retired, want 0", n)
	}
}

// recordObserver is an Observer on a fake clock whose spans go to an
// in-memory exporter; its emitter is stopped so that the test emits.
func recordObserver(t *testing.T, cfg Config) (*Observer, *clock.Fake, *tracetest.InMemoryExporter) {
	t.Helper()
	clk := clock.NewFake(epoch)
	exp := tracetest.NewInMemoryExporter()
	cfg.Exporter, cfg.Clock, cfg.BytesPerPage = exp, clk, 10
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return o, clk, exp
}

// A room with more transfers, agents and status events than the record
// holds inline spills them, completes its writes out of order, and its spans
// say exactly what happened; the record then serves a small room with
// nothing left of the first.
func TestRecordSpillsAndResets(t *testing.T) {
	o, clk, exp := recordObserver(t, Config{})
	rr := byFact{o.created(1)}
	r := rr.RoomObserver.(*roomRec)
	rr.TransferInfo("a0", 3)
	rr.StatusChanged(kv.StatusWaitingForInput, kv.ReasonNone)
	rr.StatusChanged(kv.StatusTransferring, kv.ReasonNone)
	const n = 9 // three agents, three chunks each, all in flight at once
	for i := range n {
		clk.Advance(time.Millisecond)
		rr.Posted(&kv.Transfer{Room: 1, Agent: fmt.Sprintf("a%d", i%3), Chunk: i / 3, Seq: uint32(i + 1),
			Last: i/3 == 2, SrcPages: make([]int32, i+1)})
	}
	if r.spill&spillX == 0 || r.spill&spillA == 0 {
		t.Fatalf("spill %b after 9 transfers to 3 agents, want transfers and agents spilled", r.spill)
	}
	for i := n - 1; i >= 0; i-- { // newest first; the fifth fails
		clk.Advance(time.Millisecond)
		fail := kv.ReasonNone
		if i == 4 {
			fail = kv.ReasonTransferError
		}
		rr.TransferDone(uint32(i+1), fail)
	}
	rr.TransferDone(3, kv.ReasonNone) // a second completion of one write changes no span
	for _, s := range []kv.Status{kv.StatusTransferring, kv.StatusWaitingForInput, kv.StatusTransferring, kv.StatusWaitingForInput,
		kv.StatusTransferring, kv.StatusFailed} {
		rr.StatusChanged(s, kv.ReasonTransferError)
	}
	rr.Retired(room.Tombstone{Room: 1, Status: kv.StatusFailed, Reason: kv.ReasonTransferError})
	if r.nEv != 8 || r.spill&spillE == 0 {
		t.Fatalf("%d events, spill %b; want 8, spilled", r.nEv, r.spill)
	}
	if err := o.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var children []tracetest.SpanStub
	var root tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == TransferSpan {
			children = append(children, s)
		} else {
			root = s
		}
	}
	if len(children) != n || len(root.Events) != 8 {
		t.Fatalf("%d transfer spans, %d events; want %d, 8", len(children), len(root.Events), n)
	}
	if got := fmt.Sprint(mustAttr(t, "room", root.Attributes, AttrPeerAgent).AsStringSlice()); got != "[a0 a1 a2]" {
		t.Errorf("room agents %s", got)
	}
	if got := mustAttr(t, "room", root.Attributes, AttrBytes).AsInt64(); got != 10*(45-5) {
		t.Errorf("room bytes %d, want %d (all but the failed write's)", got, 10*(45-5))
	}
	for i, c := range children {
		seq := mustAttr(t, "transfer", c.Attributes, AttrSeq).AsInt64()
		if seq != int64(i+1) {
			t.Fatalf("span %d is seq %d: not in posting order", i, seq)
		}
		agent := mustAttr(t, "transfer", c.Attributes, AttrPeerAgent).AsString()
		pages := mustAttr(t, "transfer", c.Attributes, AttrPages).AsInt64()
		last := mustAttr(t, "transfer", c.Attributes, AttrLast).AsBool()
		if agent != fmt.Sprintf("a%d", i%3) || pages != int64(i+1) || last != (i/3 == 2) {
			t.Errorf("span %d: agent %s pages %d last %v", i, agent, pages, last)
		}
		// Posted at i+1 ms, done at 9+(9-i) ms.
		if d := c.EndTime.Sub(c.StartTime); d != time.Duration(17-2*i)*time.Millisecond {
			t.Errorf("span %d lasted %v", i, d)
		}
		if _, failed := attrOf(c.Attributes, AttrErrorType); failed != (i == 4) {
			t.Errorf("span %d: error.type present %v", i, failed)
		}
	}

	// The record, reset, serves the next room with nothing of
	// the first left.
	o2, _, exp2 := recordObserver(t, Config{})
	recycled := *r // the spilled record, as retired
	recycled.o = o2
	reset(&recycled)
	recycled.begin(2, 0)
	if recycled.spill != 0 || recycled.nX != 0 || recycled.nAg != 0 || recycled.nEv != 0 || recycled.rare ||
		recycled.failedX != 0 || len(recycled.agents()) != 0 || len(recycled.more.xfers) != 0 || len(recycled.more.agents) != 0 ||
		len(recycled.more.events) != 0 || cap(recycled.more.xfers) == 0 {
		t.Fatalf("reset left %+v (more %+v)", recycled.roomState, *recycled.more)
	}
	for _, a := range recycled.more.agents[:cap(recycled.more.agents)] {
		if a != "" {
			t.Fatalf("reset kept agent %q alive", a)
		}
	}
	drive := func(rec *roomRec) {
		f := byFact{rec}
		f.StatusChanged(kv.StatusWaitingForInput, kv.ReasonNone)
		f.Posted(&kv.Transfer{Room: 2, Agent: "b", Seq: 1, Last: true, SrcPages: []int32{1}})
		f.TransferDone(1, kv.ReasonNone)
		f.StatusChanged(kv.StatusSuccess, kv.ReasonNone)
		f.Retired(room.Tombstone{Room: 2, Status: kv.StatusSuccess})
	}
	drive(&recycled)
	if recycled.spill != 0 || recycled.nX != 1 || recycled.agents()[0] != "b" || recycled.nEv != 2 {
		t.Fatalf("reused record: spill %b, %d entries, agents %v, %d events", recycled.spill, recycled.nX, recycled.agents(), recycled.nEv)
	}
	if err := o2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := exp2.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans for the small room, want 2", len(spans))
	}
	for _, s := range spans {
		if s.Name == RoomSpan {
			if _, ok := attrOf(s.Attributes, AttrFailedTransfers); ok {
				t.Errorf("the reused record's room names failed transfers: %v", s.Attributes)
			}
		}
	}
}

// Without tracing only writes in flight are kept: a room with many at once
// counts every byte and duration and leaves no entry behind.
func TestRecordInflightOnly(t *testing.T) {
	clk := clock.NewFake(epoch)
	o, err := New(Config{Clock: clk, BytesPerPage: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := o.created(1).(*roomRec)
	for i := range 6 {
		byFact{r}.Posted(&kv.Transfer{Room: 1, Agent: "a", Seq: uint32(i + 1), SrcPages: make([]int32, 2)})
	}
	clk.Advance(time.Millisecond)
	for _, seq := range []uint32{2, 6, 1, 5, 3, 4} {
		byFact{r}.TransferDone(seq, kv.ReasonNone)
	}
	if r.nX != 0 || len(r.xfers()) != 0 || r.nSpans != 0 || r.nAg != 0 || r.bytes != 12 {
		t.Fatalf("%d entries, %d spans, %d agents, %d bytes; want 0, 0, 0, 12", r.nX, r.nSpans, r.nAg, r.bytes)
	}
	got := o.totals()
	var durations uint64
	for _, c := range got.xferDur.counts {
		durations += c
	}
	if got.bytesOK != 12 || durations != 6 || got.xferDur.sumNs != int64(6*time.Millisecond) {
		t.Fatalf("bytes %d, %d durations summing %v", got.bytesOK, durations, time.Duration(got.xferDur.sumNs))
	}
}

// A room that writes to more agents than name it (16) names the first 16;
// each transfer span still names its own agent.
func TestRecordManyAgents(t *testing.T) {
	o, _, exp := recordObserver(t, Config{MaxTransferSpans: 20})
	r := byFact{o.created(1)}
	for i := range 24 {
		r.Posted(&kv.Transfer{Room: 1, Agent: fmt.Sprintf("a%02d", i), Seq: uint32(i + 1), SrcPages: []int32{1}})
		r.TransferDone(uint32(i+1), kv.ReasonNone)
	}
	r.Retired(room.Tombstone{Room: 1, Status: kv.StatusFailed, Reason: kv.ReasonClientAbort})
	if err := o.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var n int
	for _, s := range exp.GetSpans() {
		switch s.Name {
		case RoomSpan:
			as := mustAttr(t, "room", s.Attributes, AttrPeerAgent).AsStringSlice()
			if len(as) != 16 || as[0] != "a00" || as[15] != "a15" {
				t.Errorf("room names %v", as)
			}
			if d := mustAttr(t, "room", s.Attributes, AttrDroppedSpans).AsInt64(); d != 4 {
				t.Errorf("dropped spans %d, want 4", d)
			}
		case TransferSpan:
			if a, seq := mustAttr(t, "transfer", s.Attributes, AttrPeerAgent).AsString(),
				mustAttr(t, "transfer", s.Attributes, AttrSeq).AsInt64(); a != fmt.Sprintf("a%02d", seq-1) {
				t.Errorf("transfer %d names %s", seq, a)
			}
			n++
		}
	}
	if n != 20 {
		t.Errorf("%d transfer spans, want 20", n)
	}
}

// A status event keeps its time to the nanosecond (relative to the room's
// creation), its status and its reason; times before creation read as the
// creation, and ages past 78 hours saturate.
func TestStatusEventEncoding(t *testing.T) {
	created := tick(5e9)
	for _, c := range []struct {
		at, want tick
	}{
		{created, created},
		{created + 1, created + 1},
		{created + 123456789, created + 123456789},
		{created - 7, created},
		{created + maxEventAge, created + maxEventAge},
		{created + maxEventAge + 1e9, created + maxEventAge},
	} {
		for _, s := range []kv.Status{kv.StatusBootstrapping, kv.StatusTransferring, kv.StatusFailed} {
			for _, why := range []kv.Reason{kv.ReasonNone, kv.ReasonClientLost} {
				e := newEvent(created, c.at, s, why)
				if e.at(created) != c.want || e.status() != s || e.reason() != why {
					t.Fatalf("event(%d, %v, %v) reads %d, %v, %v", c.at, s, why, e.at(created), e.status(), e.reason())
				}
			}
		}
	}
}

// The caps that keep a record's indexes in range: MaxTransferSpans is
// capped at maxSpans, and a room with more than maxXfers writes in flight
// at once has the ones past it counted but not followed (no bytes or
// duration when they complete), without harm to the rest.
func TestRecordCaps(t *testing.T) {
	o, err := New(Config{MaxTransferSpans: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.MaxTransferSpans != maxSpans {
		t.Fatalf("MaxTransferSpans %d, want capped at %d", o.cfg.MaxTransferSpans, maxSpans)
	}
	clk := clock.NewFake(epoch)
	o, err = New(Config{Clock: clk, BytesPerPage: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := o.created(1).(*roomRec)
	const n = maxXfers + 10
	for i := range n {
		byFact{r}.Posted(&kv.Transfer{Room: 1, Agent: "a", Seq: uint32(i + 1), SrcPages: []int32{1}})
	}
	if r.nX != maxXfers || r.transfers != n {
		t.Fatalf("%d entries, %d transfers; want %d, %d", r.nX, r.transfers, maxXfers, n)
	}
	clk.Advance(time.Millisecond)
	for i := n - 1; i >= 0; i-- { // newest first: each is found at the end
		byFact{r}.TransferDone(uint32(i+1), kv.ReasonNone)
	}
	got := o.totals()
	if r.nX != 0 || r.bytes != maxXfers || got.bytesOK != maxXfers || got.xferOK != n {
		t.Fatalf("after completion: %d entries, %d bytes (%d counted), %d writes ok; want 0, %d, %d, %d",
			r.nX, r.bytes, got.bytesOK, got.xferOK, maxXfers, maxXfers, n)
	}
}

// A record's parts start cache lines: its first line is the Observer and
// the head (what creation and retirement touch), the body and the first
// transfer entry are the second, and it is 320 bytes, a size class whose
// objects are 64-byte aligned (a multiple of 64).
func TestRecordLines(t *testing.T) {
	rt := reflect.TypeOf(roomRec{})
	field := func(typ reflect.Type, name string) reflect.StructField {
		f, ok := typ.FieldByName(name)
		if !ok {
			t.Fatalf("%s has no field %s", typ, name)
		}
		return f
	}
	state := field(rt, "roomState")
	body := state.Offset + field(state.Type, "roomBody").Offset
	if body != 64 {
		t.Errorf("the body starts at byte %d, want 64 (the first line is the Observer and the head)", body)
	}
	if xf := field(rt, "xf").Offset; xf+reflect.TypeOf(xferRec{}).Size() > 128 {
		t.Errorf("the first transfer entry ends at byte %d, past the second line", xf+reflect.TypeOf(xferRec{}).Size())
	}
	if n := rt.Size(); n <= 256 || n > 320 {
		t.Errorf("a record is %d bytes: want 257..320 (the 320-byte size class)", n)
	}
}
