// Package suite runs the benchmark scenarios of issue 5 against every engine,
// side by side in one process, and collects the results the report renders:
// throughput against concurrency over the real transfer pool, the pure
// overhead over an instant transfer layer, an abort storm, pins against the
// abort rate, memory per live room, batched poll latency and the seeds' race
// scenarios.
package suite

import (
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/bench"
	"github.com/kvxfer/kvxfer/bench/workload"
)

// Point is one throughput measurement: a closed loop of Concurrency rooms
// over Rooms rooms, repeated Reps times.
type Point struct {
	Concurrency int `json:"concurrency"`
	Rooms       int `json:"rooms"`
	Reps        int `json:"reps"`
}

// Config is a suite: what to run, how big, how often.
type Config struct {
	Name    string
	Engines []bench.Kind
	Seed    uint64
	// Throughput runs over the loopback transfer pool, no aborts, with
	// ThroughputLatency per NIXL request.
	Throughput        []Point
	ThroughputLatency [2]time.Duration
	// Paced repeats throughput points with a scheduler that spends Pace per
	// iteration (a forward pass) instead of spinning on its polls.
	Paced []Point
	Pace  time.Duration
	// Overhead is the same closed loop over the instant transfer layer: the
	// engines' own cost.
	Overhead []Point
	// Storm is the abort storm over the loopback pool: AbortShare of the rooms
	// aborted at every phase from both sources, StormLatency per request
	// (wide: a non-last chunk is often on the wire when its abort lands).
	Storm        Point
	StormShare   float64
	StormLatency [2]time.Duration
	// StormSlowShare of the storm's requests take StormSlow (a tail).
	StormSlowShare float64
	StormSlow      time.Duration
	// PinShares: the pins-vs-abort-rate sweep, one run per share at PinPoint.
	PinShares []float64
	PinPoint  Point
	// OpenLoop, if Rate > 0: an open-loop run at Rate rooms/s with the storm's mix.
	OpenLoopRate  float64
	OpenLoopRooms int
	// Memory: live rooms held at once, per measurement.
	Memory []int
	// PollRooms live rooms polled in one batch, PollRounds times.
	PollRooms, PollRounds int
	Races                 bool
	// Quiet overrides how long a run waits, with nothing changing, before it
	// declares the workload quiesced (default: workload.Options' 400 ms).
	Quiet time.Duration
}

// Quick is the suite `make bench-suite` runs: under three minutes on two
// cores, every measurement once at small scale, the throughput points and the
// storm repeated to quote medians.
func Quick() Config {
	return Config{
		Name:              "quick",
		Engines:           bench.Kinds(),
		Seed:              1,
		Throughput:        []Point{{100, 1000, 3}, {1000, 5000, 5}, {10000, 10000, 2}},
		ThroughputLatency: [2]time.Duration{10 * time.Microsecond, 200 * time.Microsecond},
		Overhead:          []Point{{1000, 30000, 3}},
		Storm:             Point{1000, 2000, 3},
		StormShare:        0.5,
		StormLatency:      [2]time.Duration{50 * time.Microsecond, 2 * time.Millisecond},
		PinShares:         []float64{0.05, 0.25, 0.5, 1},
		PinPoint:          Point{256, 800, 1},
		Memory:            []int{1000, 10000},
		PollRooms:         1000,
		PollRounds:        40,
		Races:             true,
	}
}

// Full is `make bench-full`: more rooms and repetitions, the paced
// scheduler, a latency tail in the storm, and the scaling points up to
// 100,000 concurrent rooms (memory, and the pure overhead over the instant
// transfer layer; over the loopback pool the spinning scheduler stops at
// 10,000 rooms, beyond which a run of the actor engine on two cores takes
// tens of minutes). About ten minutes on two cores.
func Full() Config {
	c := Quick()
	c.Name = "full"
	c.Throughput = []Point{{100, 3000, 5}, {1000, 10000, 5}, {10000, 10000, 3}}
	c.Paced, c.Pace = []Point{{1000, 10000, 3}, {10000, 10000, 1}}, 5*time.Millisecond
	c.Overhead = []Point{{1000, 20000, 5}, {10000, 50000, 3}, {100000, 100000, 1}}
	c.Storm = Point{1000, 10000, 5}
	c.StormSlowShare, c.StormSlow = 0.01, 20*time.Millisecond
	c.PinShares = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1}
	c.PinPoint = Point{1000, 3000, 2}
	c.OpenLoopRate, c.OpenLoopRooms = 1500, 20000
	c.Memory = []int{1000, 10000, 100000}
	c.PollRounds = 200
	return c
}

// WithReps sets every repetition count of c to n.
func (c Config) WithReps(n int) Config {
	for _, ps := range [][]Point{c.Throughput, c.Overhead, c.Paced} {
		for i := range ps {
			ps[i].Reps = n
		}
	}
	c.Storm.Reps, c.PinPoint.Reps = n, n
	return c
}

// Only keeps the named parts of c (throughput, paced, overhead, storm, pins,
// openloop, memory, poll, races) and drops the rest.
func (c Config) Only(parts ...string) (Config, error) {
	keep := map[string]bool{}
	for _, p := range parts {
		switch p {
		case "throughput", "paced", "overhead", "storm", "pins", "openloop", "memory", "poll", "races":
			keep[p] = true
		default:
			return c, fmt.Errorf("suite: unknown part %q", p)
		}
	}
	if !keep["throughput"] {
		c.Throughput = nil
	}
	if !keep["paced"] {
		c.Paced = nil
	}
	if !keep["overhead"] {
		c.Overhead = nil
	}
	if !keep["storm"] {
		c.Storm = Point{}
	}
	if !keep["pins"] {
		c.PinShares = nil
	}
	if !keep["openloop"] {
		c.OpenLoopRate = 0
	}
	if !keep["memory"] {
		c.Memory = nil
	}
	if !keep["poll"] {
		c.PollRooms = 0
	}
	c.Races = c.Races && keep["races"]
	return c, nil
}

// stormSpec is the abort mix of the storm, the pin sweep and the open loop.
func (c Config) stormSpec(p Point, share float64) workload.Spec {
	return workload.Spec{Rooms: p.Rooms, Concurrency: p.Concurrency, AbortShare: share, TwoAgents: 0.3,
		Latency: c.StormLatency, SlowShare: c.StormSlowShare, Slow: c.StormSlow, Seed: c.Seed}
}
