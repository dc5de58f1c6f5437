package actors

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// withdrawTransfers holds every transfer and records Withdraw calls.
type withdrawTransfers struct {
	heldTransfers
	wmu       sync.Mutex
	withdrawn []uint64
}

func (w *withdrawTransfers) Withdraw(id uint64, _ []string) {
	w.wmu.Lock()
	w.withdrawn = append(w.withdrawn, id)
	w.wmu.Unlock()
}

// A room failing with a transfer in flight has its transport's Withdraw
// called (a Transfers that implements Withdrawer), once and for that room
// only; the room drains as before when the withdrawn transfer reports done.
func TestEngineWithdrawsAFailedRoomsTransfers(t *testing.T) {
	xf := &withdrawTransfers{}
	eng, err := New(Config{Clock: clock.NewFake(time.Unix(1000, 0)), Transfers: xf, Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Close(ctx)
	})
	for _, id := range []uint64{1, 2} {
		eng.Open(id)
		eng.TransferInfo(id, info("a", 2, 1))
		eng.Init(id, 2, 0)
		eng.Send(id, []int32{1, 2}, nil)
	}
	eng.Abort(1)
	eng.PollSync([]uint64{1, 2}, nil)
	xf.wmu.Lock()
	got := slices.Clone(xf.withdrawn)
	xf.wmu.Unlock()
	if !slices.Equal(got, []uint64{1}) {
		t.Fatalf("withdrawn %v, want [1]", got)
	}
	for _, d := range xf.take(1) {
		d(kv.ReasonTransferError, nil)
	}
	for _, d := range xf.take(2) {
		d(kv.ReasonNone, nil)
	}
	reps := eng.PollSync([]uint64{1, 2}, nil)
	if reps[0].Status != kv.StatusFailed || reps[0].Reason != kv.ReasonClientAbort || reps[1].Status != kv.StatusSuccess {
		t.Fatalf("replies %+v", reps)
	}
}
