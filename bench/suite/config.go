// Package suite runs the benchmark scenarios against every engine,
// side by side in one process, and collects the results the report renders:
// throughput against concurrency over the real transfer pool, the pure
// overhead over an instant transfer layer, an abort storm, pins against the
// abort rate, memory per live room, batched poll latency and the seeds' race
// scenarios.
package suite

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/bench"
	"github.com/kvxfer/kvxfer/bench/large"
	"github.com/kvxfer/kvxfer/bench/workload"
)

// Point is one throughput measurement: a closed loop of Concurrency rooms
// over Rooms rooms, repeated Reps times.
type Point struct {
	Concurrency int `json:"concurrency"`
	Rooms       int `json:"rooms"`
	Reps        int `json:"reps"`
}

// Setting is a transfer layer the throughput points run on (every ratio is
// quoted at three settings side by side, since the ratios move with the
// cost of a write).
type Setting struct {
	// Name: "instant", "copies", "rdma".
	Name string `json:"name"`
	// Loopback: real copies over the loopback NIXL fabric; otherwise the
	// instant layer (bookkeeping only).
	Loopback bool `json:"loopback"`
	// Latency is each request's fixed part, uniform over the range;
	// SlowShare of the requests take Slow instead (a tail).
	Latency   [2]time.Duration `json:"latency_ns"`
	SlowShare float64          `json:"slow_share,omitempty"`
	Slow      time.Duration    `json:"slow_ns,omitempty"`
	// Bandwidth adds bytes ÷ Bandwidth (bytes/s) to each request.
	Bandwidth float64 `json:"bandwidth_bytes_per_s,omitempty"`
}

// Settings are the three transfer settings of the throughput matrix:
// instant (bookkeeping only), real loopback copies with no injected latency,
// and a realistic RDMA model (5–20 µs fixed plus bytes ÷ 25 GB/s per
// request, 1 % of requests take 500 µs).
func Settings() []Setting {
	return []Setting{
		{Name: "instant"},
		{Name: "copies", Loopback: true},
		{Name: "rdma", Loopback: true, Latency: [2]time.Duration{5 * time.Microsecond, 20 * time.Microsecond},
			SlowShare: 0.01, Slow: 500 * time.Microsecond, Bandwidth: 25e9},
	}
}

// Config is a suite: what to run, how big, how often.
type Config struct {
	Name    string
	Engines []bench.Kind
	Seed    uint64
	// Throughput runs every point at every Setting, no aborts.
	Throughput []Point
	Settings   []Setting
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
	// StormSettings repeats the storm's mix at these transfer settings
	// (StormSettingReps each), so pins and abort-to-terminal are quoted per
	// setting next to the throughput figures.
	StormSettings    []Setting
	StormSettingReps int
	// PinShares: the pins-vs-abort-rate sweep, one run per share at PinPoint.
	PinShares []float64
	PinPoint  Point
	// OpenLoop, if Rate > 0: an open-loop run at Rate rooms/s with the storm's
	// mix, OpenLoopReps times (default 1): every engine gets the same
	// arrivals, where the closed-loop storm gives a faster engine more.
	OpenLoopRate  float64
	OpenLoopRooms int
	OpenLoopReps  int
	// Memory: live rooms held at once, per measurement.
	Memory []int
	// PollRooms live rooms polled in one batch, PollRounds times.
	PollRooms, PollRounds int
	Races                 bool
	// Large, if set: the large-room scenario over real NIXL (bench/large;
	// skipped with the reason where NIXL is absent).
	Large *large.Config
	// WarmUp: before the first measured run, every engine runs this many
	// rooms at this concurrency, untimed, at every transfer setting (Reps
	// unused): the process's first rooms grow goroutine stacks, maps and
	// pools, and were the time-to-terminal tail of the first set's first
	// repetition.
	WarmUp Point
	// GCFloorMiB is the process's GC heap floor during the run
	// (internal/gcfloor; kvxferd's -gc-floor-mib, default 64; 0: GOGC alone).
	GCFloorMiB int
	// Quiet overrides how long a run waits, with nothing changing, before it
	// declares the workload quiesced (default: workload.Options' 400 ms).
	Quiet time.Duration
}

// Quick is the suite `make bench-suite` runs: under three minutes on two
// cores, every measurement once at small scale, the throughput points and the
// storm repeated to quote medians.
func Quick() Config {
	return Config{
		Name:             "quick",
		Engines:          bench.Kinds(),
		Seed:             1,
		Throughput:       []Point{{100, 1000, 3}, {1000, 5000, 3}, {10000, 10000, 1}},
		Settings:         Settings(),
		Storm:            Point{1000, 2000, 3},
		StormShare:       0.5,
		StormLatency:     [2]time.Duration{50 * time.Microsecond, 2 * time.Millisecond},
		StormSettings:    Settings(),
		StormSettingReps: 1,
		PinShares:        []float64{0.05, 0.25, 0.5, 1},
		PinPoint:         Point{256, 800, 1},
		OpenLoopRate:     1000,
		OpenLoopRooms:    2000,
		OpenLoopReps:     3,
		Memory:           []int{1000, 10000},
		PollRooms:        1000,
		PollRounds:       40,
		Races:            true,
		Large:            QuickLarge(),
		GCFloorMiB:       64,
		WarmUp:           Point{100, 1000, 1},
	}
}

