package telemetry

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
)

// The record free list never hands one record to two holders at once, keeps
// at most freePerList records, and gives back what was put.
func TestFreeListConcurrent(t *testing.T) {
	var f freeList
	var inUse sync.Map // *roomRec → holder; the test's own bookkeeping
	var reused, twice atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []*roomRec
			for i := range 20000 {
				if i%3 != 2 {
					r := f.get()
					if r == nil {
						r = new(roomRec)
					} else {
						reused.Add(1)
					}
					if _, loaded := inUse.LoadOrStore(r, g); loaded {
						twice.Add(1)
					}
					held = append(held, r)
					continue
				}
				for _, r := range held {
					inUse.Delete(r)
					f.put(r, 0)
				}
				held = held[:0]
			}
			for _, r := range held {
				inUse.Delete(r)
				f.put(r, 0)
			}
		}()
	}
	wg.Wait()
	if twice.Load() != 0 {
		t.Fatalf("%d records handed out while held", twice.Load())
	}
	if reused.Load() == 0 {
		t.Fatal("no record was reused")
	}
	n := 0
	for f.get() != nil {
		n++
	}
	if n == 0 || n > freePerList || n != int(f.slots.Load()) {
		t.Fatalf("%d records kept (slots %d, cap %d)", n, f.slots.Load(), freePerList)
	}
}

// A room takes its record from its own id's free list and returns it there;
// at the MaxRooms cap a room whose list is empty takes a reset record from
// another list, and that record goes back to the list it came from.
func TestFreeListsByRoom(t *testing.T) {
	o, err := New(Config{MaxRooms: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close(context.Background())
	var inA, inB []uint64 // room ids of two different lists
	for id := uint64(1); len(inA) < 3 || len(inB) < 1; id++ {
		switch {
		case freeIndex(id) == freeIndex(1):
			inA = append(inA, id)
		case len(inB) == 0:
			inB = append(inB, id)
		}
	}
	a, b := freeIndex(inA[0]), freeIndex(inB[0])
	count := func(i int) int {
		var got []*roomRec
		for r := o.frees[i].get(); r != nil; r = o.frees[i].get() {
			got = append(got, r)
		}
		for _, r := range got {
			o.frees[i].put(r, i)
		}
		return len(got)
	}
	retire := func(rec actors.RoomObserver, id uint64) {
		rec.Retired(room.Tombstone{Room: id, Status: room.Success, Opened: true})
	}
	r1, r2 := o.RoomCreated(inA[0]), o.RoomCreated(inA[1])
	if _, ok := r2.(*roomRec); !ok {
		t.Fatal("second room untracked under MaxRooms 2")
	}
	retire(r1, inA[0])
	retire(r2, inA[1])
	if count(a) != 2 || count(b) != 0 {
		t.Fatalf("after two retirements: list A %d, list B %d; want 2 and 0", count(a), count(b))
	}
	// Room of list B: its list is empty and 2 records exist, so it takes one of A's.
	rb := o.RoomCreated(inB[0])
	if _, ok := rb.(*roomRec); !ok {
		t.Fatal("room untracked although a reset record was free")
	}
	if count(a) != 1 {
		t.Fatalf("list A %d after the steal, want 1", count(a))
	}
	retire(rb, inB[0])
	if count(a) != 2 || count(b) != 0 {
		t.Fatalf("stolen record returned: list A %d, list B %d; want 2 and 0", count(a), count(b))
	}
	// Both records in use: a third room is untracked.
	r3, r4 := o.RoomCreated(inA[0]), o.RoomCreated(inA[2])
	if _, ok := o.RoomCreated(inB[0]).(*untracked); !ok {
		t.Fatal("a third live room was tracked under MaxRooms 2")
	}
	if n := o.totals().tracked; n != 2 {
		t.Fatalf("tracked %d, want 2", n)
	}
	retire(r3, inA[0])
	retire(r4, inA[2])
	if n := o.records.Load(); n != 2 {
		t.Fatalf("%d records exist, want 2", n)
	}
}
