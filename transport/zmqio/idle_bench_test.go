package zmqio

import (
	"syscall"
	"testing"
	"time"
)

// BenchmarkIdleLoops: the CPU that idle ZMQ loops cost their process, as a
// share of one core over two seconds (getrusage): one PULL ingest (with its
// disconnect monitor) and n push links to it, each with a disconnect
// watcher, as a live kvxferd holds them, and nothing sent. A loop whose poll
// times out wakes Go's sysmon thread at every timeout; with no timeout the
// process sleeps (docs/benchmarks.md, idle CPU).
//
//	go test -run '^$' -bench IdleLoops -benchtime 1x ./transport/zmqio/
func BenchmarkIdleLoops(b *testing.B) {
	for _, links := range []int{1, 8} {
		b.Run(map[int]string{1: "links=1", 8: "links=8"}[links], func(b *testing.B) {
			in, err := StartIngest(IngestConfig{Host: "127.0.0.1"}, &countSink{})
			if err != nil {
				b.Fatal(err)
			}
			defer in.Stop()
			for range links {
				l, err := DialPush(PushConfig{Endpoint: in.Endpoint(), OnDisconnect: func() {}})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
			}
			time.Sleep(300 * time.Millisecond) // connections settle
			var share float64
			for range b.N {
				c0, t0 := idleCPUNow(), time.Now()
				time.Sleep(2 * time.Second)
				share = float64(idleCPUNow()-c0) / float64(time.Since(t0))
			}
			b.ReportMetric(share*100, "%core")
		})
	}
}

func idleCPUNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
