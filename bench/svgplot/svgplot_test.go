package svgplot

import (
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"
)

// wellFormed parses the document and counts its elements by name.
func wellFormed(t *testing.T, doc string) map[string]int {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(doc))
	count := map[string]int{}
	depth := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, doc)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if depth == 0 && (e.Name.Local != "svg" || e.Name.Space != "http://www.w3.org/2000/svg") {
				t.Fatalf("root element %v", e.Name)
			}
			depth++
			count[e.Name.Local]++
		case xml.EndElement:
			depth--
		}
	}
	if depth != 0 {
		t.Fatalf("unbalanced elements")
	}
	return count
}

func TestChartIsWellFormedSVG(t *testing.T) {
	c := Chart{
		Title: `pins <vs> "abort" & rate`, XLabel: "x", YLabel: "y", LogX: true,
		Series: []Series{
			{Name: "a&b", X: []float64{1e3, 1e4, 1e5}, Y: []float64{10, 20, 30}},
			{Name: "cdf", X: []float64{1, 2, 3}, Y: []float64{0.1, 0.5, 0.9}, Step: true},
			{Name: "one", X: []float64{5e3}, Y: []float64{math.Inf(1)}},
			{Name: "dot", X: []float64{5e3}, Y: []float64{7}},
		},
	}
	n := wellFormed(t, c.SVG())
	if n["polyline"] != 2 {
		t.Fatalf("want a line per plottable multi-point series, got %d", n["polyline"])
	}
	if n["text"] < 8 {
		t.Fatalf("title, labels, ticks and legend missing: %v", n)
	}
	if !strings.Contains(c.SVG(), "pins &lt;vs&gt;") {
		t.Fatal("title not escaped")
	}
}

func TestEmptyAndDegenerateCharts(t *testing.T) {
	wellFormed(t, Chart{Title: "empty"}.SVG())
	wellFormed(t, Chart{LogY: true, Series: []Series{{Name: "zero", X: []float64{0, 1}, Y: []float64{0, 0}}}}.SVG())
	wellFormed(t, Chart{YMin: 0, YMax: 1, Series: []Series{{Name: "flat", X: []float64{1, 1}, Y: []float64{2, 2}}}}.SVG())
}

func TestTicks(t *testing.T) {
	got := axis{lo: 1e3, hi: 1e5, log: true}.ticks()
	if len(got) != 3 || got[0] != 1e3 || got[2] != 1e5 {
		t.Fatalf("log ticks %v", got)
	}
	lin := axis{lo: 0, hi: 1}.ticks()
	if len(lin) < 3 || lin[0] != 0 || lin[len(lin)-1] < 0.99 {
		t.Fatalf("linear ticks %v", lin)
	}
	if Compact(1500) != "1.5k" || Compact(2e6) != "2M" || Compact(0.25) != "0.25" {
		t.Fatalf("compact: %s %s %s", Compact(1500), Compact(2e6), Compact(0.25))
	}
}
