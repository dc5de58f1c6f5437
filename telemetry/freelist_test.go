package telemetry

import (
	"sync"
	"sync/atomic"
	"testing"
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
