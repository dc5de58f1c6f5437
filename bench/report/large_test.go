package report

import (
	"encoding/xml"
	"io"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/bench/large"
)

func TestLargeSection(t *testing.T) {
	g := large.Geometry{Name: "32L p16 1MiB", Layers: 32, PageTokens: 16, TokenBytes: 256, RoomPages: 4, Run: 4}
	cell := large.Cell{Geometry: g, InFlight: 4, RoomBytes: g.RoomBytes(), DescsMerged: 64, DescsSGLang: 256, Verified: true,
		Ratios: map[string]float64{"kvxfer/memcpy": 0.5, "kvxfer/nixl-py": 1.25, "kvxfer/best": 0.5}, LoadAvg: [2]string{"3.00 2.00 1.00", ""}}
	for i, e := range large.Engines {
		cell.Engines = append(cell.Engines, large.EngineResult{Engine: e, GBps: float64(i + 1), CPUPerGB: 0.1})
	}
	r := &large.Results{Config: large.Config{InFlight: []int{1, 4}, Transport: "tcp,self,sm", Pairs: 5, RoundBytes: 32 << 20}, Cells: []large.Cell{cell}}
	var b strings.Builder
	largeSection(&b, r)
	md := b.String()
	for _, want := range []string{"## Large rooms over real NIXL", "`UCX_TLS=tcp,self,sm`", "1, 4 rooms in flight",
		"| 32L p16 1MiB (1.0 MiB) | 4 | **2.00** | 3.00 | 4.00 | 5.00 | 1.00 | 50 % | 125 % | **50 %** | 64 (256) |", "large-rooms.svg"} {
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
	if !strings.Contains(svg, "kvxfer 32L p16 1MiB") {
		t.Fatal("plot lacks the kvxfer series")
	}
	b.Reset()
	largeSection(&b, &large.Results{Skipped: "NIXL library not found"})
	if !strings.Contains(b.String(), "Skipped: NIXL library not found") {
		t.Fatalf("skipped section: %s", b.String())
	}
}
