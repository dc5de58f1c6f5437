package suite

import (
	"time"

	"github.com/kvxfer/kvxfer/bench/dict"
	"github.com/kvxfer/kvxfer/bench/large"
	"github.com/kvxfer/kvxfer/bench/stats"
	"github.com/kvxfer/kvxfer/bench/workload"
)

// Results is everything one suite run measured; it is the JSON the tool
// writes and what the report renders.
type Results struct {
	Suite      string        `json:"suite"`
	Command    string        `json:"command"`
	Started    time.Time     `json:"started"`
	Duration   time.Duration `json:"duration_ns"`
	GoVersion  string        `json:"go_version"`
	GOMAXPROCS int           `json:"gomaxprocs"`
	NumCPU     int           `json:"num_cpu"`
	// GCFloorMiB is the heap floor the run's process kept (internal/gcfloor,
	// as kvxferd's -gc-floor-mib); 0: GOGC alone.
	GCFloorMiB int `json:"gc_floor_mib"`
	// WarmUpRuns is how many untimed warm-up runs came before the first
	// measured one (Config.WarmUp; one per engine and transfer setting).
	WarmUpRuns int      `json:"warm_up_runs"`
	WarmUp     Point    `json:"warm_up"`
	Engines    []string `json:"engines"`
	// LoadAvg is /proc/loadavg at the start and the end: the machine is
	// shared, and a load above the CPU count explains noisy figures.
	LoadAvg [2]string `json:"loadavg"`

	Throughput []RunSet `json:"throughput"`
	Paced      []RunSet `json:"paced,omitempty"`
	Overhead   []RunSet `json:"overhead"`
	Storm      *RunSet  `json:"storm,omitempty"`
	// StormBySetting is the storm's mix at each transfer setting.
	StormBySetting []RunSet      `json:"storm_by_setting,omitempty"`
	OpenLoop       *RunSet       `json:"open_loop,omitempty"`
	Pins           []RunSet      `json:"pins_vs_abort_rate"`
	Memory         []MemoryPoint `json:"memory"`
	Poll           []PollResult  `json:"poll"`
	Races          []RaceRow     `json:"races"`
	// Large is the large-room scenario (bench/large), if run.
	Large *large.Results `json:"large,omitempty"`
}

// RunSet is one scenario run on every engine, Reps times, engines interleaved
// within each repetition (the order rotates) so that they share the
// machine's noise.
type RunSet struct {
	Name      string             `json:"name"`
	Setting   string             `json:"setting"`  // instant, copies, rdma, storm
	Transfer  string             `json:"transfer"` // "loopback" or "instant"
	Spec      workload.Spec      `json:"spec"`
	Bandwidth float64            `json:"bandwidth_bytes_per_s,omitempty"`
	Pace      time.Duration      `json:"pace_ns,omitempty"` // paced scheduler: shortest iteration
	Reps      int                `json:"reps"`
	Engines   []EngineRuns       `json:"engines"`
	RatioRate map[string]float64 `json:"rooms_per_sec_ratios"` // "actors/upstream": median of per-repetition ratios
	// RatioRange is the smallest and largest per-repetition ratio.
	RatioRange map[string][2]float64 `json:"rooms_per_sec_ratio_range"`
}

// EngineRuns is one engine's repetitions of a RunSet, with the figures the
// report quotes: medians of per-run rates, percentiles over the pooled
// samples of every repetition.
type EngineRuns struct {
	Engine      string        `json:"engine"`
	Runs        []RunSummary  `json:"runs"`
	RoomsPerSec float64       `json:"rooms_per_sec_median"`
	CPUPer1k    float64       `json:"cpu_s_per_1k_rooms_median"`
	TTT         stats.Summary `json:"time_to_terminal"`
	A2T         stats.Summary `json:"abort_to_terminal"`
	A2TCDF      []stats.Point `json:"abort_to_terminal_cdf,omitempty"`
	// A2TByPhase splits A2T by abort phase and source ("in-chunk/decode").
	A2TByPhase map[string]stats.Summary `json:"abort_to_terminal_by_phase,omitempty"`
	// A2TIters and TTTIters are A2T and TTT in scheduler iterations (1:
	// the poll after the abort or the admission); Poll is the batched poll's latency per iteration (what the
	// scheduler waits for the engine each iteration).
	A2TIters stats.Counted `json:"abort_to_terminal_iterations"`
	TTTIters stats.Counted `json:"time_to_terminal_iterations"`
	Poll     stats.Summary `json:"poll_latency"`
	Pinned   int           `json:"pinned_total"` // over every repetition
	Leaked   int           `json:"leaked_max"`
	// HeapPerRoom is the median over repetitions of the live heap per live
	// room mid-run (after a GC; driver state included, the same for every
	// engine). LoadAvg is /proc/loadavg after this engine's last repetition.
	HeapPerRoom float64 `json:"heap_bytes_per_live_room_median"`
	LoadAvg     string  `json:"loadavg"`
}

