package libnixl_test

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
)

// benchTotal is the bytes of one transfer: one request of total/desc
// descriptors, remote indices reversed so NIXL cannot merge neighbours.
// benchPerRound transfers make one round; benchWarm pairs of rounds are run
// and dropped before measuring.
const (
	benchTotal    = 16 << 20
	benchPerRound = 2
	benchWarm     = 3
	// benchSpinPolls is how many polls the Go caller makes before it parks:
	// actors/xfer's spinTicks.
	benchSpinPolls = 16
)

// BenchmarkInteropWrite: Go -> Python WRITE throughput against the same
// transfer done Python -> Python with NIXL's own Python API, per descriptor
// size. One iteration is one pair of rounds, a Go round and a Python round of
// benchPerRound transfers each, in alternating order (Go first, then Python
// first: ABBA), so drift in the machine's load falls on both sides alike.
//
// Both initiators write the same request (same descriptors, reversed remote
// indices, the "bench" notification, busy completion wait: Python polls
// check_xfer_state back to back; Go's owner goroutine polls getXferStatus back
// to back while the Go caller polls 16 times, then parks on nixl.Waker, as
// actors/xfer's pool does) into the same Python target. The target stands
// for a decode node elsewhere, so it is kept off the initiators' CPUs: its
// NIXL progress thread is off (with NIXL's Python default it spins, a third
// busy thread on this 2-core box); the puts are cma zero-copy done by the
// initiator, and the target drains notifications every 1 ms. The initiator
// whose round it is not is kept from competing for the CPU: the Python initiator is SIGSTOPped during Go rounds
// (its NIXL progress thread spins otherwise, pthrDelay 0), the Go agent is
// idle during Python rounds (owner goroutine blocked, progress thread at
// Options.ProgressDelay). Processes are not pinned: all of them share the
// machine's CPUs with whatever else runs.
//
// Reported: go/py, the median over pairs of go rate / python rate, with
// go/py_lo and go/py_hi, the 2.5th and 97.5th percentiles of that median over
// 2000 bootstrap resamples of the pairs; go/py_min and go/py_max; go_MB/s and
// py_MB/s, the median round rates; go_cpu_ms/GiB and py_cpu_ms/GiB, the CPU
// each initiator process used (all threads, NIXL's included: getrusage in Go,
// time.process_time in Python) per GiB over the measured rounds, which the
// machine's load scales much less than the rates; go_post_µs/py_post_µs and
// go_wait_µs/py_wait_µs, the median time per transfer in Post/transfer() and
// waiting after it; load, the 1-minute load average at start.
// The first benchWarm pairs are dropped. Use a fixed -benchtime (pairs):
//
//	KVXFER_NIXL_PYTHON=/opt/kvxfer-nixl/bin/python \
//	  go test -run '^$' -bench InteropWrite -benchtime 60x ./nixl/libnixl/
func BenchmarkInteropWrite(b *testing.B) {
	for _, desc := range []int{64 << 10, 256 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("desc=%dKiB", desc>>10), func(b *testing.B) { benchWrite(b, desc) })
	}
}

func benchWrite(b *testing.B, desc int) {
	if b.N < 2 {
		return // the framework's first probe run; use -benchtime Nx
	}
	load := loadavg()
	g := newAgent(b, "go-bench")
	tgt := startPeer(b, true, "target", "--name", fmt.Sprintf("py-tgt-%d", seq.Add(1)),
		"--size", strconv.Itoa(benchTotal), "--timeout", "900", "--no-progress-thread")
	once, split := goWriter(b, g, tgt, desc)
	py := pyWriter(b, tgt, desc)
	once()                                       // wire-up
	var goPost, goWait, pyPost, pyWait []float64 // per round, µs per transfer
	var goCPU, pyCPU time.Duration               // over the measured rounds
	measured := false
	goRound := func() float64 {
		split.post, split.wait = 0, 0
		c0 := cpuNow()
		defer func() {
			if measured {
				goCPU += cpuNow() - c0
			}
		}()
		start := time.Now()
		for range benchPerRound {
			once()
		}
		r := benchPerRound * benchTotal / time.Since(start).Seconds()
		goPost = append(goPost, float64(split.post.Microseconds())/benchPerRound)
		goWait = append(goWait, float64(split.wait.Microseconds())/benchPerRound)
		return r
	}
	pyRound := func() float64 {
		py.signal(b, syscall.SIGCONT)
		defer py.signal(b, syscall.SIGSTOP)
		py.send(b, map[string]int{"iters": benchPerRound})
		var res struct{ Gbps, Post, Wait, CPU float64 }
		py.read(b, &res)
		if measured {
			pyCPU += time.Duration(res.CPU * 1e9)
		}
		pyPost = append(pyPost, res.Post*1e6/benchPerRound)
		pyWait = append(pyWait, res.Wait*1e6/benchPerRound)
		return res.Gbps * 1e9
	}
	py.signal(b, syscall.SIGSTOP)
	var goRates, pyRates []float64
	b.ResetTimer()
	for i := range b.N + benchWarm {
		measured = i >= benchWarm
		var gr, pr float64
		if i%2 == 0 {
			gr = goRound()
			pr = pyRound()
		} else {
			pr = pyRound()
			gr = goRound()
		}
		if i >= benchWarm {
			goRates, pyRates = append(goRates, gr), append(pyRates, pr)
		}
	}
	b.StopTimer()
	b.Logf("THP: go %s py-ini %s tgt %s", thp(os.Getpid()), thp(py.cmd.Process.Pid), thp(tgt.cmd.Process.Pid))
	per := make([]float64, len(goRates))
	for i := range per {
		per[i] = goRates[i] / pyRates[i]
	}
	lo, hi := bootMedian(per, 2000)
	b.ReportMetric(median(per), "go/py")
	b.ReportMetric(lo, "go/py_lo")
	b.ReportMetric(hi, "go/py_hi")
	b.ReportMetric(slices.Min(per), "go/py_min")
	b.ReportMetric(slices.Max(per), "go/py_max")
	b.ReportMetric(median(goRates)/1e6, "go_MB/s")
	b.ReportMetric(median(pyRates)/1e6, "py_MB/s")
	b.ReportMetric(load, "load")
	w := benchWarm
	b.ReportMetric(median(goPost[w:]), "go_post_µs")
	b.ReportMetric(median(pyPost[w:]), "py_post_µs")
	b.ReportMetric(median(goWait[w:]), "go_wait_µs")
	gib := float64(len(per)*benchPerRound*benchTotal) / (1 << 30)
	b.ReportMetric(goCPU.Seconds()*1e3/gib, "go_cpu_ms/GiB")
	b.ReportMetric(pyCPU.Seconds()*1e3/gib, "py_cpu_ms/GiB")
	b.ReportMetric(median(pyWait[w:]), "py_wait_µs")
	b.Logf("desc=%dKiB, %d pairs of rounds of %d x 16 MiB, load %.2f -> %.2f: go %v MB/s, python %v MB/s",
		desc>>10, len(per), benchPerRound, load, loadavg(), mb(goRates), mb(pyRates))
}

