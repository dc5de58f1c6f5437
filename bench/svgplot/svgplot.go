// Package svgplot draws the report's line charts as standalone SVG, by hand
// (the module takes no plotting dependency): axes with ticks, optional
// logarithmic axes, one polyline per series and a legend. Charts are small
// and readable in a Markdown viewer, which is all the report needs.
package svgplot

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
)

// Series is one named line.
type Series struct {
	Name string
	X, Y []float64
	// Step draws a staircase (an empirical CDF) instead of straight segments.
	Step bool
}

// Chart is one plot.
type Chart struct {
	Title, XLabel, YLabel string
	LogX, LogY            bool
	// YMin/YMax fix the y range when YMax > YMin; otherwise it fits the data
	// (from 0 on a linear axis).
	YMin, YMax float64
	Series     []Series
	// XFormat and YFormat render tick values (default: compact numbers).
	XFormat, YFormat func(float64) string
}

const (
	width, height            = 640, 400
	left, right, top, bottom = 70, 170, 40, 50
)

var palette = []string{"#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b"}

// dashes tell overlapping series apart (equal figures are common: two
// engines with no pins at all draw the same line).
var dashes = []string{"", "9 5", "2 4", "12 3 2 3"}

type axis struct {
	lo, hi float64
	log    bool
	px0    float64
	px1    float64
}

func (a axis) pos(v float64) float64 {
	lo, hi := a.lo, a.hi
	if a.log {
		v, lo, hi = math.Log10(math.Max(v, a.lo)), math.Log10(lo), math.Log10(hi)
	}
	if hi == lo {
		return (a.px0 + a.px1) / 2
	}
	return a.px0 + (v-lo)/(hi-lo)*(a.px1-a.px0)
}

func (a axis) ticks() []float64 {
	if a.log {
		var out []float64
		for e := math.Floor(math.Log10(a.lo)); e <= math.Ceil(math.Log10(a.hi)); e++ {
			if v := math.Pow(10, e); v >= a.lo*0.999 && v <= a.hi*1.001 {
				out = append(out, v)
			}
		}
		if len(out) < 2 {
			out = []float64{a.lo, a.hi}
		}
		return out
	}
	span := a.hi - a.lo
	if span <= 0 {
		return []float64{a.lo}
	}
	step := math.Pow(10, math.Floor(math.Log10(span/5)))
	for span/step > 8 {
		step *= 2
	}
	var out []float64
	for v := math.Ceil(a.lo/step) * step; v <= a.hi+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
}

func bounds(ss []Series, pick func(Series) []float64, log bool) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for _, v := range pick(s) {
			if math.IsInf(v, 0) || math.IsNaN(v) || (log && v <= 0) {
				continue
			}
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		return 1, 10
	}
	if log {
		lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
		if lo == hi {
			hi = lo * 10
		}
		return lo, hi
	}
	if hi == lo {
		hi = lo + 1
	}
	return lo, hi
}

// Compact renders 1234567 as 1.2M, 0.5 as 0.5.
func Compact(v float64) string {
	av := math.Abs(v)
	switch {
	case av >= 1e9:
		return strconv.FormatFloat(v/1e9, 'g', 3, 64) + "G"
	case av >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case av >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// SVG renders the chart.
func (c Chart) SVG() string {
	xf, yf := c.XFormat, c.YFormat
	if xf == nil {
		xf = Compact
	}
	if yf == nil {
		yf = Compact
	}
	xlo, xhi := bounds(c.Series, func(s Series) []float64 { return s.X }, c.LogX)
	ylo, yhi := bounds(c.Series, func(s Series) []float64 { return s.Y }, c.LogY)
	if !c.LogY {
		ylo = math.Min(0, ylo)
		yhi *= 1.05
	}
	if c.YMax > c.YMin {
		ylo, yhi = c.YMin, c.YMax
	}
	xa := axis{lo: xlo, hi: xhi, log: c.LogX, px0: left, px1: width - right}
	ya := axis{lo: ylo, hi: yhi, log: c.LogY, px0: height - bottom, px1: top}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, esc(c.Title))
	for _, v := range xa.ticks() {
		x := xa.pos(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, top, x, height-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, height-bottom+16, esc(xf(v)))
	}
	for _, v := range ya.ticks() {
		y := ya.pos(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, width-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, esc(yf(v)))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", left, top, width-left-right, height-top-bottom)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", (left+width-right)/2, height-12, esc(c.XLabel))
	fmt.Fprintf(&b, `<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>`+"\n", (top+height-bottom)/2, (top+height-bottom)/2, esc(c.YLabel))
	for i, s := range c.Series {
		col := palette[i%len(palette)]
		dash := ""
		if d := dashes[i%len(dashes)]; d != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, d)
		}
		var pts []string
		py := 0.0
		for j := range min(len(s.X), len(s.Y)) {
			x, y := s.X[j], s.Y[j]
			if math.IsInf(x, 0) || math.IsInf(y, 0) || math.IsNaN(x) || math.IsNaN(y) || (c.LogX && x <= 0) || (c.LogY && y <= 0) {
				continue
			}
			cx, cy := xa.pos(x), ya.pos(math.Min(math.Max(y, ylo), yhi))
			if s.Step && len(pts) > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", cx, py))
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", cx, cy))
			py = cy
		}
		if len(pts) == 1 {
			fmt.Fprintf(&b, `<circle cx="%s" r="3" fill="%s"/>`+"\n", strings.Replace(pts[0], ",", `" cy="`, 1), col)
		} else if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", col, dash, strings.Join(pts, " "))
		}
		if !s.Step {
			for _, p := range pts {
				fmt.Fprintf(&b, `<circle cx="%s" r="2.5" fill="%s"/>`+"\n", strings.Replace(p, ",", `" cy="`, 1), col)
			}
		}
		ly := top + 10 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"%s/>`+"\n", width-right+10, ly, width-right+30, ly, col, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-right+36, ly+4, esc(s.Name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func esc(s string) string { return html.EscapeString(s) }
