// Package svgplot draws the report's line charts as standalone SVG with
// gonum.org/v1/plot, a maintained plotting library rather than hand-drawn
// SVG: one line per
// series (a staircase for an empirical CDF), points, optional logarithmic
// axes, a legend. The Chart/Series API is what bench/report builds.
package svgplot

import (
	"bytes"
	"image/color"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
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
	// XFormat and YFormat render tick values (default: Compact).
	XFormat, YFormat func(float64) string
}

var palette = []color.RGBA{
	{0xd6, 0x27, 0x28, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x1f, 0x77, 0xb4, 0xff},
	{0x2c, 0xa0, 0x2c, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff},
}

// dashes tell overlapping series apart (equal figures are common: two
// engines with no pins at all draw the same line).
var dashes = [][]vg.Length{nil, {vg.Points(6), vg.Points(3)}, {vg.Points(1.5), vg.Points(2.5)}, {vg.Points(8), vg.Points(2), vg.Points(1.5), vg.Points(2)}}

// Compact renders a tick value: 1.5k, 2M, 0.25.
func Compact(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e9:
		return strconv.FormatFloat(v/1e9, 'g', 3, 64) + "G"
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case a >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// ticker labels gonum's default or logarithmic ticks with a formatter.
type ticker struct {
	inner plot.Ticker
	f     func(float64) string
}

func (t ticker) Ticks(lo, hi float64) []plot.Tick {
	ts := t.inner.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = t.f(ts[i].Value)
		}
	}
	return ts
}

// usable keeps the finite points of s (and positive ones on a log axis).
func usable(s Series, logX, logY bool) plotter.XYs {
	var out plotter.XYs
	for i := range min(len(s.X), len(s.Y)) {
		x, y := s.X[i], s.Y[i]
		if math.IsNaN(x) || math.IsInf(x, 0) || math.IsNaN(y) || math.IsInf(y, 0) || logX && x <= 0 || logY && y <= 0 {
			continue
		}
		out = append(out, plotter.XY{X: x, Y: y})
	}
	return out
}

// SVG renders the chart (640×400 points).
func (c Chart) SVG() string {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = c.Title, c.XLabel, c.YLabel
	xf, yf := c.XFormat, c.YFormat
	if xf == nil {
		xf = Compact
	}
	if yf == nil {
		yf = Compact
	}
	p.X.Tick.Marker = ticker{plot.DefaultTicks{}, xf}
	p.Y.Tick.Marker = ticker{plot.DefaultTicks{}, yf}
	if c.LogX {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, ticker{plot.LogTicks{Prec: -1}, xf}
	}
	if c.LogY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, ticker{plot.LogTicks{Prec: -1}, yf}
	}
	p.Legend.Top = true
	any := false
	for i, s := range c.Series {
		pts := usable(s, c.LogX, c.LogY)
		if len(pts) == 0 {
			continue
		}
		col := palette[i%len(palette)]
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			continue
		}
		l.Color, l.Dashes = col, dashes[(i/len(palette)+i)%len(dashes)]
		if s.Step {
			l.StepStyle = plotter.PostStep
		}
		sc.Color, sc.Shape, sc.Radius = col, draw.CircleGlyph{}, vg.Points(2)
		p.Add(l, sc)
		p.Legend.Add(s.Name, l, sc)
		any = true
	}
	if c.YMax > c.YMin {
		p.Y.Min, p.Y.Max = c.YMin, c.YMax
	} else if !c.LogY && any && p.Y.Min > 0 {
		p.Y.Min = 0
	}
	if c.LogX && !any {
		p.X.Min, p.X.Max = 1, 10
	}
	if c.LogY && !any {
		p.Y.Min, p.Y.Max = 1, 10
	}
	if c.LogY && any && p.Y.Min <= 0 {
		p.Y.Min = 1
	}
	canvas := vgsvg.New(640, 400)
	p.Draw(draw.New(canvas))
	var b bytes.Buffer
	if _, err := canvas.WriteTo(&b); err != nil {
		return ""
	}
	return b.String()
}
