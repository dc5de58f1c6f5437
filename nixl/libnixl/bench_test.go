package libnixl_test

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// benchTotal is the bytes of one transfer: one request of total/desc
// descriptors, remote indices reversed so NIXL cannot merge neighbours.
const (
	benchTotal  = 16 << 20
	benchRounds = 5
)

// BenchmarkInteropWrite: Go -> Python WRITE throughput against the same
// transfer done Python -> Python with NIXL's own API, per descriptor size.
//
// The b.N Go transfers are split into benchRounds rounds, each followed by a
// Python round of as many transfers (a long-lived Python initiator), so both
// sides see the same machine load. It reports MB/s over the Go rounds, the
// medians go_MB/s and py_MB/s over the rounds, and go/py (ratio of medians).
// Use a fixed -benchtime so the Python processes start once per -count:
//
//	KVXFER_NIXL_PYTHON=/opt/kvxfer-nixl/bin/python \
//	  go test -run '^$' -bench InteropWrite -benchtime 100x ./nixl/libnixl/
func BenchmarkInteropWrite(b *testing.B) {
	for _, desc := range []int{64 << 10, 256 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("desc=%dKiB", desc>>10), func(b *testing.B) { benchWrite(b, desc) })
	}
}

func benchWrite(b *testing.B, desc int) {
	g := newAgent(b, "go-bench")
	tgt := startPeer(b, true, "target", "--name", fmt.Sprintf("py-tgt-%d", seq.Add(1)),
		"--size", strconv.Itoa(benchTotal), "--timeout", "900")
	once := goWriter(b, g, tgt, desc)
	var py *pyPeer
	if b.N >= benchRounds {
		py = pyWriter(b, desc)
	}
	once() // wire-up
	b.SetBytes(benchTotal)
	b.ResetTimer()
	var goRates, pyRates []float64
	for r := range benchRounds {
		n := b.N / benchRounds
		if r == benchRounds-1 {
			n = b.N - r*n
		}
		if n == 0 {
			continue
		}
		b.StartTimer()
		start := time.Now()
		for range n {
			once()
		}
		goRates = append(goRates, float64(n)*benchTotal/time.Since(start).Seconds())
		b.StopTimer()
		if py != nil {
			py.send(b, map[string]int{"iters": n})
			var res struct{ Gbps float64 }
			py.read(b, &res)
			pyRates = append(pyRates, res.Gbps*1e9)
		}
	}
	if py == nil {
		return // a ramp-up round
	}
	goMed, pyMed := median(goRates), median(pyRates)
	b.ReportMetric(goMed/1e6, "go_MB/s")
	b.ReportMetric(pyMed/1e6, "py_MB/s")
	b.ReportMetric(goMed/pyMed, "go/py")
	b.Logf("desc=%dKiB rounds of %d x 16 MiB: go %v MB/s, python %v MB/s", desc>>10, b.N/benchRounds, mb(goRates), mb(pyRates))
}

// goWriter sets up one Go -> tgt request and returns a function that posts it
// and polls it to Done.
func goWriter(b *testing.B, g nixl.Agent, tgt *pyPeer, desc int) func() {
	src := alloc(b, g, benchTotal)
	pattern(src, 3)
	if _, err := g.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}); err != nil {
		b.Fatal(err)
	}
	peer, err := g.LoadPeer(tgt.MD)
	if err != nil {
		b.Fatal(err)
	}
	n := benchTotal / desc
	var ld, rd []nixl.Desc
	li, ri := make([]int32, n), make([]int32, n)
	for i := range n {
		ld = append(ld, nixl.DescOf(src[i*desc:(i+1)*desc], 0))
		rd = append(rd, nixl.Desc{Addr: tgt.Addr + uintptr(i*desc), Len: uint64(desc)})
		li[i], ri[i] = int32(i), int32(n-1-i)
	}
	l, err := g.Prep("", nixl.DRAM, ld)
	if err != nil {
		b.Fatal(err)
	}
	r, err := g.Prep(peer, nixl.DRAM, rd)
	if err != nil {
		b.Fatal(err)
	}
	x, err := g.Make(nixl.Write, l, li, r, ri, []byte("bench"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		g.SendNotif(peer, []byte("bench_end"))
		g.Release(x)
	})
	st := make([]nixl.Status, 1)
	return func() {
		if _, err := g.Post(x); err != nil {
			b.Fatal(err)
		}
		for {
			if err := g.Poll([]nixl.XferID{x}, st); err != nil {
				b.Fatal(err)
			}
			switch st[0].State {
			case nixl.Done:
				return
			case nixl.Failed:
				b.Fatal(st[0].Err)
			}
			// An engine's poll tick (spec: 50-200µs); the owner goroutine keeps
			// progressing the request meanwhile (Options.Spin).
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// pyWriter starts a Python target and a Python initiator set up for the same
// request as goWriter; the initiator then runs rounds on request.
func pyWriter(b *testing.B, desc int) *pyPeer {
	tgt := startPeer(b, true, "target", "--name", fmt.Sprintf("py-tgt-%d", seq.Add(1)),
		"--size", strconv.Itoa(benchTotal), "--timeout", "900")
	ini := startPeer(b, false, "initiator", "--name", fmt.Sprintf("py-ini-%d", seq.Add(1)),
		"--size", strconv.Itoa(benchTotal), "--desc", strconv.Itoa(desc))
	ini.send(b, map[string]any{"md": base64.StdEncoding.EncodeToString(tgt.MD), "addr": tgt.Addr})
	b.Cleanup(func() { ini.send(b, map[string]bool{"end": true}) })
	return ini
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func mb(v []float64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x / 1e6)
	}
	return out
}
