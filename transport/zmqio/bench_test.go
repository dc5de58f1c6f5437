package zmqio

import (
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/transport/wire"
)

type countSink struct{ n atomic.Int64 }

func (s *countSink) Registration(*wire.Registration) { s.n.Add(1) }
func (s *countSink) TransferInfo(*wire.TransferInfo) { s.n.Add(1) }
func (s *countSink) Abort(*wire.Abort)               { s.n.Add(1) }
func (s *countSink) Staging(wire.Inbound)            { s.n.Add(1) }
func (s *countSink) BadFrame(error)                  { s.n.Add(1) }

// BenchmarkIngestTransferInfo measures end-to-end ingest: a Go PUSH peer sends baseline
// transfer infos (10 frames, 3 page indices) over tcp://127.0.0.1; the ingest loop
// receives, decodes and delivers them to a no-op sink. Reports msgs/s.
//
//	go test -run '^$' -bench Ingest -benchtime 200000x ./transport/zmqio/
func BenchmarkIngestTransferInfo(b *testing.B) {
	benchIngest(b, goldenTransferInfoFrames())
}

// BenchmarkIngestTransferInfo512 is the same with 512 page indices per message (a 8k-token
// prompt at page size 16), closer to production frames.
func BenchmarkIngestTransferInfo512(b *testing.B) {
	ti := goldenTransferInfo()
	ti.DstKVIndices = make([]int32, 512)
	for i := range ti.DstKVIndices {
		ti.DstKVIndices[i] = int32(i)
	}
	benchIngest(b, ti.Encode())
}

// batchSink is countSink taking transfer infos in runs (BatchSink).
type batchSink struct{ countSink }

func (s *batchSink) TransferInfos(ts []*wire.TransferInfo) { s.n.Add(int64(len(ts))) }

// BenchmarkIngestTransferInfoBatch is BenchmarkIngestTransferInfo with a
// BatchSink: one hand-off per run of transfer infos.
func BenchmarkIngestTransferInfoBatch(b *testing.B) {
	s := &batchSink{}
	benchIngestTo(b, goldenTransferInfoFrames(), s, &s.n)
}

// BenchmarkIngestTransferInfoPerFrame is BenchmarkIngestTransferInfo through
// zmq4's per-frame receive (the path before the batch receiver, kept as the
// fallback), for a side-by-side ratio in one run.
func BenchmarkIngestTransferInfoPerFrame(b *testing.B) {
	useRx = false
	defer func() { useRx = true }()
	benchIngest(b, goldenTransferInfoFrames())
}

func benchIngest(b *testing.B, frames [][]byte) {
	s := &countSink{}
	benchIngestTo(b, frames, s, &s.n)
}

func benchIngestTo(b *testing.B, frames [][]byte, sink Sink, got *atomic.Int64) {
	in, err := StartIngest(IngestConfig{Host: "127.0.0.1"}, sink)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Stop()
	zctx, err := zmq.NewContext()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	push, err := zctx.NewSocket(zmq.PUSH)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = push.Close() }()
	_ = push.SetLinger(0)
	_ = push.SetSndhwm(100000)
	if err := push.Connect(in.Endpoint()); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	// The sender runs in this process: one cgo call sends every message, so
	// the sender's cost (libzmq's own) stays small next to the ingest's.
	if err := sendRepeat(push, frames, b.N); err != nil {
		b.Fatal(err)
	}
	testrig.Eventually(b, time.Minute, "every message ingested", func() bool { return got.Load() >= int64(b.N) })
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
	b.ReportMetric(float64(b.N*len(frames))/el.Seconds(), "frames/s")
	if st := in.Stats(); st.BadFrames != 0 || st.TransferInfos != uint64(b.N) {
		b.Fatalf("stats %+v", st)
	}
}