// Large-room geometries: a 8B-class model at TP 8 (32 layers, one KV head of
// 128 fp16 per rank: 256 B per token and buffer) in 16-token pages, and a
// 70B-class one at TP 8 (80 layers, same per-token size) in 32-token pages.
// Pages come in runs of 4 on each side (a pool some way from fresh), or, in
// the "fresh" variants, one run a room (one descriptor per buffer).
var (
	Large1MiB       = large.Geometry{Name: "32L p16 1MiB", Layers: 32, PageTokens: 16, TokenBytes: 256, RoomPages: 4, Run: 4}
	Large16MiB      = large.Geometry{Name: "32L p16 16MiB", Layers: 32, PageTokens: 16, TokenBytes: 256, RoomPages: 64, Run: 4}
	Large16MiBFresh = large.Geometry{Name: "32L p16 16MiB fresh", Layers: 32, PageTokens: 16, TokenBytes: 256, RoomPages: 64, Run: 64}
	Large64MiB      = large.Geometry{Name: "80L p32 64MiB", Layers: 80, PageTokens: 32, TokenBytes: 256, RoomPages: 51, Run: 4}
	Large64MiBFresh = large.Geometry{Name: "80L p32 64MiB fresh", Layers: 80, PageTokens: 32, TokenBytes: 256, RoomPages: 51, Run: 51}
)

// QuickLarge is the quick suite's large-room scenario: 1 and 16 MiB rooms
// (and 16 MiB from a fresh pool), 1 and 4 in flight, over UCX on one host
// (tcp for active messages; puts by cma, a single-copy process_vm_writev).
// UCX refuses shared memory alone (sm,self) under NIXL's peer error mode.
func QuickLarge() *large.Config {
	return &large.Config{Geometries: []large.Geometry{Large1MiB, Large16MiB, Large16MiBFresh}, InFlight: []int{1, 4},
		Pairs: 7, Warm: 1, RoundBytes: 32 << 20, Seed: 1, Transport: "tcp,self,sm"}
}

// FullLarge adds 64 MiB rooms of an 80-layer model and 16 rooms in flight.
func FullLarge() *large.Config {
	return &large.Config{Geometries: []large.Geometry{Large1MiB, Large16MiB, Large64MiB, Large64MiBFresh}, InFlight: []int{1, 4, 16},
		Pairs: 11, Warm: 1, RoundBytes: 256 << 20, Seed: 1, Transport: "tcp,self,sm"}
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
	c.Overhead = []Point{{10000, 50000, 3}, {100000, 100000, 1}}
	c.Storm = Point{1000, 10000, 5}
	c.StormSlowShare, c.StormSlow = 0.01, 20*time.Millisecond
	c.PinShares = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1}
	c.PinPoint = Point{1000, 3000, 2}
	c.OpenLoopRate, c.OpenLoopRooms, c.OpenLoopReps = 1500, 20000, 1
	c.Memory = []int{1000, 10000, 100000}
	c.PollRounds = 200
	c.Large = FullLarge()
	return c
}

// WithReps sets every repetition count of c to n.
func (c Config) WithReps(n int) Config {
	for _, ps := range [][]Point{c.Throughput, c.Overhead, c.Paced} {
		for i := range ps {
			ps[i].Reps = n
		}
	}
	c.Storm.Reps, c.PinPoint.Reps, c.OpenLoopReps = n, n, n
	return c
}

// Only keeps the named parts of c (throughput, paced, overhead, storm, pins,
// openloop, memory, poll, races, large) and drops the rest. Settings may also name
// transfer settings (instant, copies, rdma) to keep only those.
func (c Config) Only(parts ...string) (Config, error) {
	keep := map[string]bool{}
	var sets []Setting
	for _, p := range parts {
		switch p {
		case "throughput", "paced", "overhead", "storm", "pins", "openloop", "memory", "poll", "races", "large":
			keep[p] = true
		default:
			i := slices.IndexFunc(c.Settings, func(s Setting) bool { return s.Name == p })
			if i < 0 {
				return c, fmt.Errorf("suite: unknown part %q", p)
			}
			sets = append(sets, c.Settings[i])
			keep["throughput"] = true
		}
	}
	if sets != nil {
		c.Settings = sets
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
		c.StormSettings = nil
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
	if !keep["large"] {
		c.Large = nil
	}
	return c, nil
}

// stormSpec is the abort mix of the storm, the pin sweep and the open loop.
func (c Config) stormSpec(p Point, share float64) workload.Spec {
	return workload.Spec{Rooms: p.Rooms, Concurrency: p.Concurrency, AbortShare: share, TwoAgents: 0.3,
		Latency: c.StormLatency, SlowShare: c.StormSlowShare, Slow: c.StormSlow, Seed: c.Seed}
}
