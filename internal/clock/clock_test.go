package clock

import (
	"fmt"
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

// TestFakeNowDuringAdvance: a timer's callback reads its own due time, and
// Now on other goroutines (a load, no lock) never goes back while Advance
// runs, and reads the target once it returned.
func TestFakeNowDuringAdvance(t *testing.T) {
	start := time.Unix(100, 0)
	c := NewFake(start)
	var seen []time.Time
	for i := 1; i <= 3; i++ {
		c.AfterFunc(time.Duration(i)*time.Second, func() { seen = append(seen, c.Now()) })
	}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		last := c.Now()
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			now := c.Now()
			if now.Before(last) {
				done <- fmt.Errorf("Now went back from %v to %v", last, now)
				return
			}
			last = now
		}
	}()
	c.Advance(10 * time.Second)
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i, s := range seen {
		if want := start.Add(time.Duration(i+1) * time.Second); !s.Equal(want) {
			t.Fatalf("timer %d read %v, want its due time %v", i+1, s, want)
		}
	}
	if want := start.Add(10 * time.Second); !c.Now().Equal(want) {
		t.Fatalf("now %v, want %v", c.Now(), want)
	}
}
