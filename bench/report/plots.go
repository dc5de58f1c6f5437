package report

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/bench/suite"
	"github.com/kvxfer/kvxfer/bench/svgplot"
)

// Plots renders the report's charts, by file name.
func Plots(r *suite.Results) map[string]string {
	out := map[string]string{}
	if len(r.Throughput) > 0 {
		out["throughput.svg"] = throughput(r).SVG()
	}
	if r.Storm != nil {
		out["abort-to-terminal-cdf.svg"] = a2tCDF(r.Storm).SVG()
	}
	if len(r.Pins) > 0 {
		out["pins-vs-abort-rate.svg"] = pins(r).SVG()
	}
	if len(r.Memory) > 0 {
		out["memory.svg"] = memory(r).SVG()
	}
	if r.Large != nil && len(r.Large.Cells) > 0 {
		out["large-rooms.svg"] = largePlot(r.Large).SVG()
	}
	return out
}

func throughput(r *suite.Results) svgplot.Chart {
	c := svgplot.Chart{Title: "Throughput vs concurrency, per transfer setting", XLabel: "concurrent rooms (closed loop)",
		YLabel: "rooms/s (median of repetitions)", LogX: true}
	var settings []string
	for _, set := range r.Throughput {
		if !slices.Contains(settings, set.Setting) {
			settings = append(settings, set.Setting)
		}
	}
	for _, st := range settings {
		for _, e := range r.Engines {
			s := svgplot.Series{Name: e + " " + st}
			for _, set := range r.Throughput {
				if set.Setting != st {
					continue
				}
				if er := engine(&set, e); er != nil {
					s.X = append(s.X, float64(set.Spec.Concurrency))
					s.Y = append(s.Y, er.RoomsPerSec)
				}
			}
			c.Series = append(c.Series, s)
		}
	}
	return c
}

func a2tCDF(set *suite.RunSet) svgplot.Chart {
	c := svgplot.Chart{Title: "Abort-to-terminal CDF, " + set.Name, XLabel: "abort issued → terminal poll (µs)",
		YLabel: "share of aborted rooms", LogX: true, YMin: 0, YMax: 1.0001}
	for _, e := range set.Engines {
		s := svgplot.Series{Name: e.Engine, Step: true}
		for _, p := range e.A2TCDF {
			s.X = append(s.X, float64(p.X)/float64(time.Microsecond))
			s.Y = append(s.Y, p.F)
		}
		if e.A2T.N > 0 && e.A2T.Never > 0 { // the curve stops short of 1
			s.Name += fmt.Sprintf(" (%.0f%% never)", 100*float64(e.A2T.Never)/float64(e.A2T.N))
		}
		c.Series = append(c.Series, s)
	}
	return c
}

func pins(r *suite.Results) svgplot.Chart {
	c := svgplot.Chart{Title: "Pinned rooms vs abort rate", XLabel: "share of rooms aborted (%)",
		YLabel: "pinned rooms (all repetitions)"}
	for _, e := range r.Engines {
		s := svgplot.Series{Name: e}
		for _, set := range r.Pins {
			if er := engine(&set, e); er != nil {
				s.X = append(s.X, 100*set.Spec.AbortShare)
				s.Y = append(s.Y, float64(er.Pinned))
			}
		}
		c.Series = append(c.Series, s)
	}
	return c
}

func memory(r *suite.Results) svgplot.Chart {
	c := svgplot.Chart{Title: "Heap per live room vs live rooms", XLabel: "live rooms",
		YLabel: "heap bytes per room", LogX: true}
	for _, e := range r.Engines {
		s := svgplot.Series{Name: e}
		for _, mp := range r.Memory {
			for _, u := range mp.Engines {
				if u.Engine == e {
					s.X = append(s.X, float64(mp.Rooms))
					s.Y = append(s.Y, u.HeapPerRoom)
				}
			}
		}
		c.Series = append(c.Series, s)
	}
	return c
}

func engine(set *suite.RunSet, name string) *suite.EngineRuns {
	for i := range set.Engines {
		if set.Engines[i].Engine == name {
			return &set.Engines[i]
		}
	}
	return nil
}
