package suite

import (
	"runtime"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/bench/workload"
)

func TestHeapPerRoomSaysNothingItCannotMeasure(t *testing.T) {
	for _, c := range []struct {
		mid, after, live, want float64
	}{
		{mid: 2_000_000, after: 1_000_000, live: 1000, want: 1000},
		{mid: 2_000_000, after: 1_000_000, live: 99, want: 0},  // an open loop's handful of rooms
		{mid: 1_000_000, after: 1_200_000, live: 500, want: 0}, // the heap grew after they ended
		{mid: 1_000_000, after: 1_000_000, live: 500, want: 0},
	} {
		if got := heapPerRoom(c.mid, c.after, c.live); got != c.want {
			t.Errorf("heapPerRoom(%v, %v, %v) = %v, want %v", c.mid, c.after, c.live, got, c.want)
		}
	}
}

// The probe forces no GC while the run goes on: it takes the first cycle the
// run makes after its midpoint, and says nothing when there is none.
func TestHeapProbeWaitsForTheRunsOwnCycle(t *testing.T) {
	const rooms, perRoom = 400, 16 << 10
	p := &workload.Progress{}
	p.Admitted.Store(1000)
	p.Terminal.Store(600) // past the midpoint of 1,000: 400 live
	held := make([][]byte, rooms)
	for i := range held {
		held[i] = make([]byte, perRoom)
	}
	runtime.GC()
	s := gcSamples()
	before, _ := readGC(s)
	h := startHeapProbe(p, 1000)
	time.Sleep(20 * time.Millisecond) // the probe polls every millisecond
	if now, _ := readGC(s); now != before {
		t.Fatalf("GC cycles %d → %d while nothing allocated: the probe forced one", before, now)
	}
	runtime.GC() // the run's own cycle
	deadline := time.Now().Add(10 * time.Second)
	for len(h.done) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the probe took no sample within 10 s of a cycle")
		}
		time.Sleep(time.Millisecond)
	}
	runtime.KeepAlive(held)
	held = nil
	got := h.stop()
	if got < perRoom*0.9 || got > perRoom*1.5 {
		t.Fatalf("heap per live room %.0f B, want about %d", got, perRoom)
	}

	h = startHeapProbe(p, 1000)
	time.Sleep(5 * time.Millisecond)
	if got := h.stop(); got != 0 {
		t.Fatalf("no cycle after the midpoint: %.0f B, want 0 (not measured)", got)
	}
}