// RunSummary is one repetition on one engine.
type RunSummary struct {
	RoomsPerSec   float64        `json:"rooms_per_sec"`
	CPUPer1k      float64        `json:"cpu_s_per_1k_rooms"`
	Wall          time.Duration  `json:"wall_ns"`
	Succeeded     int            `json:"succeeded"`
	Failed        int            `json:"failed"`
	Reasons       map[string]int `json:"reasons,omitempty"`
	Aborted       int            `json:"aborted"`
	AbortsNever   int            `json:"aborts_never_terminal"`
	HardPinned    int            `json:"hard_pinned"`
	DeadlineEnded int            `json:"deadline_ended_after_abort"`
	DeadlineOther int            `json:"deadline_ended_other"`
	PinnedAt      map[string]int `json:"pinned_at,omitempty"`
	LiveBefore    int            `json:"live_before_grace"`
	Leaked        int            `json:"leaked"`
	Leaks         dict.Leaks     `json:"leaks"`
	Posts         int64          `json:"posts"`
	LatePosts     int64          `json:"late_posts"`
	FailureNotice int64          `json:"failure_notices"`
	Acks          int64          `json:"abort_acks"`
	Iterations    int            `json:"scheduler_iterations"`
	Stalls        int            `json:"stalls"`
}

func summarize(r *workload.Result) RunSummary {
	return RunSummary{
		RoomsPerSec: r.RoomsPerSec, CPUPer1k: r.CPUPer1k(), Wall: r.Wall, Succeeded: r.Succeeded, Failed: r.Failed,
		Reasons: r.Reasons, Aborted: r.Aborted, AbortsNever: r.AbortsNever, HardPinned: r.HardPinned,
		DeadlineEnded: r.DeadlineEnded, DeadlineOther: r.DeadlineOther, PinnedAt: r.PinnedAt,
		LiveBefore: r.LiveBeforeGrace, Leaked: r.Leaked, Leaks: r.Leaks, Posts: r.Posts, LatePosts: r.LatePosts,
		FailureNotice: r.FailureNotices, Acks: r.Acks, Iterations: r.Iterations, Stalls: r.Stalls,
	}
}

// Pinned is hard pins plus aborted rooms that ended only by a deadline.
func (s RunSummary) Pinned() int { return s.HardPinned + s.DeadlineEnded }

// MemoryPoint is the memory held per live room with Rooms rooms open at once.
type MemoryPoint struct {
	Rooms   int           `json:"rooms"`
	Engines []MemoryUsage `json:"engines"`
}

// MemoryUsage is one engine's figure: heap (live objects after a GC) and
// resident set growth, per room.
type MemoryUsage struct {
	Engine      string  `json:"engine"`
	HeapPerRoom float64 `json:"heap_bytes_per_room"`
	RSSPerRoom  float64 `json:"rss_bytes_per_room"`
	Objects     float64 `json:"heap_objects_per_room"`
}

// PollResult is the latency of one batched poll of Rooms live rooms.
type PollResult struct {
	Engine  string        `json:"engine"`
	Rooms   int           `json:"rooms"`
	Rounds  int           `json:"rounds"`
	P50     time.Duration `json:"p50_ns"`
	P99     time.Duration `json:"p99_ns"`
	PerRoom time.Duration `json:"p50_per_room_ns"`
}

// RaceRow is one race scenario on one engine.
type RaceRow struct {
	Scenario        string `json:"scenario"`
	Spec            string `json:"spec"`
	Engine          string `json:"engine"`
	Final           string `json:"final"`
	Pinned          bool   `json:"pinned"`
	Leaked          int    `json:"leaked"`
	LateWrites      int    `json:"late_writes"`
	PostsAfterAbort int    `json:"posts_after_abort"`
	Notices         int    `json:"notices"`
	CheckOK         bool   `json:"check_ok"`
	Error           string `json:"error,omitempty"`
}
