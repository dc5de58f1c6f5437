package bench

import (
	"runtime"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// BenchmarkRoomLifecycle runs the same room life (sender, one transfer info,
// two chunks, polls until Success, clear) through each engine over the same
// gate, which completes writes at once: the cost of the design around the
// transfers, side by side.
func BenchmarkRoomLifecycle(b *testing.B) {
	for _, k := range Kinds() {
		b.Run(string(k), func(b *testing.B) {
			t, err := NewTarget(k)
			if err != nil {
				b.Fatal(err)
			}
			defer t.Close()
			ti := info(2, 1)
			out := make([]kv.Reply, 0, 1)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := uint64(i + 1)
				ids := []uint64{id}
				t.Engine.Open(id)
				t.Engine.TransferInfo(id, ti)
				// As SGLang's scheduler: init and send once the room polls
				// WaitingForInput (the dict engines, like upstream, fail a
				// chunk that reaches a worker before its transfer info).
				out = waitFor(b, t, ids, out, kv.StatusWaitingForInput)
				t.Engine.Init(id, 2, 0)
				t.Engine.Send(id, []int32{1}, nil)
				t.Engine.Send(id, []int32{2}, nil)
				out = waitFor(b, t, ids, out, kv.StatusSuccess)
				t.Engine.Clear(id)
			}
		})
	}
}

func waitFor(b *testing.B, t *Target, ids []uint64, out []kv.Reply, st kv.Status) []kv.Reply {
	for {
		out = t.Engine.Poll(ids, out)
		if out[0].Status >= st {
			return out
		}
		if out[0].Status == kv.StatusFailed {
			b.Fatalf("room %d failed: %v", ids[0], out[0].Reason)
		}
		runtime.Gosched()
	}
}
