package gcfloor

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name              string
		live, scan, floor uint64
		base, want        int
	}{
		{"no floor", 4 * mib, 4 * mib, 0, 100, 100},
		{"GOGC=off", 4 * mib, 4 * mib, 64 * mib, -1, -1},
		{"live at the floor", 64 * mib, 64 * mib, 64 * mib, 100, 100},
		{"live above the floor", 200 * mib, 200 * mib, 64 * mib, 100, 100},
		{"base goal reaches the floor", 40 * mib, 40 * mib, 64 * mib, 100, 100},
		{"small live heap: goal raised to the floor", 4 * mib, 4 * mib, 64 * mib, 100, 1500},
		{"rounded up: goal at least the floor", 5 * mib, 5 * mib, 64 * mib, 100, 1180},
		{"a smaller heap: capped where Go's minimum goal is the floor", 3 * mib, 3 * mib, 64 * mib, 100, 1600},
		{"stacks and globals count in the goal", 4 * mib, 16 * mib, 64 * mib, 100, 375},
		{"stacks alone reach the floor at the base", 4 * mib, 64 * mib, 64 * mib, 100, 100},
		{"a larger base wins", 4 * mib, 4 * mib, 64 * mib, 2000, 2000},
		{"nearly empty heap: capped", 1024, 1024, 64 * mib, 100, 1600},
		{"before the first cycle: capped", 0, 0, 64 * mib, 100, 1600},
		{"a floor below Go's minimum goal sets nothing", 1 * mib, 1 * mib, 2 * mib, 100, 100},
		{"scan below live is read as live", 4 * mib, 0, 64 * mib, 100, 1500},
		{"just under the floor", 63 * mib, 63 * mib, 64 * mib, 0, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Percent(c.live, c.scan, c.floor, c.base)
			if got != c.want {
				t.Fatalf("Percent(%d, %d, %d, %d) = %d, want %d", c.live, c.scan, c.floor, c.base, got, c.want)
			}
			scan := max(c.scan, c.live)
			if c.base >= 0 && c.floor > 0 && scan > 0 && uint64(got) < maxPercent(c.floor) && got > c.base {
				if goal := c.live + scan*uint64(got)/100; goal < c.floor {
					t.Fatalf("goal %d below the floor %d", goal, c.floor)
				}
				if goal := c.live + scan*uint64(got-1)/100; goal >= c.floor {
					t.Fatalf("percent %d is not the smallest: %d already reaches the floor", got, got-1)
				}
			}
		})
	}
}

// The tuner sets the percent at start and again after every cycle, and Stop
// restores the base.
func TestTunerFollowsEveryCycle(t *testing.T) {
	base := debug.SetGCPercent(100)
	defer debug.SetGCPercent(base)
	const floor = 1 << 30 // far above any test heap: the cap applies
	capped := int(maxPercent(floor))
	got := make(chan int, 64)
	tu := start(floor, func(_ uint64, p int) {
		select {
		case got <- p:
		default:
		}
	})
	if tu == nil {
		t.Fatal("tuner not started with base 100")
	}
	defer tu.Stop()
	want := func(what string) {
		t.Helper()
		select {
		case p := <-got:
			if p != capped {
				t.Fatalf("%s: percent %d, want %d", what, p, capped)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no adjustment within 10 s", what)
		}
	}
	want("at start")
	if cur := debug.SetGCPercent(capped); cur != capped {
		t.Fatalf("percent in force %d, want %d", cur, capped)
	}
	for i := range 3 {
		runtime.GC()
		want("after a cycle " + string(rune('1'+i)))
	}
	tu.Stop()
	if cur := debug.SetGCPercent(100); cur != 100 {
		t.Fatalf("after Stop: percent %d, want the base 100", cur)
	}
	runtime.GC()
	runtime.GC()
	select {
	case p := <-got:
		t.Fatalf("adjusted to %d after Stop", p)
	default:
	}
}

func TestOffOrNoFloorStartsNothing(t *testing.T) {
	base := debug.SetGCPercent(-1)
	defer debug.SetGCPercent(base)
	if tu := Start(64 << 20); tu != nil {
		t.Fatal("started under GOGC=off")
	}
	debug.SetGCPercent(100)
	if tu := Start(0); tu != nil {
		t.Fatal("started with no floor")
	}
	var tu *Tuner
	tu.Stop() // no-op
}
