package report

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvxfer/kvxfer/bench/large"
	"github.com/kvxfer/kvxfer/bench/svgplot"
)

// largeSection renders the large-room scenario: per geometry and in-flight
// count, every engine's GB/s and CPU per GB, kvxfer's share of memcpy and of
// NIXL's Python API, and descriptors per room.
func largeSection(b *strings.Builder, r *large.Results) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Large rooms over real NIXL\n\n")
	if r.Skipped != "" {
		w("Skipped: %s.\n\n", r.Skipped)
		return
	}
	npt := "with NIXL's progress thread (kvxfer's 10 ms delay; Python's 0)"
	if r.Config.NoProgressThread {
		npt = "both without NIXL's progress thread"
	}
	w("Rooms of realistic size written into a decode stand-in (a NIXL Python agent with its KV slab registered one region per buffer) over UCX (`UCX_TLS=%s`%s), initiators %s, %s rooms in flight (posted at once, then waited for), a round moving at least %d MiB, %d measured rounds per engine after %d dropped, the engines' order rotating every round. ",
		r.Config.Transport, wrapText(r.Config.TargetWrap), npt, joinInts(r.Config.InFlight), r.Config.RoundBytes>>20, r.Config.Pairs, r.Config.Warm)
	w("**kvxfer**: the Go NIXL binding posting the room's merged list (`sglang.MergedKV`: runs of pages contiguous on both sides as one descriptor); **kvxfer-prepped**: the same binding over SGLang's per-page prepared indices; **nixl-py**: NIXL's own Python API posting the same merged list (`initialize_xfer`); **nixl-py-sglang**: as SGLang's prefill posts (`make_prepped_xfer`, one index per buffer and page); **memcpy**: a Go copy of the same pairs between two slabs of one process; **cma**: the same pairs written into the decode stand-in with `process_vm_writev`, one call per descriptor, the kernel copy UCX's shared-memory transport makes for each put, without NIXL or UCX (*batched*: up to 1,024 descriptors a call). GB/s = 10⁹ bytes/s, median of rounds; CPU: the initiating process (all threads) per GB; %% columns: median of per-round ratios of kvxfer's rate; *best* = the better of memcpy and nixl-py in that round. Load at the start %s, at the end %s.\n\n", r.LoadAvg[0], r.LoadAvg[1])
	if r.CmaSkipped != "" {
		w("The cma engines did not run: %s.\n\n", r.CmaSkipped)
	}
	t := table{b}
	t.head("room", "in flight", "kvxfer GB/s", "kvxfer-prepped", "nixl-py", "nixl-py-sglang", "memcpy", "cma (batched)", "% of memcpy", "% of nixl-py", "% of cma", "% of best", "descs/room merged (SGLang)", "CPU s/GB kvxfer / nixl-py / memcpy / cma", "verified", "load")
	for _, c := range r.Cells {
		e := func(name string) large.EngineResult {
			for _, x := range c.Engines {
				if x.Engine == name {
					return x
				}
			}
			return large.EngineResult{}
		}
		cma, cmaPct, cmaCPU := "—", "—", "—"
		if x, ok := c.Ratios["kvxfer/cma"]; ok {
			cma = fmt.Sprintf("%.2f (%.2f)", e(large.Cma).GBps, e(large.CmaBatched).GBps)
			cmaPct, cmaCPU = pct(x), fmt.Sprintf("%.3f", e(large.Cma).CPUPerGB)
		}
		t.row(fmt.Sprintf("%s (%.1f MiB)", c.Geometry.Name, float64(c.RoomBytes)/(1<<20)), c.InFlight,
			fmt.Sprintf("**%.2f**", e(large.Kvxfer).GBps), fmt.Sprintf("%.2f", e(large.KvxferPrepped).GBps),
			fmt.Sprintf("%.2f", e(large.Py).GBps), fmt.Sprintf("%.2f", e(large.PySGLang).GBps), fmt.Sprintf("%.2f", e(large.Memcpy).GBps), cma,
			pct(c.Ratios["kvxfer/memcpy"]), pct(c.Ratios["kvxfer/nixl-py"]), cmaPct, "**"+pct(c.Ratios["kvxfer/best"])+"**",
			fmt.Sprintf("%.0f (%.0f)", c.DescsMerged, c.DescsSGLang),
			fmt.Sprintf("%.3f / %.3f / %.3f / %s", e(large.Kvxfer).CPUPerGB, e(large.Py).CPUPerGB, e(large.Memcpy).CPUPerGB, cmaCPU),
			c.Verified, c.LoadAvg[0])
	}
	w("\n![GB/s per room size](large-rooms.svg)\n\n")
}

func wrapText(w []string) string {
	if len(w) == 0 {
		return ", one host"
	}
	return ", decode side under `" + strings.Join(w, " ") + "`"
}

func pct(x float64) string { return fmt.Sprintf("%.0f %%", 100*x) }

// largePlot is GB/s against rooms in flight, one line per engine and room
// size (kvxfer, nixl-py on the same list, memcpy, cma where it ran; the
// prepared and batched variants are in the table).
func largePlot(r *large.Results) svgplot.Chart {
	c := svgplot.Chart{Title: "Large rooms over real NIXL: GB/s vs rooms in flight", XLabel: "rooms in flight",
		YLabel: "GB/s (median of rounds)", LogX: true}
	var sizes []string
	for _, cell := range r.Cells {
		if !slices.Contains(sizes, cell.Geometry.Name) {
			sizes = append(sizes, cell.Geometry.Name)
		}
	}
	for _, name := range []string{large.Kvxfer, large.Py, large.Memcpy, large.Cma} {
		for _, g := range sizes {
			s := svgplot.Series{Name: name + " " + g}
			for _, cell := range r.Cells {
				if cell.Geometry.Name != g {
					continue
				}
				for _, e := range cell.Engines {
					if e.Engine == name {
						s.X = append(s.X, float64(cell.InFlight))
						s.Y = append(s.Y, e.GBps)
					}
				}
			}
			if len(s.X) > 0 {
				c.Series = append(c.Series, s)
			}
		}
	}
	return c
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}
