package report

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/bench/stats"
	"github.com/kvxfer/kvxfer/bench/suite"
	"github.com/kvxfer/kvxfer/bench/workload"
)

// sample is a hand-made result set with every section filled.
func sample() *suite.Results {
	set := func(name string, c int, rates [3]float64) suite.RunSet {
		s := suite.RunSet{Name: name, Setting: "rdma", Transfer: "loopback", Reps: 1, Bandwidth: 25e9,
			Spec:      workload.Spec{Rooms: 100, Concurrency: c, AbortShare: 0.5, Latency: [2]time.Duration{time.Microsecond, time.Millisecond}},
			RatioRate: map[string]float64{"actors/upstream": rates[2] / rates[0], "actors/fixed": rates[2] / rates[1]}}
		for i, e := range []string{"upstream", "fixed", "actors"} {
			er := suite.EngineRuns{Engine: e, RoomsPerSec: rates[i], Runs: []suite.RunSummary{{RoomsPerSec: rates[i]}},
				CPUPer1k: float64(i + 1), HeapPerRoom: 1000 * float64(i+1), LoadAvg: "1.50 1.20 1.00"}
			a2t := []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}
			never := 0
			if e == "upstream" {
				never, er.Pinned, er.Leaked = 1, 1, 3
				er.Runs[0].HardPinned, er.Runs[0].PinnedAt = 1, map[string]int{"Bootstrapping": 1}
			}
			er.A2T = stats.Summarize(a2t, never)
			er.A2TCDF = stats.CDF(stats.Sorted(a2t, never), 10)
			s.Engines = append(s.Engines, er)
		}
		return s
	}
	storm := set("abort storm 50%", 1000, [3]float64{100, 200, 300})
	return &suite.Results{
		Suite: "test", Command: "kvxfer-bench -suite test", Engines: []string{"upstream", "fixed", "actors"},
		Throughput:     []suite.RunSet{set("throughput c=1000", 1000, [3]float64{10, 20, 40}), set("throughput c=10000", 10000, [3]float64{8, 16, 8})},
		Storm:          &storm,
		StormBySetting: []suite.RunSet{set("abort storm 50% rdma", 1000, [3]float64{100, 200, 300})},
		Pins:           []suite.RunSet{set("pins at 50%", 256, [3]float64{1, 1, 1})},
		Memory: []suite.MemoryPoint{{Rooms: 1000, Engines: []suite.MemoryUsage{{Engine: "upstream", HeapPerRoom: 1500}, {Engine: "fixed", HeapPerRoom: 1600}, {Engine: "actors", HeapPerRoom: 2200}}},
			{Rooms: 10000, Engines: []suite.MemoryUsage{{Engine: "upstream", HeapPerRoom: 1400}, {Engine: "fixed", HeapPerRoom: 1500}, {Engine: "actors", HeapPerRoom: 2100}}}},
		Poll:  []suite.PollResult{{Engine: "actors", Rooms: 1000, Rounds: 3, P50: time.Millisecond, P99: 2 * time.Millisecond, PerRoom: time.Microsecond}},
		Races: []suite.RaceRow{{Scenario: "abort-before-sender", Engine: "upstream", Final: "Bootstrapping", Pinned: true, CheckOK: true}},
	}
}

func TestMarkdownHasEverySection(t *testing.T) {
	md := Markdown(sample())
	for _, want := range []string{
		"# kvxfer benchmark report (test suite)", "`kvxfer-bench -suite test`", "## Headline",
		"rooms/s actors/upstream, 1000 concurrent rooms, rdma: loopback NIXL with 1µs–1ms per request plus bytes ÷ 25 GB/s (median of 1) | 4.00×; CPU s/1k rooms actors 3.000 vs upstream 1.000; load 1.50",
		"rooms/s actors/fixed, 10000 concurrent rooms, rdma: loopback NIXL with 1µs–1ms per request plus bytes ÷ 25 GB/s (median of 1) | 0.50×",
		"| 3000 | 1.50 |",
		"abort-to-terminal p99 under the storm, upstream | ∞",
		"abort-to-terminal p99 under the storm, actors | 3.0 ms",
		"heap bytes per live room (10000 rooms), actors | 2100 B",
		"## Abort storm", "Bootstrapping 1", "### The storm at each transfer setting", "| rdma | actors | 300 | 3.000 | 3000 | 0 | 0 |", "## Pins vs abort rate", "## Memory per live room",
		"## Batched poll latency", "| abort-before-sender |", "**pinned**",
		"![throughput](throughput.svg)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// Every table row has as many cells as its header.
	var cols int
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			cols = 0
			continue
		}
		n := strings.Count(line, " |")
		if cols == 0 {
			cols = n
		} else if n != cols && !strings.HasPrefix(line, "|---") {
			t.Errorf("row with %d cells under a %d-column header: %s", n, cols, line)
		}
	}
}

