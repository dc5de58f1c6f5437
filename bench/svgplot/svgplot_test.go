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
			if depth == 0 && e.Name.Local != "svg" {
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
	doc := c.SVG()
	n := wellFormed(t, doc)
	if n["path"] < 4 || n["text"] < 8 {
		t.Fatalf("lines, axes, ticks, title and legend missing: %v", n)
	}
	// The series that has no finite point is left out of the legend; the
	// others are in it. gonum's SVG writes text as <text> elements.
	for _, want := range []string{"a&amp;b", "cdf", "dot", "pins &lt;vs&gt;"} {
		if !strings.Contains(doc, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if strings.Contains(doc, ">one<") {
		t.Error("a series with no plottable point is in the legend")
	}
}

func TestEmptyAndDegenerateCharts(t *testing.T) {
	wellFormed(t, Chart{Title: "empty"}.SVG())
	wellFormed(t, Chart{LogY: true, Series: []Series{{Name: "zero", X: []float64{0, 1}, Y: []float64{0, 0}}}}.SVG())
	wellFormed(t, Chart{YMin: 0, YMax: 1, Series: []Series{{Name: "flat", X: []float64{1, 1}, Y: []float64{2, 2}}}}.SVG())
	wellFormed(t, Chart{LogX: true, Title: "empty log"}.SVG())
}

func TestCompact(t *testing.T) {
	if Compact(1500) != "1.5k" || Compact(2e6) != "2M" || Compact(0.25) != "0.25" {
		t.Fatalf("compact: %s %s %s", Compact(1500), Compact(2e6), Compact(0.25))
	}
}
