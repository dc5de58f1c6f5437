package large

import (
	"os"
	"slices"
	"testing"
)

var tiny = Geometry{Name: "tiny", Layers: 4, PageTokens: 16, TokenBytes: 256, RoomPages: 10, Run: 4}

func TestPages(t *testing.T) {
	slots := tiny.Slots(3)
	if slots != 36 { // 3 blocks of 4 per room
		t.Fatalf("slots %d", slots)
	}
	src, dst := Pages(tiny, 3, slots, 1)
	seen := map[int32]bool{}
	for r := range src {
		if len(src[r]) != tiny.RoomPages || len(dst[r]) != tiny.RoomPages {
			t.Fatalf("room %d: %d/%d pages", r, len(src[r]), len(dst[r]))
		}
		for _, p := range src[r] {
			if seen[p] || p < 0 || int(p) >= slots {
				t.Fatalf("page %d reused or out of range", p)
			}
			seen[p] = true
		}
	}
}

// TestRooms: merged lists are one descriptor per buffer and run common to
// both sides, SGLang's one per buffer and page; both move a room's bytes.
func TestRooms(t *testing.T) {
	for _, g := range []Geometry{tiny, {Name: "fresh", Layers: 2, PageTokens: 16, TokenBytes: 256, RoomPages: 8, Run: 8}} {
		slots := g.Slots(2)
		src, dst := Pages(g, 2, slots, 1)
		rooms, err := Rooms(g, slots, src, dst)
		if err != nil {
			t.Fatal(err)
		}
		for i, rm := range rooms {
			if len(rm.SrcIdx) != g.Bufs()*g.RoomPages {
				t.Fatalf("%s room %d: %d indices", g.Name, i, len(rm.SrcIdx))
			}
			if int(rm.Bytes()) != g.RoomBytes() {
				t.Fatalf("%s room %d moves %d bytes, want %d", g.Name, i, rm.Bytes(), g.RoomBytes())
			}
			runs := 0 // pages where a new run starts on either side
			for k := range src[i] {
				if k == 0 || src[i][k] != src[i][k-1]+1 || dst[i][k] != dst[i][k-1]+1 {
					runs++
				}
			}
			if len(rm.Src) != g.Bufs()*runs {
				t.Fatalf("%s room %d: %d merged descriptors, want %d", g.Name, i, len(rm.Src), g.Bufs()*runs)
			}
		}
	}
	// A fresh pool: one run, one descriptor per buffer.
	g := Geometry{Name: "fresh", Layers: 2, PageTokens: 16, TokenBytes: 256, RoomPages: 8, Run: 8}
	src, dst := Pages(g, 1, g.Slots(1), 1)
	rooms, _ := Rooms(g, g.Slots(1), src, dst)
	if len(rooms[0].Src) != g.Bufs() {
		t.Fatalf("fresh pool: %d descriptors", len(rooms[0].Src))
	}
}

// TestRunTiny runs a tiny cell over real NIXL (skipped where NIXL or its
// Python API is absent): every engine reports a rate, and the kvxfer round
// (and the kvxfer-prepped and cma ones) left decode memory holding the
// source bytes.
func TestRunTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NIXL and two Python processes")
	}
	cfg := Config{Geometries: []Geometry{tiny}, InFlight: []int{1, 2}, Pairs: 2, Warm: 1, RoundBytes: 1 << 20, Seed: 1, Transport: os.Getenv("UCX_TLS")}
	if cfg.Transport == "" {
		cfg.Transport = "tcp,self,sm"
	}
	res, err := Run(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Skipped != "" {
		t.Skip(res.Skipped)
	}
	if len(res.Cells) != 2 {
		t.Fatalf("%d cells", len(res.Cells))
	}
	for _, c := range res.Cells {
		if !c.Verified {
			t.Fatalf("cell %d in flight not verified", c.InFlight)
		}
		var names []string
		for _, e := range c.Engines {
			names = append(names, e.Engine)
			if e.GBps <= 0 || len(e.Rounds) != cfg.Pairs {
				t.Fatalf("%s: %v GB/s over %d rounds", e.Engine, e.GBps, len(e.Rounds))
			}
		}
		want := Engines
		if res.CmaSkipped != "" {
			want = []string{Memcpy, Kvxfer, KvxferPrepped, Py, PySGLang}
		} else if _, ok := c.Ratios["kvxfer/cma"]; !ok {
			t.Fatalf("cma ran but no kvxfer/cma ratio: %v", c.Ratios)
		}
		if !slices.Equal(names, want) {
			t.Fatalf("engines %v, want %v (cma skipped: %q)", names, want, res.CmaSkipped)
		}
		if c.DescsMerged >= c.DescsSGLang {
			t.Fatalf("merged %v descriptors per room, SGLang %v", c.DescsMerged, c.DescsSGLang)
		}
	}
}

func TestCmaOnlyOnOneHostOverSharedMemory(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		runs bool
	}{
		{Config{Transport: "tcp,self,sm"}, true},
		{Config{Transport: "sm,self"}, true},
		{Config{Transport: "tcp,self"}, false},
		{Config{Transport: "smx,tcp"}, false},
		{Config{Transport: "tcp,self,sm", TargetWrap: []string{"ip", "netns", "exec", "d"}}, false},
	} {
		why := cmaUnsupported(c.cfg)
		if (why == "") != c.runs {
			t.Errorf("%+v: cma runs %v (%q), want %v", c.cfg, why == "", why, c.runs)
		}
		r := &runner{cmaSkipped: why}
		if got := slices.Contains(r.engines(), Cma) || slices.Contains(r.engines(), CmaBatched); got != c.runs {
			t.Errorf("%+v: engines %v", c.cfg, r.engines())
		}
	}
}
