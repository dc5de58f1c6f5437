package telemetry

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// TestEmitAgentAttrCached: the direct path makes a one-agent room's
// kv_transfer.peer.agent once per agent and reuses it; every room span still
// names its own agents (one, several, and more agents than the cache holds),
// and the transfer spans their own agent, resource and scope.
func TestEmitAgentAttrCached(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	obs, err := New(Config{Exporter: exp})
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Close(context.Background()); err != nil { // emit runs here
		t.Fatal(err)
	}
	mk := func(id uint64, agents ...string) *roomRec {
		r := &roomRec{roomState: roomState{roomHead: roomHead{id: id, retiredAt: 5e6, status: kv.StatusSuccess, retired: true, keep: keepSampled}}}
		for i, a := range agents {
			r.putSpan(xferRec{seq: uint32(i + 1), start: 1e6, end: 2e6, flags: xDone}, a)
		}
		return r
	}
	var want []string
	emit := func(r *roomRec) {
		obs.emit(r)
		want = append(want, fmt.Sprint(r.agents()))
	}
	emit(mk(1, "a"))
	emit(mk(2, "b"))
	emit(mk(3, "a"))
	emit(mk(4, "a", "b"))
	for i := range 1100 { // more agents than the cache keeps
		emit(mk(uint64(10+i), fmt.Sprintf("agent-%d", i)))
	}
	emit(mk(5, "a"))
	emit(mk(6)) // no transfer: no attribute
	if len(obs.agents) > 1024 {
		t.Errorf("agent cache holds %d entries, want at most 1024", len(obs.agents))
	}
	obs.export(context.Background())
	var got []string
	for _, s := range exp.GetSpans() {
		switch s.Name {
		case RoomSpan:
			if v, ok := attrOf(s.Attributes, AttrPeerAgent); ok {
				got = append(got, fmt.Sprint(v.AsStringSlice()))
			} else {
				got = append(got, "[]")
			}
		case TransferSpan:
			if s.Resource != obs.cfg.Resource || s.InstrumentationScope.Name != Scope {
				t.Errorf("transfer span resource %v scope %v", s.Resource, s.InstrumentationScope)
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("room spans' agents %v\nwant %v", got, want)
	}
}

// TestEmitterWakesBeforeTick: kept rooms waiting wake the emitter before its
// next tick (an hour away here), with no Flush: once a batch of spans is
// built, it is exported, and no room was dropped for a full queue.
func TestEmitterWakesBeforeTick(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	obs, err := New(Config{Exporter: exp, ExportInterval: time.Hour, QueueSize: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close(context.Background())
	const rooms = exportBatch + 100 // one span each: more than a batch
	deadline := time.Now().Add(30 * time.Second)
	for id := uint64(1); id <= rooms; id++ {
		r := byFact{obs.created(id)}
		r.StatusChanged(kv.StatusSuccess, kv.ReasonNone)
		r.Retired(room.Tombstone{Room: id, Status: kv.StatusSuccess, Opened: true})
		// Let the emitter catch up: this test is about waking it, not
		// about the queue's bound.
		for len(obs.kept) >= obs.cfg.QueueSize {
			if time.Now().After(deadline) {
				t.Fatalf("room %d: the queue stays full (%d waiting), no tick and no Flush", id, len(obs.kept))
			}
			runtime.Gosched()
		}
	}
	for len(exp.GetSpans()) < exportBatch {
		if time.Now().After(deadline) {
			t.Fatalf("%d spans exported with no tick and no Flush, want a batch (%d)", len(exp.GetSpans()), exportBatch)
		}
		time.Sleep(time.Millisecond)
	}
	if n := obs.queueFull.Load(); n != 0 {
		t.Fatalf("%d rooms dropped for a full queue", n)
	}
}
