package pages

import (
	"context"
	"slices"
	"testing"
)

func TestOrderAndAccounting(t *testing.T) {
	p := New(4)
	a, ok := p.TryTake(2) // lowest first
	if !ok || !slices.Equal(a, []int32{1, 0}) || p.Held() != 2 {
		t.Fatalf("first take %v ok %v held %d", a, ok, p.Held())
	}
	if _, ok := p.TryTake(3); ok {
		t.Fatal("took 3 of 2 free")
	}
	p.Put([]int32{0}) // LIFO: next out
	if b, _ := p.TryTake(1); b[0] != 0 {
		t.Fatalf("Put entry not reused first: %v", b)
	}
	p.PutBack([]int32{0}) // FIFO: behind 3 and 2
	if c, _ := p.TryTake(2); !slices.Equal(c, []int32{3, 2}) {
		t.Fatalf("PutBack entry handed out before the free ones: %v", c)
	}
	if p.Held() != 3 {
		t.Fatalf("held %d", p.Held())
	}
}

// TestTakeWaitsForARelease: a Take that cannot be served is served by a later
// Put (whichever of the two runs first; nothing is timed), a Take larger than
// the pool fails at once, and a cancelled context ends a wait.
func TestTakeWaitsForARelease(t *testing.T) {
	p := New(2)
	first, _ := p.TryTake(2)
	got := make(chan []int32)
	go func() {
		xs, ok := p.Take(context.Background(), 1)
		if !ok {
			t.Error("take failed")
		}
		got <- xs
	}()
	p.Put(first[:1])
	if xs := <-got; len(xs) != 1 || xs[0] != first[0] {
		t.Fatalf("got %v", xs)
	}
	if _, ok := p.Take(context.Background(), 3); ok {
		t.Fatal("took more than the pool holds")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := p.Take(ctx, 2); ok {
		t.Fatal("took 2 with 1 free")
	}
}
