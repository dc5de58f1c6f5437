package telemetry

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// BenchmarkTelemetryOverheadLoopback is BenchmarkTelemetryOverhead with the
// writes real: both engines post through the NIXL transfer pool over the
// loopback backend into a decode rank's memory (4 KiB pages, 4 layers K+V, two
// chunks of two pages per room), as kvxferd does. Batches of 1,000 rooms
// alternate between the engine without an observer and the one with tracing
// (10% of successful rooms kept, failed and slow always) and metrics on.
func BenchmarkTelemetryOverheadLoopback(b *testing.B) {
	sh := kvmem.DefaultShape()
	sh.Slots, sh.Item = 64, 4096
	pre, err := kvmem.New(fmt.Sprintf("tel-pre-%d", os.Getpid()), sh, 0, loopback.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer pre.Close()
	dec, err := kvmem.New(fmt.Sprintf("tel-dec-%d", os.Getpid()), sh, 0, loopback.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer dec.Close()
	md, _ := dec.Agent.LocalMetadata()
	if _, err := pre.Agent.LoadPeer(md); err != nil {
		b.Fatal(err)
	}
	pool, err := xfer.New(xfer.Config{Agent: pre.Agent, Local: &pre.Geo})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if err := pool.AddPeer(dec.Peer()); err != nil {
		b.Fatal(err)
	}
	off := benchEngineOver(b, nil, pool)
	obs := benchTelemetry(b, Sampling{Ratio: 0.1}, false)
	on := benchEngineOver(b, obs, pool)
	agent := dec.Agent.Name()
	run := func(eng *actors.Engine, ids []uint64, next uint64) {
		ti := room.TransferInfo{Agent: agent, DstPages: []int32{1, 2, 3, 4}, DstAux: 1, Required: 1}
		for i := range ids {
			ids[i] = next + uint64(i)
			eng.Open(ids[i])
			eng.TransferInfo(ids[i], ti)
			eng.Init(ids[i], 4, 2)
			eng.Send(ids[i], []int32{5, 6}, nil)
			eng.Send(ids[i], []int32{7, 8}, nil)
		}
		out := make([]room.Reply, len(ids))
		for {
			all := true
			out = eng.Poll(ids, out)
			for _, r := range out {
				if r.Status == room.Failed {
					b.Fatalf("room failed: %v", r.Reason)
				}
				all = all && r.Status == room.Success
			}
			if all {
				break
			}
		}
		for _, id := range ids {
			eng.Clear(id)
		}
		eng.Poll(ids, out)
	}
	const batch = 1000
	ids := make([]uint64, batch)
	run(off, ids, 1<<40)
	run(on, ids, 1<<40)
	var wOff, wOn, cOff, cOn time.Duration
	var pairs []float64
	next := uint64(1)
	b.ResetTimer()
	for pair := 0; pair*batch < b.N; pair++ {
		t0, c0 := time.Now(), cpuTime()
		if pair%2 == 0 {
			run(off, ids, next)
		} else {
			run(on, ids, next)
			obs.Flush(context.Background())
		}
		t1, c1 := time.Now(), cpuTime()
		if pair%2 == 0 {
			run(on, ids, next)
			obs.Flush(context.Background())
		} else {
			run(off, ids, next)
		}
		t2, c2 := time.Now(), cpuTime()
		dFirst, dSecond := t1.Sub(t0), t2.Sub(t1)
		dOff, dOn := dFirst, dSecond
		eOff, eOn := c1-c0, c2-c1
		if pair%2 == 1 {
			dOff, dOn = dSecond, dFirst
			eOff, eOn = eOn, eOff
		}
		wOff, wOn, cOff, cOn = wOff+dOff, wOn+dOn, cOff+eOff, cOn+eOn
		pairs = append(pairs, dOn.Seconds()/dOff.Seconds()-1)
		next += batch
	}
	b.StopTimer()
	sort.Float64s(pairs)
	rooms := float64(next - 1)
	b.ReportMetric(rooms/wOff.Seconds(), "rooms/s-off")
	b.ReportMetric(rooms/wOn.Seconds(), "rooms/s-on")
	b.ReportMetric(100*(wOn.Seconds()-wOff.Seconds())/wOff.Seconds(), "wall-overhead-%")
	b.ReportMetric(100*pairs[len(pairs)/2], "median-overhead-%")
	b.ReportMetric(float64(cOff.Microseconds())/rooms, "cpu-us/room-off")
	b.ReportMetric(float64(cOn.Microseconds())/rooms, "cpu-us/room-on")
	b.ReportMetric(100*(cOn.Seconds()-cOff.Seconds())/cOff.Seconds(), "cpu-overhead-%")
}
