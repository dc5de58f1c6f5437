package nixl

import "testing"

func TestWakersCallEveryRegisteredUntilStopped(t *testing.T) {
	var w Wakers
	w.Wake() // nothing registered: no panic
	var a, b int
	stopA := w.OnProgress(func() { a++ })
	stopB := w.OnProgress(func() { b++ })
	w.Wake()
	if a != 1 || b != 1 {
		t.Fatalf("after one wake: a=%d b=%d, want 1 1", a, b)
	}
	stopA()
	w.Wake()
	if a != 1 || b != 2 {
		t.Fatalf("after stopping a: a=%d b=%d, want 1 2", a, b)
	}
	stopB()
	stopB() // idempotent
	w.Wake()
	if a != 1 || b != 2 {
		t.Fatalf("after stopping both: a=%d b=%d", a, b)
	}
}
