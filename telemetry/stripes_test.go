package telemetry

import (
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// The metric stripes count exactly when many goroutines report at once, and
// while Produce reads them.
func TestStripesCountExactly(t *testing.T) {
	o, err := New(Config{BytesPerPage: 10}) // metrics only
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, rooms = 64, 300
	stop := make(chan struct{})
	var reads atomic.Int64
	go func() { // a scraper, concurrently
		for {
			select {
			case <-stop:
				return
			default:
				o.totals()
				reads.Add(1)
				runtime.Gosched()
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rooms {
				id := uint64(g*rooms + i + 1)
				t1 := kv.Transfer{Room: id, Agent: "a", Seq: 1, SrcPages: []int32{1, 2}}
				t2 := kv.Transfer{Room: id, Agent: "a", Seq: 2, Chunk: 1, Last: true, SrcPages: []int32{3}}
				r := byFact{o.created(id)}
				r.StatusChanged(kv.StatusWaitingForInput, kv.ReasonNone)
				runtime.Gosched()
				r.Posted(&t1)
				r.StatusChanged(kv.StatusTransferring, kv.ReasonNone)
				r.TransferDone(1, kv.ReasonNone)
				runtime.Gosched()
				r.Posted(&t2)
				r.Ignored(room.Poll{})
				r.TransferDone(2, kv.ReasonTransferError)
				r.StatusChanged(kv.StatusFailed, kv.ReasonTransferError)
				r.Retired(room.Tombstone{Room: id, Status: kv.StatusFailed, Reason: kv.ReasonTransferError, Opened: true})
				o.LateTransferDone(id, 3, kv.ReasonNone)
				o.TombstoneEvicted(id)
				o.Ignored(id, room.Poll{})
			}
		}()
	}
	wg.Wait()
	close(stop)
	n := int64(goroutines * rooms)
	tt := o.totals()
	want := map[string][2]int64{
		"created":             {tt.created, n},
		"evicted":             {tt.evicted, n},
		"tracked":             {tt.tracked, 0},
		"posted":              {tt.posted, 2 * n},
		"xferOK":              {tt.xferOK, 2 * n}, // one in the room, one late
		"xferFailed":          {tt.xferFailed, n},
		"bytesOK":             {tt.bytesOK, 20 * n},
		"bytesFailed":         {tt.bytesFailed, 10 * n},
		"retired Failed":      {tt.retired[kv.StatusFailed], n},
		"failures":            {tt.failures[reasonIndex(kv.ReasonTransferError)], n},
		"absorbed live Poll":  {tt.absorbed[msgIndex(room.Poll{})][0], n},
		"absorbed other Poll": {tt.absorbed[msgIndex(room.Poll{})][1], n},
	}
	var statusN, xferN uint64
	for s := range tt.statusDur {
		for _, c := range tt.statusDur[s].counts {
			statusN += c
		}
	}
	for _, c := range tt.xferDur.counts {
		xferN += c
	}
	want["status durations"] = [2]int64{int64(statusN), 4 * n} // three changes and the retirement
	want["transfer durations"] = [2]int64{int64(xferN), 2 * n}
	for k, v := range want {
		if v[0] != v[1] {
			t.Errorf("%s = %d, want %d", k, v[0], v[1])
		}
	}
	t.Logf("%d concurrent reads", reads.Load())
}

// A stripe is whole cache lines, and what a room adds to starts the lines
// its layout gives it (the stripes are one allocation, page aligned).
func TestStripeLines(t *testing.T) {
	st := reflect.TypeOf(stripe{})
	if st.Size()%64 != 0 {
		t.Fatalf("a stripe is %d bytes, not whole lines", st.Size())
	}
	for name, off := range map[string]uintptr{"inUse": 0, "sums": 64, "retired": 128, "decisions": 192, "rows": 256} {
		if f, _ := st.FieldByName(name); f.Offset != off {
			t.Errorf("stripe.%s at byte %d, want %d", name, f.Offset, off)
		}
	}
	if f, _ := st.FieldByName("rows"); f.Type.Elem().Size() != 64 {
		t.Errorf("a bucket row is %d bytes, want one line", f.Type.Elem().Size())
	}
}
