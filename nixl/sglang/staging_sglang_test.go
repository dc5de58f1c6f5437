package sglang_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"testing"

	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// sglangStagingPy is the path of release rel's staging_buffer.py and its
// venv's python; the test skips without them unless KVXFER_REQUIRE_SGLANG=1.
func sglangStagingPy(t *testing.T, rel string) (python, file string) {
	python = "/opt/kvxfer-sglang/" + rel + "/bin/python"
	file = "/opt/kvxfer-sglang/" + rel + "/lib/python3.11/site-packages/sglang/srt/disaggregation/common/staging_buffer.py"
	for _, p := range []string{python, file} {
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("KVXFER_REQUIRE_SGLANG") == "1" {
				t.Fatalf("SGLang %s venv missing (make deps-sglang): %v", rel, err)
			}
			t.Skipf("SGLang %s venv missing (make deps-sglang)", rel)
		}
	}
	return python, file
}

// TestStagingMatchesSGLang: HeadSliceParams and StagingLayout give what
// SGLang's own compute_head_slice_params and compute_staging_layout give
// (0.5.18's and 0.5.23's staging_buffer.py, run with torch stubbed) over
// every TP pair of 1 to 8, 1 to 8 KV heads, every rank.
func TestStagingMatchesSGLang(t *testing.T) {
	type layoutCase [7]int
	type headCase [5]int
	var layouts []layoutCase
	var heads []headCase
	for _, ptp := range []int{1, 2, 4, 8} {
		for _, dtp := range []int{1, 2, 4, 8} {
			for _, h := range []int{1, 2, 4, 8} {
				for pr := range ptp {
					for dr := range dtp {
						heads = append(heads, headCase{ptp, dtp, pr, dr, h})
					}
				}
				for dr := range dtp {
					layouts = append(layouts, layoutCase{ptp, dtp, dr, h, 3 * (dr + 1), 4 * h, 2 + dr%3})
				}
			}
		}
	}
	req, _ := json.Marshal(map[string]any{"layouts": layouts, "heads": heads, "rings": []any{}})
	for _, rel := range []string{"0.5.18", "0.5.23"} {
		t.Run(rel, func(t *testing.T) {
			py, file := sglangStagingPy(t, rel)
			cmd := exec.Command(py, "testdata/staging_probe.py", file)
			cmd.Stdin = bytes.NewReader(req)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			var got struct {
				Layouts [][]json.RawMessage
				Heads   [][4]int
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			if len(got.Layouts) != len(layouts) || len(got.Heads) != len(heads) {
				t.Fatalf("%d/%d answers", len(got.Layouts), len(got.Heads))
			}
			for i, c := range heads {
				s, n, d := sglang.HeadSliceParams(c[0], c[1], c[2], c[3], c[4])
				if w := got.Heads[i]; w != [4]int{s, n, d, n} {
					t.Fatalf("compute_head_slice_params%v = %v, Go %d %d %d", c, w, s, n, d)
				}
			}
			for i, c := range layouts {
				var nw int
				var wb []uint64
				var total uint64
				g := got.Layouts[i]
				if json.Unmarshal(g[0], &nw) != nil || json.Unmarshal(g[1], &wb) != nil || json.Unmarshal(g[2], &total) != nil {
					t.Fatalf("answer %s", g)
				}
				w, tot := sglang.StagingLayout(c[0], c[1], c[2], c[3], c[4], uint64(c[5]), c[6])
				if len(w) != nw || tot != total {
					t.Fatalf("compute_staging_layout%v = %d %v %d, Go %v %d", c, nw, wb, total, w, tot)
				}
				for k := range w {
					if w[k] != wb[k] {
						t.Fatalf("compute_staging_layout%v = %v, Go %v", c, wb, w)
					}
				}
			}
			t.Logf("%d head-slice and %d layout cases agree with SGLang %s", len(heads), len(layouts), rel)
		})
	}
}
