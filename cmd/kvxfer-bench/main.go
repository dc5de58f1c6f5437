// Command kvxfer-bench runs the benchmark suite that compares kvxfer's actor
// engine with the dict-based ports of SGLang's NIXL prefill (bench/dict),
// side by side in one process over the same transfer layer, and writes the
// results: results.json, report.md (the tables) and SVG plots.
//
//	kvxfer-bench -suite quick -out bench/results    # under 3 minutes on 2 cores
//	kvxfer-bench -suite full -out /tmp/full         # up to 100k concurrent rooms
//
// A line per second shows the scenario in progress; the headline table is
// printed at the end. docs/benchmarks.md explains the scenarios and metrics.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"

	"github.com/kvxfer/kvxfer/bench"
	"github.com/kvxfer/kvxfer/bench/report"
	"github.com/kvxfer/kvxfer/bench/suite"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kvxfer-bench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("kvxfer-bench", flag.ContinueOnError)
	name := fs.String("suite", "quick", "suite to run: quick or full")
	out := fs.String("out", "bench/results", "folder for results.json, report.md and the plots")
	seed := fs.Uint64("seed", 1, "workload seed (the same plans go to every engine)")
	engines := fs.String("engines", "", "comma-separated engines (default: upstream,fixed,actors)")
	noRaces := fs.Bool("no-races", false, "skip the race scenarios")
	quiet := fs.Bool("q", false, "no progress lines")
	reps := fs.Int("reps", 0, "repetitions of every throughput, overhead, storm and pin run (default: the suite's)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	render := fs.String("render", "", "re-render the report and plots from this results.json instead of running")
	only := fs.String("only", "", "comma-separated parts to run (throughput,paced,overhead,storm,pins,openloop,memory,poll,races,large) or throughput settings (instant,copies,rdma: throughput at those only); default all")
	largeTLS := fs.String("large-tls", "", "UCX_TLS of the large-room scenario (default: the suite's, tcp,self,sm)")
	largeWrap := fs.String("large-target-wrap", "", "command prefix for the large-room scenario's decode stand-in, e.g. 'ip netns exec NS' (a second host)")
	gcFloor := fs.Int("gc-floor-mib", -1, "the process's GC heap floor in MiB, as kvxferd's -gc-floor-mib (0: GOGC alone; negative: the suite's, 64)")
	largeNPT := fs.Bool("large-no-progress-thread", false, "large-room scenario: both initiators without NIXL's progress thread")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *render != "" {
		return rerender(*render, *out)
	}
	cfg, err := pick(*name)
	if err != nil {
		return err
	}
	cfg.Seed = *seed
	if *reps > 0 {
		cfg = cfg.WithReps(*reps)
	}
	if *only != "" {
		if cfg, err = cfg.Only(strings.Split(*only, ",")...); err != nil {
			return err
		}
	}
	cfg.Races = cfg.Races && !*noRaces
	if *gcFloor >= 0 {
		cfg.GCFloorMiB = *gcFloor
	}
	if cfg.Large != nil {
		if *largeTLS != "" {
			cfg.Large.Transport = *largeTLS
		}
		cfg.Large.NoProgressThread = *largeNPT
		if *largeWrap != "" {
			cfg.Large.TargetWrap = strings.Fields(*largeWrap)
		}
	}
	if *engines != "" {
		cfg.Engines = nil
		for _, e := range strings.Split(*engines, ",") {
			cfg.Engines = append(cfg.Engines, bench.Kind(strings.TrimSpace(e)))
		}
	}
	progress := os.Stderr
	if *quiet {
		progress = nil
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	command := "kvxfer-bench " + strings.Join(args, " ")
	res, err := suite.Run(cfg, strings.TrimSpace(command), progress)
	if err != nil {
		return err
	}
	if err := report.Write(*out, res); err != nil {
		return err
	}
	fmt.Printf("\n%s\n%s\n", report.Headline(res), report.GoalsTable(res))
	fmt.Printf("suite %s done in %v; report: %s\n", cfg.Name, res.Duration.Round(1e9), filepath.Join(*out, "report.md"))
	return nil
}

// rerender writes the report and plots of saved results (after a change to
// the report's layout, without running the suite again).
func rerender(from, out string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	var res suite.Results
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	if err := report.Write(out, &res); err != nil {
		return err
	}
	fmt.Print(report.Headline(&res))
	return nil
}

func pick(name string) (suite.Config, error) {
	switch name {
	case "quick":
		return suite.Quick(), nil
	case "full":
		return suite.Full(), nil
	}
	return suite.Config{}, fmt.Errorf("unknown suite %q (quick or full)", name)
}
