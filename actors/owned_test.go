package actors

import (
	"sync"
	"testing"
)

// Every edit is applied once, in turn, from the version published last; the
// caller reads its own edit on return; a reader never sees a version change.
func TestOwnedEditsOneOwner(t *testing.T) {
	type table struct{ n []int }
	type hist struct{ edits int }
	o := NewOwned[table, hist](&table{})
	defer o.Close()
	const writers, each = 8, 200
	var wg sync.WaitGroup
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go func() { // a reader: every version it loads is whole and stays so
		defer close(readerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			v := o.Load()
			n := len(v.n)
			for i, x := range v.n {
				if x != i {
					t.Errorf("version with %d entries: entry %d is %d", n, i, x)
					return
				}
			}
			if len(v.n) != n {
				t.Error("a published version changed")
				return
			}
		}
	}()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				var mine int
				o.Edit(func(cur *table, h *hist) *table {
					h.edits++
					mine = len(cur.n)
					next := &table{n: append(append([]int(nil), cur.n...), mine)}
					return next
				})
				if v := o.Load(); len(v.n) <= mine || v.n[mine] != mine {
					t.Errorf("edit %d not visible to its caller", mine)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-readerDone
	if got := len(o.Load().n); got != writers*each {
		t.Fatalf("%d edits applied, want %d", got, writers*each)
	}
	var edits int
	o.Edit(func(_ *table, h *hist) *table { edits = h.edits; return nil })
	if edits != writers*each {
		t.Fatalf("owner saw %d edits, want %d", edits, writers*each)
	}
}

// After Close an edit applies nothing and does not wait; the last version
// stays readable.
func TestOwnedAfterClose(t *testing.T) {
	o := NewOwned[int, struct{}](new(int))
	one := 1
	o.Edit(func(*int, *struct{}) *int { return &one })
	o.Close()
	o.Close()
	o.Edit(func(*int, *struct{}) *int { t.Error("edit ran after Close"); return nil })
	if *o.Load() != 1 {
		t.Fatalf("last version %d, want 1", *o.Load())
	}
}

// An edit that panics publishes nothing, its caller returns, and the owner
// goes on with its own state.
func TestOwnedPanickingEdit(t *testing.T) {
	o := NewOwned[int, int](new(int))
	defer o.Close()
	one, two := 1, 2
	o.Edit(func(_ *int, w *int) *int { *w = 7; return &one })
	o.Edit(func(*int, *int) *int { panic("edit") })
	if *o.Load() != 1 {
		t.Fatalf("version %d after a panicking edit, want 1", *o.Load())
	}
	var w int
	o.Edit(func(_ *int, st *int) *int { w = *st; return &two })
	if *o.Load() != 2 || w != 7 {
		t.Fatalf("version %d, owner state %d: want 2 and 7", *o.Load(), w)
	}
}
