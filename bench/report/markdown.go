// Package report renders a suite's results: the Markdown report with its
// tables, the SVG plots and the JSON, written side by side into one folder.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/bench/stats"
	"github.com/kvxfer/kvxfer/bench/suite"
)

// Write writes report.md, results.json and the plots into dir.
func Write(dir string, r *suite.Results) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	files := map[string]string{"results.json": string(js) + "\n", "report.md": Markdown(r)}
	for name, svg := range Plots(r) {
		files[name] = svg
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Dur renders a duration for a table: "∞" for a sample that never happened.
func Dur(d time.Duration) string {
	switch {
	case d == stats.Inf:
		return "∞"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

type table struct {
	b *strings.Builder
}

func (t table) row(cells ...any) {
	t.b.WriteString("|")
	for _, c := range cells {
		fmt.Fprintf(t.b, " %v |", c)
	}
	t.b.WriteString("\n")
}

func (t table) head(cells ...string) {
	t.row(anys(cells)...)
	t.b.WriteString("|" + strings.Repeat("---|", len(cells)) + "\n")
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// Headline is the short table the tool prints and the report opens with.
func Headline(r *suite.Results) string {
	var b strings.Builder
	t := table{&b}
	t.head("figure", "value")
	if s := r.Storm; s != nil {
		for _, e := range s.Engines {
			t.row(fmt.Sprintf("pinned rooms under the %s (%d reps × %d rooms), %s", s.Name, s.Reps, s.Spec.Rooms, e.Engine), pinText(e))
		}
	}
	for _, set := range r.Throughput {
		if c := set.Spec.Concurrency; c == 1000 || c == 10000 {
			for _, base := range []string{"upstream", "fixed"} {
				if v, ok := set.RatioRate["actors/"+base]; ok {
					rg := set.RatioRange["actors/"+base]
					val := fmt.Sprintf("%.2f×", v)
					if set.Reps > 1 {
						val += fmt.Sprintf(" (%.2f–%.2f)", rg[0], rg[1])
					}
					val += fmt.Sprintf("; CPU s/1k rooms %s; load %s", cpuPair(set, base), rowLoad(set))
					t.row(fmt.Sprintf("rooms/s actors/%s, %d concurrent rooms, %s (median of %d)", base, c, settingText(set), set.Reps), val)
				}
			}
		}
	}
	if s := r.Storm; s != nil {
		for _, e := range s.Engines {
			t.row("abort-to-terminal p99 under the storm, "+e.Engine, Dur(e.A2T.P99))
		}
	}
	if n := len(r.Memory); n > 0 {
		mp := r.Memory[n-1]
		for _, u := range mp.Engines {
			t.row(fmt.Sprintf("heap bytes per live room (%d rooms), %s", mp.Rooms, u.Engine), fmt.Sprintf("%.0f B", u.HeapPerRoom))
		}
	}
	return b.String()
}

// settingText names a run set's transfer setting with its conditions.
func settingText(s suite.RunSet) string {
	switch s.Setting {
	case "instant":
		return "instant (bookkeeping only)"
	case "copies":
		return "real loopback copies, no injected latency"
	case "":
		return latency(s)
	}
	return s.Setting + ": " + latency(s)
}

// cpuPair is "actors X vs base Y" CPU seconds per 1k rooms.
func cpuPair(s suite.RunSet, base string) string {
	var a, o float64
	for _, e := range s.Engines {
		switch e.Engine {
		case "actors":
			a = e.CPUPer1k
		case base:
			o = e.CPUPer1k
		}
	}
	return fmt.Sprintf("actors %.3f vs %s %.3f", a, base, o)
}

// rowLoad is the 1-minute load average after the set's last run.
func rowLoad(s suite.RunSet) string {
	for i := len(s.Engines) - 1; i >= 0; i-- {
		if f := strings.Fields(s.Engines[i].LoadAvg); len(f) > 0 {
			return f[0]
		}
	}
	return "?"
}

func pinText(e suite.EngineRuns) string {
	hard, dl := 0, 0
	for _, r := range e.Runs {
		hard += r.HardPinned
		dl += r.DeadlineEnded
	}
	return fmt.Sprintf("%d (%d never terminal, %d ended only by a deadline after an abort)", e.Pinned, hard, dl)
}

// Markdown renders the whole report.
func Markdown(r *suite.Results) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# kvxfer benchmark report (%s suite)\n\n", r.Suite)
	w("Produced by `%s` on %s: %s, GOMAXPROCS=%d, %d CPUs, %s, %s wall. ", r.Command, r.Started.Format("2006-01-02 15:04 UTC"),
		r.GoVersion, r.GOMAXPROCS, r.NumCPU, gcPolicy(r.GCFloorMiB), r.Duration.Round(time.Second))
	w("Load average (1, 5, 15 min) at the start %s, at the end %s: the machine is shared. ", r.LoadAvg[0], r.LoadAvg[1])
	w("Engines: %s. `docs/benchmarks.md` explains every scenario and metric.\n\n", strings.Join(r.Engines, ", "))
	w("## Headline\n\n%s\n", Headline(r))
	w("Why the figures move the way they do (batched poll cost, transfer workers that wait for each chunk, what counts as pinned) is in `docs/benchmarks.md`, *Reading the results*.\n\n")
	w("## Goals\n\nThe targets the actor engine is held to (`docs/benchmarks.md`, *Goals*), checked on this run; the end-to-end goal is checked by `kvxfer-demo`, which prints its own line. A goal whose scenario this run skipped is not measured.\n\n%s\n", GoalsTable(r))

	if len(r.Throughput) > 0 {
		w("## Throughput at three transfer settings\n\nClosed loop, no aborts, every point at every setting: **instant** (writes complete at once: bookkeeping only), **copies** (real bytes over the loopback NIXL fabric, no injected latency), **rdma** (loopback copies plus a modelled wire: %s, no timers: a request completes when polled at or after its due time). The actor engine posts through the transfer pool (`actors/xfer`); the dict engines' workers post straight to the NIXL agent and busy-wait on their handles as SGLang's `transfer_worker` does (`dict.Direct`). Medians over the repetitions; engines interleaved within each repetition. CPU: process user+system (`getrusage`) over the run per 1k rooms. Heap: live heap per live room as the run's first GC cycle past its midpoint found it, less the heap once every room ended (driver state included; no GC forced during a run; — where no cycle ran then or fewer than 100 rooms were live). Before the first measured run every engine runs %d rooms at c = %d at every setting, untimed (warm-up). Load: 1-minute load average after the engine's last run. Time-to-terminal: open → first terminal poll, pooled over repetitions.\n\n", rdmaText(r.Throughput), r.WarmUp.Rooms, r.WarmUp.Concurrency)
		runTable(&b, r.Throughput, false)
		w("![throughput](throughput.svg)\n\n")
	}
	if len(r.Paced) > 0 {
		w("## Throughput with a paced scheduler\n\nThe same runs with a scheduler that spends %v per iteration (a forward pass) instead of spinning on its polls.\n\n", r.Paced[0].Pace)
		runTable(&b, r.Paced, false)
	}
	if len(r.Overhead) > 0 {
		w("## Pure overhead at larger scale (instant transfer layer)\n\nThe same loop with writes completing at once: the cost of each design around its transfers.\n\n")
		runTable(&b, r.Overhead, false)
	}
	if r.Storm != nil {
		w("## Abort storm\n\n%s\n\n", stormText(r.Storm))
		runTable(&b, []suite.RunSet{*r.Storm}, true)
		abortTable(&b, r.Storm)
		phaseTable(&b, r.Storm)
		if len(r.StormBySetting) > 0 {
			w("### The storm at each transfer setting\n\nThe same mix and plans at the throughput settings (%d repetition(s) each): pins and abort-to-terminal next to rooms/s and CPU.\n\n", r.StormBySetting[0].Reps)
			settingStormTable(&b, r.StormBySetting)
		}
		w("![abort-to-terminal CDF](abort-to-terminal-cdf.svg)\n\n")
	}
	if len(r.Pins) > 0 {
		w("## Pins vs abort rate\n\n%d concurrent rooms, %d rooms per run, %s, aborts at every phase from both sources.\n\n", r.Pins[0].Spec.Concurrency, r.Pins[0].Spec.Rooms, latency(r.Pins[0]))
		pinTable(&b, r)
		w("![pins vs abort rate](pins-vs-abort-rate.svg)\n\n")
	}
	if r.OpenLoop != nil {
		w("## Open loop\n\n%s\n\n", stormText(r.OpenLoop))
		runTable(&b, []suite.RunSet{*r.OpenLoop}, true)
	}
	if len(r.Memory) > 0 {
		w("## Memory per live room\n\nRooms opened with one transfer info (four pages) each, waiting for the scheduler's init; heap after a GC and resident set growth, divided by the rooms; the engine's fixed cost is left out.\n\n")
		t := table{&b}
		t.head("live rooms", "engine", "heap B/room", "heap objects/room", "RSS B/room")
		for _, mp := range r.Memory {
			for _, u := range mp.Engines {
				t.row(mp.Rooms, u.Engine, fmt.Sprintf("%.0f", u.HeapPerRoom), fmt.Sprintf("%.1f", u.Objects), fmt.Sprintf("%.0f", u.RSSPerRoom))
			}
		}
		w("\n![memory](memory.svg)\n\n")
	}
	if len(r.Poll) > 0 {
		w("## Batched poll latency\n\nOne `Poll` of %d live rooms (WaitingForInput), as the scheduler polls its queue every iteration.\n\n", r.Poll[0].Rooms)
		t := table{&b}
		t.head("engine", "rounds", "p50", "p99", "p50 per room")
		for _, p := range r.Poll {
			t.row(p.Engine, p.Rounds, Dur(p.P50), Dur(p.P99), fmt.Sprintf("%.0f ns", float64(p.PerRoom)))
		}
		w("\n")
	}
	if r.Large != nil {
		largeSection(&b, r.Large)
	}
	if len(r.Races) > 0 {
		w("## The seeds' race scenarios (`bench.Races`)\n\nEach scenario forces one interleaving deterministically (held writes, hooks); `check` is the scenario's own statement of what that engine does.\n\n")
		raceTable(&b, r.Races)
	}
	return b.String()
}

func rdmaText(sets []suite.RunSet) string {
	for _, s := range sets {
		if s.Setting == "rdma" {
			return latency(s)
		}
	}
	return "not run"
}

func latency(s suite.RunSet) string {
	l := s.Spec.Latency
	if s.Transfer != "loopback" {
		return "instant transfers"
	}
	out := "loopback NIXL without added latency"
	if l[1] > 0 {
		out = fmt.Sprintf("loopback NIXL with %v–%v per request", l[0], l[1])
	}
	if s.Bandwidth > 0 {
		out += fmt.Sprintf(" plus bytes ÷ %.0f GB/s", s.Bandwidth/1e9)
	}
	if s.Spec.SlowShare > 0 {
		out += fmt.Sprintf(", %.1f%% of requests %v", 100*s.Spec.SlowShare, s.Spec.Slow)
	}
	return out
}

func stormText(s *suite.RunSet) string {
	sp := s.Spec
	loop := fmt.Sprintf("%d concurrent rooms", sp.Concurrency)
	if sp.Rate > 0 {
		loop = fmt.Sprintf("arrivals at %.0f rooms/s", sp.Rate)
	}
	return fmt.Sprintf("%d rooms, %s, %.0f%% aborted (phases %v, sources %v), %.0f%% with two decode agents, %s, %d repetitions.",
		sp.Rooms, loop, 100*sp.AbortShare, sp.Phases, sp.Sources, 100*sp.TwoAgents, latency(*s), s.Reps)
}

func runTable(b *strings.Builder, sets []suite.RunSet, aborts bool) {
	t := table{b}
	t.head("scenario", "engine", "rooms/s", "actors ÷ engine: median of per-rep ratios [range] (ratio of medians)", "CPU s per 1k rooms", "heap B/live room", "load 1m", "TTT p50", "TTT p99", "TTT p999", "pinned (all reps)", "leaked (max)")
	for _, set := range sets {
		var act float64
		for _, e := range set.Engines {
			if e.Engine == "actors" {
				act = e.RoomsPerSec
			}
		}
		for _, e := range set.Engines {
			ratio := "—"
			if e.Engine != "actors" {
				if v, ok := set.RatioRate["actors/"+e.Engine]; ok {
					rg := set.RatioRange["actors/"+e.Engine]
					ratio = fmt.Sprintf("%.2f× [%.2f–%.2f] (%.2f×)", v, rg[0], rg[1], stats.Ratio(act, e.RoomsPerSec))
				}
			}
			load := "?"
			if f := strings.Fields(e.LoadAvg); len(f) > 0 {
				load = f[0]
			}
			t.row(set.Name, e.Engine, fmt.Sprintf("%.0f", e.RoomsPerSec), ratio, fmt.Sprintf("%.3f", e.CPUPer1k),
				heapCell(e.HeapPerRoom), load, Dur(e.TTT.P50), Dur(e.TTT.P99), Dur(e.TTT.P999), e.Pinned, e.Leaked)
		}
	}
	b.WriteString("\n")
}

// settingStormTable is engine × setting for the storm: rooms/s, CPU, heap,
// pins, A2T p99, load.
func settingStormTable(b *strings.Builder, sets []suite.RunSet) {
	t := table{b}
	t.head("setting", "engine", "rooms/s", "CPU s per 1k rooms", "heap B/live room", "pinned", "leaked", "A2T p50", "A2T p99", "load 1m")
	for _, set := range sets {
		for _, e := range set.Engines {
			load := "?"
			if f := strings.Fields(e.LoadAvg); len(f) > 0 {
				load = f[0]
			}
			t.row(set.Setting, e.Engine, fmt.Sprintf("%.0f", e.RoomsPerSec), fmt.Sprintf("%.3f", e.CPUPer1k), heapCell(e.HeapPerRoom),
				e.Pinned, e.Leaked, Dur(e.A2T.P50), Dur(e.A2T.P99), load)
		}
	}
	b.WriteString("\n")
}

func abortTable(b *strings.Builder, set *suite.RunSet) {
	t := table{b}
	t.head("engine", "aborted rooms", "never terminal", "A2T p50", "A2T p99", "A2T p999", "A2T in iterations p50 / p99", "poll p50 / p99", "pinned (hard + deadline)", "pinned at", "late posts", "failure notices", "ABORT_ACKs", "leaked entries (by map)")
	for _, e := range set.Engines {
		var ab, never, hard, dl, late, fn, acks int
		at := map[string]int{}
		for _, r := range e.Runs {
			ab += r.Aborted + r.AbortsNever
			never += r.AbortsNever
			hard += r.HardPinned
			dl += r.DeadlineEnded
			late += int(r.LatePosts)
			fn += int(r.FailureNotice)
			acks += int(r.Acks)
			for k, v := range r.PinnedAt {
				at[k] += v
			}
		}
		leaks := "0"
		if n := len(e.Runs); n > 0 && e.Leaked > 0 {
			l := e.Runs[n-1].Leaks
			leaks = fmt.Sprintf("%d (status %d, infos %d, prefix %d, failure records %d, exceptions %d, senders %d, drains %d)",
				e.Leaked, l.RequestStatus, l.TransferInfos, l.PrefixLen, l.FailureRecords, l.Exceptions, l.Senders, l.Drains)
		}
		t.row(e.Engine, ab, never, Dur(e.A2T.P50), Dur(e.A2T.P99), Dur(e.A2T.P999),
			fmt.Sprintf("%d / %d", e.A2TIters.P50, e.A2TIters.P99), Dur(e.Poll.P50)+" / "+Dur(e.Poll.P99), fmt.Sprintf("%d (%d + %d)", hard+dl, hard, dl),
			mapText(at), late, fn, acks, leaks)
	}
	b.WriteString("\nTotals over every repetition; A2T percentiles count rooms that never reached a terminal answer as ∞; in iterations, 1 is the scheduler's next poll (rooms that never ended are left out). Poll: the batched poll of every live room, call to return, per iteration. Late posts: writes of chunks the scheduler sent after it issued the room's abort. Leaked: entries left after every clearable room was cleared and a further grace period (the last repetition's split).\n\n")
}

func mapText(m map[string]int) string {
	if len(m) == 0 {
		return "—"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func pinTable(b *strings.Builder, r *suite.Results) {
	t := table{b}
	head := []string{"abort share"}
	for _, e := range r.Engines {
		head = append(head, e+" pinned", e+" leaked")
	}
	t.head(head...)
	for _, set := range r.Pins {
		cells := []any{fmt.Sprintf("%.0f%%", 100*set.Spec.AbortShare)}
		for _, e := range set.Engines {
			cells = append(cells, e.Pinned, e.Leaked)
		}
		t.row(cells...)
	}
	b.WriteString("\n")
}

func raceTable(b *strings.Builder, rows []suite.RaceRow) {
	t := table{b}
	t.head("scenario", "spec", "engine", "final answer", "pinned", "leaked", "late writes", "posts after abort", "notices", "check")
	for _, r := range rows {
		pinned := "not pinned"
		if r.Pinned {
			pinned = "**pinned**"
		}
		check := "ok"
		if !r.CheckOK {
			check = "FAILED: " + strings.ReplaceAll(r.Error, "\n", " ")
		}
		t.row(r.Scenario, r.Spec, r.Engine, r.Final, pinned, r.Leaked, r.LateWrites, r.PostsAfterAbort, r.Notices, check)
	}
	b.WriteString("\n")
}

// phaseTable splits abort-to-terminal by abort phase and source.
func phaseTable(b *strings.Builder, set *suite.RunSet) {
	keys := map[string]bool{}
	for _, e := range set.Engines {
		for k := range e.A2TByPhase {
			keys[k] = true
		}
	}
	if len(keys) == 0 {
		return
	}
	order := make([]string, 0, len(keys))
	for k := range keys {
		order = append(order, k)
	}
	slices.Sort(order)
	t := table{b}
	head := []string{"abort phase / source"}
	for _, e := range set.Engines {
		head = append(head, e.Engine+" A2T p50 / p99 (never)")
	}
	t.head(head...)
	for _, k := range order {
		cells := []any{k}
		for _, e := range set.Engines {
			s, ok := e.A2TByPhase[k]
			if !ok {
				cells = append(cells, "—")
				continue
			}
			cells = append(cells, fmt.Sprintf("%s / %s (%d of %d)", Dur(s.P50), Dur(s.P99), s.Never, s.N))
		}
		t.row(cells...)
	}
	b.WriteString("\nAborts after Success are not in these figures: the room was already terminal.\n\n")
}

// heapCell is a run's heap per live room; a run whose probe could not say
// (too few rooms live mid-run, as in an open loop) shows a dash.
func heapCell(b float64) string {
	if b <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f", b)
}

// gcPolicy says how the run's process collected: every engine shares it.
func gcPolicy(floorMiB int) string {
	if floorMiB <= 0 {
		return "GC: GOGC alone"
	}
	return fmt.Sprintf("GC heap floor %d MiB (kvxferd's -gc-floor-mib)", floorMiB)
}
