package clock

import (
	"testing"
	"time"
)

func TestFakeRunsDueTimersInOrder(t *testing.T) {
	c := NewFake(time.Unix(0, 0))
	var got []int
	c.AfterFunc(3*time.Second, func() { got = append(got, 3) })
	c.AfterFunc(1*time.Second, func() { got = append(got, 1) })
	stopped := c.AfterFunc(2*time.Second, func() { got = append(got, 2) })
	c.AfterFunc(1*time.Second, func() { got = append(got, 11) })
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop should succeed once")
	}
	c.Advance(2500 * time.Millisecond)
	if len(got) != 2 || got[0] != 1 || got[1] != 11 {
		t.Fatalf("after 2.5s ran %v, want [1 11]", got)
	}
	if c.Pending() != 1 {
		t.Fatalf("pending %d, want 1", c.Pending())
	}
	c.Advance(time.Second)
	if len(got) != 3 || got[2] != 3 {
		t.Fatalf("after 3.5s ran %v", got)
	}
	if want := time.Unix(3, 500_000_000); !c.Now().Equal(want) {
		t.Fatalf("now %v, want %v", c.Now(), want)
	}
}

func TestFakeTimerArmedByATimer(t *testing.T) {
	c := NewFake(time.Unix(0, 0))
	fired := 0
	c.AfterFunc(time.Second, func() {
		c.AfterFunc(time.Second, func() { fired++ })
	})
	c.Advance(5 * time.Second)
	if fired != 1 {
		t.Fatalf("a timer armed from a timer within the advance window fired %d times", fired)
	}
}
