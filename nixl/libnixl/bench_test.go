package libnixl_test

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// benchTotal is the bytes of one transfer: one request of total/desc
// descriptors, remote indices reversed so NIXL cannot merge neighbours.
const benchTotal = 16 << 20

// BenchmarkInteropWrite: Go -> Python WRITE throughput against the same
// transfer done Python -> Python with NIXL's own API, per descriptor size.
// It reports MB/s (Go), py_MB/s and go/py. Each invocation measures Go first,
// closes the Go agent and its target, then runs Python -> Python (best of two)
// on the now quiet box; use a fixed -benchtime so each runs once per -count:
//
//	KVXFER_NIXL_PYTHON=/opt/kvxfer-nixl-venv/bin/python \
//	  go test -run '^$' -bench InteropWrite -benchtime 200x -count 3 ./nixl/libnixl/
func BenchmarkInteropWrite(b *testing.B) {
	for _, desc := range []int{64 << 10, 256 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("desc=%dKiB", desc>>10), func(b *testing.B) { benchWrite(b, desc) })
	}
}

func benchWrite(b *testing.B, desc int) {
	g := newAgent(b, "go-bench")
	py := startPeer(b, true, "target", "--name", fmt.Sprintf("py-tgt-%d", seq.Add(1)),
		"--size", strconv.Itoa(benchTotal), "--timeout", "600")
	src := alloc(b, g, benchTotal)
	pattern(src, 3)
	if _, err := g.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}); err != nil {
		b.Fatal(err)
	}
	peer, err := g.LoadPeer(py.MD)
	if err != nil {
		b.Fatal(err)
	}
	n := benchTotal / desc
	var ld, rd []nixl.Desc
	li, ri := make([]int32, n), make([]int32, n)
	for i := range n {
		ld = append(ld, nixl.DescOf(src[i*desc:(i+1)*desc], 0))
		rd = append(rd, nixl.Desc{Addr: py.Addr + uintptr(i*desc), Len: uint64(desc)})
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
	once := func() {
		if _, err := g.Post(x); err != nil {
			b.Fatal(err)
		}
		st := make([]nixl.Status, 1)
		for {
			if err := g.Poll([]nixl.XferID{x}, st); err != nil {
				b.Fatal(err)
			}
			if st[0].State == nixl.Done {
				return
			}
			if st[0].State == nixl.Failed {
				b.Fatal(st[0].Err)
			}
			// The owner goroutine keeps progressing the request (Options.Spin);
			// a second spinning thread would only compete for the CPUs.
			time.Sleep(20 * time.Microsecond)
		}
	}
	once() // wire-up
	b.SetBytes(benchTotal)
	b.ResetTimer()
	for range b.N {
		once()
	}
	b.StopTimer()
	goRate := float64(b.N) * benchTotal / b.Elapsed().Seconds()
	if err := g.SendNotif(peer, []byte("bench_end")); err != nil {
		b.Fatal(err)
	}
	var end map[string]any
	py.read(b, &end)
	if err := g.Release(x); err != nil {
		b.Fatal(err)
	}
	if err := g.Close(); err != nil {
		b.Fatal(err)
	}
	if b.N < 10 {
		return // a ramp-up round: not worth a Python run
	}
	pr := max(pythonRun(b, desc), pythonRun(b, desc))
	b.ReportMetric(pr/1e6, "py_MB/s")
	b.ReportMetric(goRate/pr, "go/py")
}

// pythonRun runs a Python initiator against a Python target: the same 16 MiB
// request, descriptor size and reversed indices as the Go side.
func pythonRun(b *testing.B, desc int) float64 {
	tgt := startPeer(b, true, "target", "--name", fmt.Sprintf("py-tgt-%d", seq.Add(1)),
		"--size", strconv.Itoa(benchTotal), "--timeout", "600")
	ini := startPeer(b, false, "initiator", "--name", fmt.Sprintf("py-ini-%d", seq.Add(1)),
		"--size", strconv.Itoa(benchTotal), "--desc", strconv.Itoa(desc), "--min-seconds", "2")
	ini.send(b, map[string]any{"md": base64.StdEncoding.EncodeToString(tgt.MD), "addr": tgt.Addr})
	var res struct {
		Gbps    float64
		Iters   int
		Seconds float64
	}
	start := time.Now()
	ini.read(b, &res)
	var end map[string]any
	tgt.read(b, &end)
	b.Logf("python->python desc=%dKiB: %.3f GB/s (%d x 16 MiB in %.2fs, run %v)", desc>>10, res.Gbps, res.Iters, res.Seconds, time.Since(start).Round(time.Millisecond))
	return res.Gbps * 1e9
}