// bootMedian returns the 2.5th and 97.5th percentiles of the median of v over
// n resamples with replacement (fixed seed: the same data gives the same
// interval).
func bootMedian(v []float64, n int) (lo, hi float64) {
	r := rand.New(rand.NewPCG(1, 2))
	meds := make([]float64, n)
	s := make([]float64, len(v))
	for i := range meds {
		for j := range s {
			s[j] = v[r.IntN(len(v))]
		}
		meds[i] = median(s)
	}
	slices.Sort(meds)
	return meds[n*25/1000], meds[n*975/1000]
}

// loadavg is the 1-minute load average, or -1.
func loadavg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		return -1
	}
	return f
}

// goSplit accumulates the time a Go transfer spends in Post and after it.
type goSplit struct{ post, wait time.Duration }

// goWriter sets up one Go -> tgt request and returns a function that posts it
// and waits for it to be Done, adding its times to *goSplit.
func goWriter(b *testing.B, g nixl.Agent, tgt *pyPeer, desc int) (func(), *goSplit) {
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
	b.Cleanup(func() { g.Release(x) }) // the Python initiator ends the shared target
	st := make([]nixl.Status, 1)
	woke := make(chan struct{}, 1)
	b.Cleanup(g.(*libnixl.Agent).OnProgress(func() {
		select {
		case woke <- struct{}{}:
		default:
		}
	}))
	split := &goSplit{}
	return func() {
		t0 := time.Now()
		if _, err := g.Post(x); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		defer func() { split.post += t1.Sub(t0); split.wait += time.Since(t1) }()
		for polls := 0; ; polls++ {
			if err := g.Poll([]nixl.XferID{x}, st); err != nil {
				b.Fatal(err)
			}
			switch st[0].State {
			case nixl.Done:
				return
			case nixl.Failed:
				b.Fatal(st[0].Err)
			}
			// Wait as actors/xfer's pool does: poll back to back (as Python
			// polls check_xfer_state), after benchSpinPolls polls park until
			// the owner goroutine, which progresses the request meanwhile
			// (Options.Spin), sees it end (nixl.Waker). No sleep, no timer.
			if polls >= benchSpinPolls {
				<-woke
			}
		}
	}, split
}

// pyWriter starts a Python initiator set up for the same request as
// goWriter, towards the same target; it then runs rounds on request.
func pyWriter(b *testing.B, tgt *pyPeer, desc int) *pyPeer {
	ini := startPeer(b, false, "initiator", "--name", fmt.Sprintf("py-ini-%d", seq.Add(1)),
		"--size", strconv.Itoa(benchTotal), "--desc", strconv.Itoa(desc))
	ini.send(b, map[string]any{"md": base64.StdEncoding.EncodeToString(tgt.MD), "addr": tgt.Addr})
	b.Cleanup(func() {
		ini.signal(b, syscall.SIGCONT)
		ini.send(b, map[string]bool{"end": true})
	})
	return ini
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
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

// thp is the process's AnonHugePages from /proc/PID/smaps_rollup.
func thp(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "AnonHugePages") {
			return strings.Join(strings.Fields(l)[1:], "")
		}
	}
	return "?"
}
