package report

import (
	"fmt"
	"strings"

	"github.com/kvxfer/kvxfer/bench/suite"
)

// Goal is one target the actor engine is held to, checked against a run.
type Goal struct {
	Name   string // what is asked
	Figure string // what this run measured, with its load
	Met    bool
	Known  bool // false: the run did not measure it (scenario skipped)
}

// Goal thresholds (docs/benchmarks.md, "Goals").
const (
	goalRDMARatio    = 1.5 // actors ÷ fixed rooms/s at the RDMA model, at ≤ its CPU per room
	goalInstantRatio = 1.0 // actors ÷ fixed rooms/s, bookkeeping only
	goalTailRatio    = 2.0 // c=100 RDMA model: time-to-terminal p99 ≤ this × p50
)

// engineRuns is the named engine's runs of a set.
func engineRuns(s *suite.RunSet, name string) (suite.EngineRuns, bool) {
	for _, e := range s.Engines {
		if e.Engine == name {
			return e, true
		}
	}
	return suite.EngineRuns{}, false
}

// Goals checks r against the engine's goals; a goal whose scenario r lacks
// is listed as not measured.
func Goals(r *suite.Results) []Goal {
	var out []Goal
	for _, c := range []int{100, 1000, 10000} {
		g := Goal{Name: fmt.Sprintf("RDMA model, c=%d: actors ≥ %.1f× fixed rooms/s at ≤ its CPU per room", c, goalRDMARatio)}
		if s := findSet(r.Throughput, "rdma", c); s != nil {
			a, okA := engineRuns(s, "actors")
			f, okF := engineRuns(s, "fixed")
			if ratio, ok := s.RatioRate["actors/fixed"]; ok && okA && okF {
				g.Known = true
				g.Met = ratio >= goalRDMARatio && a.CPUPer1k <= f.CPUPer1k
				g.Figure = fmt.Sprintf("%.2f×, CPU s/1k rooms %.3f vs %.3f; load %s", ratio, a.CPUPer1k, f.CPUPer1k, rowLoad(*s))
			}
		}
		out = append(out, g)
	}
	for _, c := range []int{100, 1000, 10000} {
		g := Goal{Name: fmt.Sprintf("bookkeeping only (instant), c=%d: actors ≥ %.1f× fixed rooms/s", c, goalInstantRatio)}
		if s := findSet(r.Throughput, "instant", c); s != nil {
			if ratio, ok := s.RatioRate["actors/fixed"]; ok {
				g.Known, g.Met = true, ratio >= goalInstantRatio
				g.Figure = fmt.Sprintf("%.2f×; load %s", ratio, rowLoad(*s))
			}
		}
		out = append(out, g)
	}
	out = append(out, stormGoal("abort storm 50 %, closed loop", r.Storm))
	out = append(out, stormGoal("abort storm 50 %, open loop (the same arrivals for every engine)", r.OpenLoop))
	g := Goal{Name: fmt.Sprintf("RDMA model, c=100: actors' time-to-terminal p99 ≤ %.0f× p50", goalTailRatio)}
	if s := findSet(r.Throughput, "rdma", 100); s != nil {
		if a, ok := engineRuns(s, "actors"); ok && a.TTT.P50 > 0 {
			g.Known = true
			g.Met = float64(a.TTT.P99) <= goalTailRatio*float64(a.TTT.P50)
			g.Figure = fmt.Sprintf("p99 %s, p50 %s (%.1f×; in scheduler iterations %d / %d)", Dur(a.TTT.P99), Dur(a.TTT.P50),
				float64(a.TTT.P99)/float64(a.TTT.P50), a.TTTIters.P99, a.TTTIters.P50)
			if f, ok := engineRuns(s, "fixed"); ok && f.TTT.P50 > 0 {
				g.Figure += fmt.Sprintf("; fixed %.1f× (%d / %d)", float64(f.TTT.P99)/float64(f.TTT.P50), f.TTTIters.P99, f.TTTIters.P50)
			}
			g.Figure += "; load " + rowLoad(*s)
		}
	}
	return append(out, g)
}

// stormGoal checks the abort-to-terminal goal on a storm's run set s (nil:
// not measured). A closed loop admits a room as one ends, so a faster engine
// also carries more rooms' calls in each scheduler iteration; an open loop
// gives every engine the same arrivals, as a deployment's clients do.
func stormGoal(scenario string, s *suite.RunSet) Goal {
	g := Goal{Name: scenario + ": actors' abort-to-terminal p99 ≤ fixed's, no write after terminal (late posts 0)"}
	if s == nil {
		return g
	}
	a, okA := engineRuns(s, "actors")
	f, okF := engineRuns(s, "fixed")
	if !okA || !okF {
		return g
	}
	late := int64(0)
	for _, run := range a.Runs {
		late += run.LatePosts
	}
	g.Known = true
	g.Met = a.A2T.P99 <= f.A2T.P99 && late == 0
	g.Figure = fmt.Sprintf("%s vs %s, late posts %d; load %s", Dur(a.A2T.P99), Dur(f.A2T.P99), late, rowLoad(*s))
	if s.Spec.Rate > 0 {
		g.Figure = fmt.Sprintf("at %.0f rooms/s: %s", s.Spec.Rate, g.Figure)
	}
	return g
}

// findSet is the throughput set of a setting at a concurrency.
func findSet(sets []suite.RunSet, setting string, c int) *suite.RunSet {
	for i := range sets {
		if sets[i].Setting == setting && sets[i].Spec.Concurrency == c {
			return &sets[i]
		}
	}
	return nil
}

// GoalsTable renders Goals as a markdown table.
func GoalsTable(r *suite.Results) string {
	var b strings.Builder
	t := table{&b}
	t.head("goal", "this run", "met")
	for _, g := range Goals(r) {
		switch {
		case !g.Known:
			t.row(g.Name, "not measured", "—")
		case g.Met:
			t.row(g.Name, g.Figure, "**met**")
		default:
			t.row(g.Name, g.Figure, "**not met**")
		}
	}
	return b.String()
}
