package zmqio

import (
	"bytes"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/transport/wire"
)

// batchRec is a BatchSink and RegistrationFramesSink recording every delivery
// in order: "ti:<room>", "abort:<room>", "reg", plus the kept registration frames.
type batchRec struct {
	recSink
	bmu    sync.Mutex
	runs   int
	kept   [][][]byte
	events chan struct{}
}

func newBatchRec() *batchRec {
	return &batchRec{recSink: recSink{events: make(chan struct{}, 4096)}}
}

func (s *batchRec) TransferInfos(ts []*wire.TransferInfo) {
	s.bmu.Lock()
	s.runs++
	s.bmu.Unlock()
	for _, t := range ts {
		s.add(t)
	}
}

func (s *batchRec) RegistrationFrames(r *wire.Registration, frames [][]byte) {
	s.bmu.Lock()
	s.kept = append(s.kept, frames)
	s.bmu.Unlock()
	s.add(r)
}

func label(v any) string {
	switch m := v.(type) {
	case *wire.TransferInfo:
		return fmt.Sprintf("ti:%d", m.Room)
	case *wire.Abort:
		return fmt.Sprintf("abort:%d", m.Room)
	case *wire.Registration:
		return "reg"
	case error:
		return "bad"
	}
	return fmt.Sprintf("%T", v)
}

func startRec(t *testing.T, sink Sink) (*Ingest, *zmq.Socket) {
	t.Helper()
	in, err := StartIngest(IngestConfig{Host: "127.0.0.1", PollInterval: 10 * time.Millisecond}, sink)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Stop)
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	push := testPush(t, zctx, in.Endpoint())
	t.Cleanup(func() { push.Close(); zctx.Term() })
	return in, push
}

// TestIngestBatchSinkKeepsOrder: with a BatchSink, transfer infos arrive in
// runs, and the order across kinds (transfer infos, aborts, registrations,
// bad frames) is exactly the order sent; registration frames kept by the sink
// stay intact while later batches reuse the receive buffers.
func TestIngestBatchSinkKeepsOrder(t *testing.T) {
	sink := newBatchRec()
	in, push := startRec(t, sink)
	var want []string
	reg := goldenRegistrationFrames()
	for i := range 100 {
		base := uint64(1000 + 10*i)
		for k := range 3 {
			ti := goldenTransferInfo()
			ti.Room = base + uint64(k)
			sendFrames(t, push, ti.Encode())
			want = append(want, fmt.Sprintf("ti:%d", ti.Room))
		}
		sendFrames(t, push, fr("ABORT", fmt.Sprint(base+5), "10.0.0.7", "41235"))
		want = append(want, fmt.Sprintf("abort:%d", base+5))
		if i%10 == 0 {
			sendFrames(t, push, reg)
			want = append(want, "reg")
		}
		if i%25 == 0 {
			sendFrames(t, push, fr("NixlMsgGuard", "x"))
			want = append(want, "bad")
		}
	}
	got := sink.wait(t, len(want))
	var labels []string
	for _, v := range got {
		labels = append(labels, label(v))
	}
	if !reflect.DeepEqual(labels, want) {
		t.Fatalf("order:\n got %v\nwant %v", labels, want)
	}
	sink.bmu.Lock()
	defer sink.bmu.Unlock()
	if len(sink.kept) != 10 {
		t.Fatalf("%d registrations kept", len(sink.kept))
	}
	for _, k := range sink.kept {
		if len(k) != len(reg) {
			t.Fatalf("kept %d frames of %d", len(k), len(reg))
		}
		for i := range reg {
			if !bytes.Equal(k[i], reg[i]) {
				t.Fatalf("kept registration frame %d changed: %q vs %q", i, k[i], reg[i])
			}
		}
	}
	if st := in.Stats(); st.TransferInfos != 300 || st.Aborts != 100 || st.Registrations != 10 || st.BadFrames != 4 || st.Messages != uint64(len(want)) {
		t.Fatalf("stats %+v", st)
	}
}

// TestIngestManyFrames: ABORTs with more frames than a batch guarantees a
// message (rxHeadroom) still decode as their layout says (frames past it are
// ignored, as DecodeInbound ignores them).
func TestIngestManyFrames(t *testing.T) {
	sink := newRecSink()
	_, push := startRec(t, sink)
	frames := fr("ABORT", "42", "10.0.0.7", "41235")
	for range 3 * rxHeadroom {
		frames = append(frames, []byte("extra"))
	}
	want, err := wire.DecodeInbound(frames[:4])
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	for range n {
		sendFrames(t, push, frames)
	}
	for i, v := range sink.wait(t, n) {
		if !reflect.DeepEqual(v, want) {
			t.Fatalf("message %d: %#v", i, v)
		}
	}
}

// TestIngestPerFramePath: zmq4's per-frame receive (the fallback when the
// socket handle cannot be read) delivers the same messages.
func TestIngestPerFramePath(t *testing.T) {
	useRx = false
	defer func() { useRx = true }()
	sink := newBatchRec()
	_, push := startRec(t, sink)
	sendFrames(t, push, goldenTransferInfoFrames())
	sendFrames(t, push, fr("ABORT", "42", "10.0.0.7", "41235"))
	got := sink.wait(t, 2)
	if label(got[0]) != fmt.Sprintf("ti:%d", goldenTransferInfo().Room) || label(got[1]) != "abort:42" {
		t.Fatalf("got %v %v", label(got[0]), label(got[1]))
	}
}
