package decode

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"
)

// TestStagingRingMatchesSGLang: StagingRing hands out the same (id, offset,
// round) and reports the same watermark after every free as SGLang's own
// StagingAllocator (0.5.18's and 0.5.23's staging_buffer.py, ring logic run
// with torch stubbed: nixl/sglang/testdata/staging_probe.py), over seeded
// random sequences of allocations (some oversized) and out-of-order frees.
func TestStagingRingMatchesSGLang(t *testing.T) {
	type ringReq struct {
		Size int64   `json:"size"`
		Ops  [][]any `json:"ops"`
	}
	var rings []ringReq
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		size := int64(64 + rng.IntN(1000))
		req := ringReq{Size: size}
		var held []int
		next := 0
		for range 60 {
			if len(held) > 0 && rng.IntN(3) == 0 {
				k := rng.IntN(len(held))
				req.Ops = append(req.Ops, []any{"f", held[k]})
				held = append(held[:k], held[k+1:]...)
				continue
			}
			n := int64(1 + rng.IntN(int(size/3)))
			if rng.IntN(15) == 0 {
				n = size + 1 // never fits: None
			}
			req.Ops = append(req.Ops, []any{"a", n})
			if n <= size {
				held = append(held, next)
				next++
			}
		}
		rings = append(rings, req)
	}
	replay := func(emptyNewRound bool) (out [][][]int64) {
		for _, req := range rings {
			g := NewStagingRing(req.Size)
			g.EmptyNewRound = emptyNewRound
			var got [][]int64
			for _, op := range req.Ops {
				if op[0] == "f" {
					g.free(op[1].(int))
					r, tl := g.Watermark()
					got = append(got, []int64{r, tl})
					continue
				}
				id, off, round, ok := g.assign(op[1].(int64))
				if !ok {
					got = append(got, nil)
					continue
				}
				got = append(got, []int64{int64(id), off, round})
			}
			out = append(out, got)
		}
		return out
	}
	body, _ := json.Marshal(map[string]any{"layouts": []any{}, "heads": []any{}, "rings": rings})
	for _, rel := range []string{"0.5.18", "0.5.23"} {
		local := replay(rel == "0.5.23")
		t.Run(rel, func(t *testing.T) {
			py := "/opt/kvxfer-sglang/" + rel + "/bin/python"
			file := "/opt/kvxfer-sglang/" + rel + "/lib/python3.11/site-packages/sglang/srt/disaggregation/common/staging_buffer.py"
			for _, p := range []string{py, file} {
				if _, err := os.Stat(p); err != nil {
					if os.Getenv("KVXFER_REQUIRE_SGLANG") == "1" {
						t.Fatalf("SGLang %s venv missing (make deps-sglang): %v", rel, err)
					}
					t.Skipf("SGLang %s venv missing (make deps-sglang)", rel)
				}
			}
			cmd := exec.Command(py, "../../nixl/sglang/testdata/staging_probe.py", file)
			cmd.Stdin = bytes.NewReader(body)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			var want struct{ Ring [][][]int64 }
			if err := json.Unmarshal(out, &want); err != nil {
				t.Fatal(err)
			}
			if len(want.Ring) != len(local) {
				t.Fatalf("%d sequences back", len(want.Ring))
			}
			for s := range local {
				for i := range local[s] {
					w, g := want.Ring[s][i], local[s][i]
					if (w == nil) != (g == nil) || len(w) != len(g) {
						t.Fatalf("seed %d op %d %v: SGLang %v, Go %v", s, i, rings[s].Ops[i], w, g)
					}
					for k := range w {
						if w[k] != g[k] {
							t.Fatalf("seed %d op %d %v: SGLang %v, Go %v", s, i, rings[s].Ops[i], w, g)
						}
					}
				}
			}
		})
	}
}
