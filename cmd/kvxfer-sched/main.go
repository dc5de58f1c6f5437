// Command kvxfer-sched emulates SGLang's prefill scheduler against a running
// kvxferd: it registers prefill memory over the control API and drives the
// deterministic workload that kvxfer-decode mirrors on the decode side. It
// prints a summary (and writes it as JSON with -json) and exits non-zero if a
// room was pinned or ended in an outcome its plan rules out.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/kvxfer/kvxfer/emul/sched"
	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/transport/control"
)

func main() {
	cfg := sched.Config{Workload: workload.Default(1), Shape: kvmem.DefaultShape()}
	cfg.Shape.Slots, cfg.Shape.Item, cfg.Shape.AuxSlots = 4096, 1024, 512
	fs := flag.CommandLine
	cfg.Workload.RegisterFlags(fs)
	fs.StringVar(&cfg.Control, "control", control.DefaultEndpoint(0), "kvxferd control endpoint")
	fs.IntVar(&cfg.Rooms, "rooms", 2000, "rooms to run")
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "rooms in flight at once")
	fs.Float64Var(&cfg.Rate, "rate", 0, "rooms opened per second (0: as fast as concurrency allows)")
	fs.DurationVar(&cfg.Grace, "grace", 60*time.Second, "a room non-terminal this long after open counts as pinned")
	fs.IntVar(&cfg.PageSize, "page-size", 1, "tokens per page")
	fs.DurationVar(&cfg.SpinMax, "spin-max", 0, "shm path: the most kvxferd's ring consumer keeps spinning while records keep coming (shm_attach spin_max_us; 0: kvxferd's default, 1 ms; 50us or less: it never spins on)")
	path := fs.String("path", envOr("KVXFER_SCHED_PATH", string(sched.PathShm)), "control path: shm (ring + status table) or reqrep (a round trip per call); default $KVXFER_SCHED_PATH or shm")
	jsonOut := fs.String("json", "", "write the summary as JSON to this file")
	roomsOut := fs.String("rooms-out", "", "write every room's outcome as JSON (room id -> \"Status/reason\") to this file")
	flag.Parse()
	cfg.Path = sched.Path(*path)
	cfg.Progress = func(done, total int) { fmt.Printf("  sched … %d/%d rooms terminal\n", done, total) }
	results, sum, err := sched.Run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvxfer-sched:", err)
		os.Exit(1)
	}
	print(sum)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(sum, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "kvxfer-sched:", err)
			os.Exit(1)
		}
	}
	if *roomsOut != "" {
		m := make(map[string]string, len(results))
		for _, r := range results {
			o := r.Status.String()
			if r.Pinned {
				o = "pinned"
			} else if r.Reason.String() != "" {
				o += "/" + r.Reason.String()
			}
			m[strconv.FormatUint(r.Room, 10)] = o
		}
		b, _ := json.Marshal(m)
		if err := os.WriteFile(*roomsOut, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "kvxfer-sched:", err)
			os.Exit(1)
		}
	}
	if sum.Pinned > 0 || len(sum.Unexpected) > 0 {
		fmt.Fprintf(os.Stderr, "kvxfer-sched: %d pinned rooms, %d unexpected outcomes\n", sum.Pinned, len(sum.Unexpected))
		os.Exit(1)
	}
}

func print(s sched.Summary) {
	fmt.Println("prefill scheduler (kvxfer-sched):")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  abort plan\toutcome\trooms")
	kinds := make([]string, 0, len(s.Outcomes))
	for k := range s.Outcomes {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		outs := make([]string, 0, len(s.Outcomes[k]))
		for o := range s.Outcomes[k] {
			outs = append(outs, o)
		}
		slices.Sort(outs)
		for _, o := range outs {
			fmt.Fprintf(w, "  %s\t%s\t%d\n", k, o, s.Outcomes[k][o])
		}
	}
	w.Flush()
	fmt.Printf("  rooms %d  pinned %d  %.0f rooms/s  time-to-terminal p50 %.2f ms  p99 %.2f ms\n",
		s.Rooms, s.Pinned, s.RoomsPerS, s.P50Millis, s.P99Millis)
	for _, u := range s.Unexpected {
		fmt.Println("  UNEXPECTED:", u)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