func TestWriteProducesParsableFiles(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, sample()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"throughput.svg", "abort-to-terminal-cdf.svg", "pins-vs-abort-rate.svg", "memory.svg"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		d := xml.NewDecoder(f)
		for {
			if _, err := d.Token(); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		f.Close()
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back suite.Results
	if err := json.Unmarshal(b, &back); err != nil || back.Storm == nil || back.Storm.Engines[0].A2T.P99 != stats.Inf {
		t.Fatalf("results.json does not round-trip: %v", err)
	}
}

func TestDur(t *testing.T) {
	for d, want := range map[time.Duration]string{stats.Inf: "∞", 1500: "2 µs", 2500 * time.Microsecond: "2.5 ms", 3 * time.Second: "3.00 s"} {
		if got := Dur(d); got != want {
			t.Errorf("Dur(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestGoals: each goal is met or not by its own rule, and a goal whose
// scenario the run lacks is "not measured".
func TestGoals(t *testing.T) {
	r := sample()
	// sample: rdma c=1000 actors ÷ fixed 2.0× at CPU 3 vs 2 (more CPU: not
	// met); c=10000 0.5×; no c=100, no instant sets.
	r.Throughput[0].Engines[2].CPUPer1k = 1.5
	c100 := r.Throughput[0]
	c100.Spec.Concurrency = 100
	c100.Engines = append([]suite.EngineRuns(nil), c100.Engines...)
	c100.Engines[2].TTT = stats.Summarize([]time.Duration{10, 10, 10, 10, 10, 10, 10, 10, 10, 30}, 0)
	r.Throughput = append(r.Throughput, c100)
	inst := r.Throughput[0]
	inst.Setting = "instant"
	inst.RatioRate = map[string]float64{"actors/fixed": 0.99}
	r.Throughput = append(r.Throughput, inst)
	got := map[string]Goal{}
	for _, g := range Goals(r) {
		got[g.Name] = g
	}
	check := func(name string, known, met bool) {
		t.Helper()
		g, ok := got[name]
		if !ok {
			t.Fatalf("no goal %q in %v", name, got)
		}
		if g.Known != known || g.Met != met {
			t.Errorf("%s: known %v met %v (%s), want known %v met %v", name, g.Known, g.Met, g.Figure, known, met)
		}
	}
	check("RDMA model, c=1000: actors ≥ 1.5× fixed rooms/s at ≤ its CPU per room", true, true)
	check("RDMA model, c=10000: actors ≥ 1.5× fixed rooms/s at ≤ its CPU per room", true, false)
	check("RDMA model, c=100: actors ≥ 1.5× fixed rooms/s at ≤ its CPU per room", true, true)
	check("bookkeeping only (instant), c=1000: actors ≥ 1.0× fixed rooms/s", true, false)
	check("bookkeeping only (instant), c=100: actors ≥ 1.0× fixed rooms/s", false, false)
	// sample's storm: the same A2T samples for every engine, no late posts.
	check("abort storm 50 %, closed loop: actors' abort-to-terminal p99 ≤ fixed's, no write after terminal (late posts 0)", true, true)
	// sample has no open loop.
	openLoop := "abort storm 50 %, open loop (the same arrivals for every engine): actors' abort-to-terminal p99 ≤ fixed's, no write after terminal (late posts 0)"
	check(openLoop, false, false)
	// p99 30 against p50 10: 3×.
	check("RDMA model, c=100: actors' time-to-terminal p99 ≤ 2× p50", true, false)
	// An open loop whose actors end aborts later than the fixed dict: not
	// met, and the figure names the rate.
	ol := *r.Storm
	ol.Spec.Rate = 1000
	ol.Engines = append([]suite.EngineRuns(nil), ol.Engines...)
	ol.Engines[2].A2T = stats.Summarize([]time.Duration{5 * time.Millisecond}, 0)
	r.OpenLoop = &ol
	got = map[string]Goal{}
	for _, g := range Goals(r) {
		got[g.Name] = g
	}
	check(openLoop, true, false)
	if f := got[openLoop].Figure; !strings.HasPrefix(f, "at 1000 rooms/s: 5") {
		t.Errorf("open loop figure %q", f)
	}
	ol.Engines[2].A2T = ol.Engines[1].A2T
	r.Storm.Engines[2].Runs[0].LatePosts = 1
	ol.Engines[2].Runs = []suite.RunSummary{{LatePosts: 1}}
	n := 0
	for _, g := range Goals(r) {
		if strings.HasPrefix(g.Name, "abort storm") {
			n++
			if g.Met || !g.Known {
				t.Errorf("a late post must fail the storm goal: %+v", g)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d storm goals, want the closed and the open loop", n)
	}
	if md := Markdown(r); !strings.Contains(md, "## Goals") || !strings.Contains(md, "**not met**") || !strings.Contains(md, "not measured") {
		t.Errorf("the report lacks the goals table")
	}
}

func TestHeapCellDashesARunThatCouldNotMeasure(t *testing.T) {
	if got := heapCell(0); got != "—" {
		t.Fatalf("unmeasured heap shows %q", got)
	}
	if got := heapCell(1149.4); got != "1149" {
		t.Fatalf("heap shows %q", got)
	}
}
