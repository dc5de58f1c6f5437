package report

import (
	"encoding/xml"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/bench/large"
)

func TestLargeSection(t *testing.T) {
	g := large.Geometry{Name: "32L p16 1MiB", Layers: 32, PageTokens: 16, TokenBytes: 256, RoomPages: 4, Run: 4}
	cell := large.Cell{Geometry: g, InFlight: 4, RoomBytes: g.RoomBytes(), DescsMerged: 64, DescsSGLang: 256, Verified: true,
		Ratios: map[string]float64{"kvxfer/memcpy": 0.5, "kvxfer/nixl-py": 1.25, "kvxfer/best": 0.5, "kvxfer/cma": 0.8}, LoadAvg: [2]string{"3.00 2.00 1.00", ""}}
	for i, e := range large.Engines {
		cell.Engines = append(cell.Engines, large.EngineResult{Engine: e, GBps: float64(i + 1), CPUPerGB: 0.1})
	}
	r := &large.Results{Config: large.Config{InFlight: []int{1, 4}, Transport: "tcp,self,sm", Pairs: 5, RoundBytes: 32 << 20}, Cells: []large.Cell{cell}}
	var b strings.Builder
	largeSection(&b, r)
	md := b.String()
	for _, want := range []string{"## Large rooms over real NIXL", "`UCX_TLS=tcp,self,sm`", "1, 4 rooms in flight",
		"| 32L p16 1MiB (1.0 MiB) | 4 | **2.00** | 3.00 | 4.00 | 5.00 | 1.00 | 6.00 (7.00) | 50 % | 125 % | 80 % | **50 %** | 64 (256) | 0.100 / 0.100 / 0.100 / 0.100 |", "large-rooms.svg"} {
		if !strings.Contains(md, want) {
			t.Fatalf("section lacks %q:\n%s", want, md)
		}
	}
	svg := largePlot(r).SVG()
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("plot is not well-formed XML: %v", err)
		}
	}
	for _, want := range []string{"kvxfer 32L p16 1MiB", "cma 32L p16 1MiB"} {
		if !strings.Contains(svg, want) {
			t.Fatalf("plot lacks the %q series", want)
		}
	}
	// Without the cma engines (another host): a dash, the reason, no series.
	cell.Engines = slices.DeleteFunc(cell.Engines, func(e large.EngineResult) bool { return e.Engine == large.Cma || e.Engine == large.CmaBatched })
	delete(cell.Ratios, "kvxfer/cma")
	r = &large.Results{Config: r.Config, Cells: []large.Cell{cell}, CmaSkipped: "UCX_TLS=tcp,self has no shared-memory transport"}
	b.Reset()
	largeSection(&b, r)
	for _, want := range []string{"The cma engines did not run: UCX_TLS=tcp,self has no shared-memory transport.", "| 1.00 | — | 50 % | 125 % | — | **50 %** |", "0.100 / 0.100 / 0.100 / — |"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("section without cma lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(largePlot(r).SVG(), "cma 32L") {
		t.Fatal("plot has a cma series with no points")
	}
	b.Reset()
	largeSection(&b, &large.Results{Skipped: "NIXL library not found"})
	if !strings.Contains(b.String(), "Skipped: NIXL library not found") {
		t.Fatalf("skipped section: %s", b.String())
	}
}
