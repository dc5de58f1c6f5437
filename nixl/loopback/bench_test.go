package loopback_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// BenchmarkWrite measures a prepared WRITE of 8 MiB split into descriptors of
// one size (Make + Post + Poll to Done + Release per op; destination indices
// are interleaved so descriptors cannot merge), next to copy() of the same
// descriptors in the same run. x-copy is loopback time / copy time.
func BenchmarkWrite(b *testing.B) {
	const total = 8 << 20
	for _, c := range []struct {
		name string
		size int
	}{{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"256KiB", 256 << 10}, {"1MiB", 1 << 20}} {
		b.Run(c.name, func(b *testing.B) { benchWrite(b, total, c.size) })
	}
}

func benchWrite(b *testing.B, total, size int) {
	a, err := loopback.New("bench-a", loopback.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	d, err := loopback.New("bench-b", loopback.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	src, _, err := a.AllocRegistered(nixl.DRAM, 0, total)
	if err != nil {
		b.Fatal(err)
	}
	dst, _, err := d.AllocRegistered(nixl.DRAM, 0, 2*total)
	if err != nil {
		b.Fatal(err)
	}
	for i := range src {
		src[i] = byte(i)
	}
	md, _ := d.LocalMetadata()
	peer, err := a.LoadPeer(md)
	if err != nil {
		b.Fatal(err)
	}
	n := total / size
	sd, dd := make([]nixl.Desc, n), make([]nixl.Desc, 2*n)
	li, ri := make([]int32, n), make([]int32, n)
	for i := range n {
		sd[i] = nixl.DescOf(src[i*size:(i+1)*size], 0)
		li[i], ri[i] = int32(i), int32(2*i)
	}
	for i := range 2 * n {
		dd[i] = nixl.DescOf(dst[i*size:(i+1)*size], 0)
	}
	ll, err := a.Prep("", nixl.DRAM, sd)
	if err != nil {
		b.Fatal(err)
	}
	rl, err := a.Prep(peer, nixl.DRAM, dd)
	if err != nil {
		b.Fatal(err)
	}
	st := make([]nixl.Status, 1)
	woke := make(chan struct{}, 1)
	defer a.OnProgress(func() {
		select {
		case woke <- struct{}{}:
		default:
		}
	})()
	b.SetBytes(int64(total))
	iters := -1 // the first round is a warm-up: it faults in both mappings
	for iters < 0 || b.Loop() {
		x, err := a.Make(nixl.Write, ll, li, rl, ri, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.Post(x); err != nil {
			b.Fatal(err)
		}
		for spin := 0; ; spin++ {
			a.Poll([]nixl.XferID{x}, st)
			if st[0].State != nixl.InProgress {
				break
			}
			// Spin briefly, then park on the agent's wake-up (nixl.Waker) so the
			// poller does not steal the copying core; no timer.
			if spin < 20 {
				runtime.Gosched()
			} else {
				<-woke
			}
		}
		if st[0].State != nixl.Done {
			b.Fatal(st[0].Err)
		}
		a.Release(x)
		iters++
	}
	for i := range n { // warm the baseline the same way
		copy(dst[2*i*size:(2*i+1)*size], src[i*size:(i+1)*size])
	}
	xferNs := float64(b.Elapsed().Nanoseconds()) / float64(iters)
	if dst[2*size] != src[size] || dst[2*size+size-1] != src[2*size-1] {
		b.Fatal("bytes did not land")
	}
	start := time.Now()
	for range iters {
		for i := range n {
			copy(dst[2*i*size:(2*i+1)*size], src[i*size:(i+1)*size])
		}
	}
	copyNs := float64(time.Since(start).Nanoseconds()) / float64(iters)
	b.ReportMetric(copyNs, "copy-ns/op")
	b.ReportMetric(xferNs/copyNs, "x-copy")
}
