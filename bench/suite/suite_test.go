package suite

import (
	"bytes"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/bench"
)

// Tiny is a suite small enough for a unit test: every scenario kind once.
func Tiny() Config {
	c := Quick()
	c.Name = "tiny"
	c.Throughput = []Point{{4, 24, 1}, {8, 24, 1}}
	c.Overhead = []Point{{4, 24, 2}}
	c.Paced, c.Pace = []Point{{4, 24, 1}}, time.Millisecond
	c.Storm = Point{8, 60, 2}
	c.PinShares = []float64{0.5}
	c.PinPoint = Point{8, 40, 1}
	c.OpenLoopRate, c.OpenLoopRooms = 2000, 30
	c.Memory = []int{20, 40}
	c.PollRooms, c.PollRounds = 20, 3
	c.Races = false
	c.Quiet = 100 * time.Millisecond
	c.WarmUp = Point{4, 24, 1}
	return c
}

func TestTinySuite(t *testing.T) {
	var progress bytes.Buffer
	r, err := Run(Tiny(), "test", &progress)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Throughput) != 2*len(Settings()) || len(r.Paced) != 1 || r.Paced[0].Pace != time.Millisecond || len(r.Overhead) != 1 || r.Storm == nil || len(r.Pins) != 1 || r.OpenLoop == nil ||
		len(r.Memory) != 2 || len(r.Poll) != 3 {
		t.Fatalf("missing scenarios: %+v", r)
	}
	if want := len(r.Engines) * len(Settings()); r.WarmUpRuns != want {
		t.Fatalf("warm-up runs %d, want one per engine and setting (%d)", r.WarmUpRuns, want)
	}
	for _, set := range append(append([]RunSet{*r.Storm, *r.OpenLoop, r.Paced[0]}, r.Throughput...), r.Overhead...) {
		if len(set.Engines) != 3 {
			t.Fatalf("%s: %d engines", set.Name, len(set.Engines))
		}
		for _, e := range set.Engines {
			if len(e.Runs) != set.Reps {
				t.Fatalf("%s/%s: %d runs for %d reps", set.Name, e.Engine, len(e.Runs), set.Reps)
			}
			for _, run := range e.Runs {
				if n := run.Succeeded + run.Failed + run.HardPinned + run.DeadlineEnded + run.DeadlineOther; n != set.Spec.Rooms {
					t.Fatalf("%s/%s: %d of %d rooms accounted for", set.Name, e.Engine, n, set.Spec.Rooms)
				}
			}
			if e.Engine != string(bench.Upstream) && e.Pinned != 0 {
				t.Fatalf("%s/%s pinned %d rooms", set.Name, e.Engine, e.Pinned)
			}
		}
		if _, ok := set.RatioRate["actors/upstream"]; !ok {
			t.Fatalf("%s: no actors/upstream ratio", set.Name)
		}
	}
	settings := map[string]int{}
	for _, set := range r.Throughput {
		settings[set.Setting]++
		wantLoop := set.Setting != "instant"
		if (set.Transfer == "loopback") != wantLoop {
			t.Fatalf("%s: transfer %s", set.Name, set.Transfer)
		}
		if set.Setting == "rdma" && (set.Bandwidth != 25e9 || set.Spec.Latency[0] != 5*time.Microsecond || set.Spec.SlowShare != 0.01) {
			t.Fatalf("%s: rdma model %+v bandwidth %v", set.Name, set.Spec, set.Bandwidth)
		}
		for _, e := range set.Engines {
			if e.LoadAvg == "" || e.CPUPer1k <= 0 {
				t.Fatalf("%s/%s: load %q, CPU %v", set.Name, e.Engine, e.LoadAvg, e.CPUPer1k)
			}
		}
	}
	if settings["instant"] != 2 || settings["copies"] != 2 || settings["rdma"] != 2 {
		t.Fatalf("settings: %v", settings)
	}
	if len(r.StormBySetting) != len(Settings()) {
		t.Fatalf("storm by setting: %d sets", len(r.StormBySetting))
	}
	for i, set := range r.StormBySetting {
		if set.Setting != Settings()[i].Name || set.Spec.AbortShare != r.Storm.Spec.AbortShare || len(set.Engines) != 3 {
			t.Fatalf("storm at %s: %+v", Settings()[i].Name, set)
		}
		for _, e := range set.Engines {
			if e.Engine != string(bench.Upstream) && e.Pinned != 0 {
				t.Fatalf("storm at %s: %s pinned %d", set.Setting, e.Engine, e.Pinned)
			}
		}
	}
	if r.Storm.Spec.Latency[1] == 0 || r.Storm.Transfer != "loopback" || r.Overhead[0].Transfer != "instant" {
		t.Fatalf("transfer layers: storm %s %v, overhead %s", r.Storm.Transfer, r.Storm.Spec.Latency, r.Overhead[0].Transfer)
	}
	for _, e := range r.Storm.Engines {
		if len(e.A2TByPhase) == 0 {
			t.Fatalf("%s: no abort-to-terminal by phase", e.Engine)
		}
	}
	for _, p := range r.Poll {
		if p.Rounds == 0 || p.P50 <= 0 {
			t.Fatalf("poll %+v", p)
		}
	}
}

// TestOnlySettings: naming a transfer setting keeps the throughput points at
// that setting only and drops the other parts.
func TestOnlySettings(t *testing.T) {
	c, err := Quick().Only("rdma", "instant")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Throughput) == 0 || len(c.Settings) != 2 || c.Settings[0].Name != "rdma" || c.Settings[1].Name != "instant" ||
		c.Storm.Rooms != 0 || c.Memory != nil || c.PinShares != nil {
		t.Fatalf("Only(rdma, instant) = %+v", c)
	}
	if _, err := Quick().Only("ethernet"); err == nil {
		t.Fatal("unknown setting accepted")
	}
}
