package libnixl_test

import (
	"encoding/base64"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
)

// benchTotal is the bytes of one transfer: one request of total/desc
// descriptors, remote indices reversed so NIXL cannot merge neighbours.
const (
	benchTotal  = 16 << 20
	benchRounds = 10
)

// BenchmarkInteropWrite: Go -> Python WRITE throughput against the same
// transfer done Python -> Python with NIXL's own API, per descriptor size.
//
// The b.N Go transfers are split into benchRounds rounds, each followed by a
// Python round of as many transfers (a long-lived Python initiator), so both
// sides see the same machine load. It reports MB/s over the Go rounds, the
// medians go_MB/s and py_MB/s over the rounds, go/py (ratio of medians) and
// go/py_paired (median of the per-round ratios: each Go round and the Python
// round right after it share the machine's load).
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
	var per []float64
	for i := range min(len(goRates), len(pyRates)) {
		per = append(per, goRates[i]/pyRates[i])
	}
	b.ReportMetric(goMed/1e6, "go_MB/s")
	b.ReportMetric(pyMed/1e6, "py_MB/s")
	b.ReportMetric(goMed/pyMed, "go/py")
	b.ReportMetric(median(per), "go/py_paired")
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
	woke := make(chan struct{}, 1)
	b.Cleanup(g.(*libnixl.Agent).OnProgress(func() {
		select {
		case woke <- struct{}{}:
		default:
		}
	}))
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
			// Park until the owner goroutine, which progresses the request
			// back to back meanwhile (Options.Spin), sees it end (nixl.Waker);
			// as a transfer pool waits. No sleep, no timer.
			<-woke
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

// BenchmarkIdleCPU: the CPU an idle agent (backend created, nothing in
// flight) costs its process, as a share of one core over one second, with
// NIXL's own progress-thread delay (0: its thread spins) and with ours
// (Options.ProgressDelay's default). Process CPU is getrusage; the benchmark
// itself sleeps.
//
//	go test -run '^$' -bench IdleCPU -benchtime 1x ./nixl/libnixl/
func BenchmarkIdleCPU(b *testing.B) {
	for _, c := range []struct {
		name  string
		delay time.Duration
	}{{"nixl-default-delay=0", time.Nanosecond}, {"delay=1ms", time.Millisecond}, {"kvxfer-default-10ms", 0}, {"delay=100ms", 100 * time.Millisecond}} {
		b.Run(c.name, func(b *testing.B) {
			findOnce.Do(func() { libPath, findErr = libnixl.Find("") })
			if findErr != nil {
				b.Skipf("NIXL not available: %v", findErr)
			}
			a, err := libnixl.New(fmt.Sprintf("idle-%d-%d", os.Getpid(), seq.Add(1)), libnixl.Options{Path: libPath, ProgressDelay: c.delay})
			if err != nil {
				b.Skipf("NIXL could not start: %v", err)
			}
			defer a.Close()
			if _, err := a.LocalMetadata(); err != nil {
				b.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // threads settle
			var share float64
			for range b.N {
				c0, t0 := cpuNow(), time.Now()
				time.Sleep(time.Second)
				share = float64(cpuNow()-c0) / float64(time.Since(t0))
			}
			b.ReportMetric(share, "cores")
		})
	}
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
