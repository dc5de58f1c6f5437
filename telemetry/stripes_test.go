package telemetry

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
)

// The metric stripes count exactly when many goroutines report at once,
// also with more Ps than stripes (those Ps share the over stripe and add
// atomically; a P's own stripe is written with plain loads and stores while
// pinned), and while Produce reads them.
func TestStripesCountExactly(t *testing.T) {
	o, err := New(Config{BytesPerPage: 10}) // metrics only
	if err != nil {
		t.Fatal(err)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(len(o.shards) + 16))
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
				t1 := room.Transfer{Room: id, Agent: "a", Seq: 1, SrcPages: []int32{1, 2}}
				t2 := room.Transfer{Room: id, Agent: "a", Seq: 2, Chunk: 1, Last: true, SrcPages: []int32{3}}
				r := o.RoomCreated(id)
				r.StatusChanged(room.WaitingForInput, room.ReasonNone)
				runtime.Gosched()
				r.Posted(&t1)
				r.StatusChanged(room.Transferring, room.ReasonNone)
				r.TransferDone(1, room.ReasonNone)
				runtime.Gosched()
				r.Posted(&t2)
				r.Ignored(room.Poll{})
				r.TransferDone(2, room.ReasonTransferError)
				r.StatusChanged(room.Failed, room.ReasonTransferError)
				r.Retired(room.Tombstone{Room: id, Status: room.Failed, Reason: room.ReasonTransferError, Opened: true})
				o.LateTransferDone(id, 3, room.ReasonNone)
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
		"retired Failed":      {tt.retired[room.Failed], n},
		"failures":            {tt.failures[reasonIndex(room.ReasonTransferError)], n},
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
	t.Logf("over stripe (Ps beyond the stripes) created %d rooms; %d concurrent reads", o.over.created.Load(), reads.Load())
}

// The stripe that Ps beyond the stripes share (over) adds atomically: many
// goroutines adding to it at once lose no update (a plain load and store,
// which a P's own stripe uses while pinned, would).
func TestOverStripeAddsAtomically(t *testing.T) {
	o, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, adds = 8, 200000
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := o.over
			for range adds {
				st.add(&st.posted, 1)
				st.observe(&st.xferDur, time.Millisecond, transferBoundsNs)
			}
		}()
	}
	wg.Wait()
	var n int64
	for i := range o.over.xferDur.counts {
		n += o.over.xferDur.counts[i].Load()
	}
	if got, want := o.over.posted.Load(), int64(goroutines*adds); got != want || n != want {
		t.Fatalf("posted %d, transfer durations %d; want %d", got, n, want)
	}
}
