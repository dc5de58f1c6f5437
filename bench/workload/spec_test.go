package workload

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	wl "github.com/kvxfer/kvxfer/emul/workload"
)

func TestGenerateIsDeterministic(t *testing.T) {
	s := Spec{Rooms: 500, Concurrency: 8, AbortShare: 0.4, TwoAgents: 0.5, Seed: 7}
	a, err := Generate(s)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate(s)
	for i := range a {
		if !slices.Equal(a[i].Chunks, b[i].Chunks) || a[i].Agents != b[i].Agents || a[i].Abort != b[i].Abort {
			t.Fatalf("plan %d differs between two generations: %+v vs %+v", i, a[i], b[i])
		}
	}
	s.Seed = 8
	c, _ := Generate(s)
	same := 0
	for i := range a {
		if slices.Equal(a[i].Chunks, c[i].Chunks) && a[i].Abort == c[i].Abort {
			same++
		}
	}
	if same == len(a) {
		t.Fatal("another seed gave the same plans")
	}
}

func TestGenerateRespectsTheSpec(t *testing.T) {
	s := Spec{Rooms: 20000, Chunks: Range{2, 5}, Pages: Range{3, 3}, AbortShare: 0.25, TwoAgents: 0.3,
		Phases: []wl.Phase{wl.InChunk, wl.BeforeSender}, Sources: []wl.Source{wl.Client}, Seed: 1}
	plans, err := Generate(s)
	if err != nil {
		t.Fatal(err)
	}
	aborted, two := 0, 0
	for i, p := range plans {
		if n := len(p.Chunks); n < 2 || n > 5 {
			t.Fatalf("plan %d: %d chunks", i, n)
		}
		for _, c := range p.Chunks {
			if c != 3 {
				t.Fatalf("plan %d: chunk of %d pages", i, c)
			}
		}
		if p.Pages != 3*len(p.Chunks) || p.Index != i {
			t.Fatalf("plan %d: index %d, Pages %d", i, p.Index, p.Pages)
		}
		switch p.Agents {
		case 1:
		case 2:
			two++
		default:
			t.Fatalf("plan %d: %d agents", i, p.Agents)
		}
		if p.Abort != wl.AbortNone {
			aborted++
			if ph := p.Abort.Phase(); ph != wl.InChunk && ph != wl.BeforeSender || p.Abort.From() != wl.Client {
				t.Fatalf("plan %d: abort %v not in the spec", i, p.Abort)
			}
		}
		if p.Arrival != 0 {
			t.Fatalf("closed loop plan %d has an arrival time", i)
		}
	}
	// The draws are seeded: these are fixed numbers, checked loosely so a
	// change of generator does not need new constants.
	if f := float64(aborted) / float64(len(plans)); f < 0.23 || f > 0.27 {
		t.Fatalf("abort share %.3f, want about 0.25", f)
	}
	if f := float64(two) / float64(len(plans)); f < 0.28 || f > 0.32 {
		t.Fatalf("two-agent share %.3f, want about 0.3", f)
	}
}

func TestInChunkAbortsGetASecondChunk(t *testing.T) {
	plans, _ := Generate(Spec{Rooms: 2000, Chunks: Range{1, 1}, AbortShare: 1, Phases: []wl.Phase{wl.InChunk}, Seed: 3})
	for i, p := range plans {
		if p.Abort.Phase() != wl.InChunk || len(p.Chunks) != 2 {
			t.Fatalf("plan %d: %v with %d chunks; an abort inside a non-last chunk needs two", i, p.Abort, len(p.Chunks))
		}
	}
}

func TestOpenLoopArrivals(t *testing.T) {
	plans, _ := Generate(Spec{Rooms: 10000, Rate: 1000, Seed: 5})
	prev := time.Duration(0)
	for i, p := range plans {
		if p.Arrival < prev {
			t.Fatalf("arrival %d goes back in time", i)
		}
		prev = p.Arrival
	}
	// 10,000 Poisson arrivals at 1,000/s span about 10 s.
	if last := plans[len(plans)-1].Arrival; last < 9*time.Second || last > 11*time.Second {
		t.Fatalf("last arrival at %v, want about 10 s", last)
	}
}

func TestNormalize(t *testing.T) {
	for _, bad := range []Spec{{}, {Rooms: 1, AbortShare: 2}, {Rooms: 1, TwoAgents: -1}, {Rooms: 1, Latency: [2]time.Duration{2, 1}},
		{Rooms: 1, Phases: []wl.Phase{wl.NoAbort}}} {
		if _, err := bad.Normalize(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	s, err := Spec{Rooms: 1}.Normalize()
	if err != nil || s.Concurrency != 64 || s.Chunks != (Range{1, 4}) || len(s.Phases) != 4 || len(s.Sources) != 2 {
		t.Fatalf("defaults: %+v %v", s, err)
	}
}

func TestLatencyFunc(t *testing.T) {
	if (Spec{}).LatencyFunc() != nil {
		t.Fatal("no latency configured, yet a distribution")
	}
	lo, hi, slow := 10*time.Microsecond, 20*time.Microsecond, time.Second
	fn := Spec{Latency: [2]time.Duration{lo, hi}, SlowShare: 0.5, Slow: slow}.LatencyFunc()
	slows := 0
	for range 1000 {
		d := fn()
		switch {
		case d == slow:
			slows++
		case d < lo || d > hi:
			t.Fatalf("latency %v outside [%v, %v] and not the tail", d, lo, hi)
		}
	}
	if slows == 0 || slows == 1000 {
		t.Fatalf("%d of 1000 requests in the tail at a share of one half", slows)
	}
	if d := (Spec{Latency: [2]time.Duration{lo, lo}, Slow: slow}).LatencyFunc(); d == nil || d() != lo {
		t.Fatal("fixed latency")
	}
}

func TestSpecJSONNamesPhasesAndSources(t *testing.T) {
	s, _ := Spec{Rooms: 3, AbortShare: 0.5}.Normalize()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"phases":["before-sender","before-init","in-chunk","after-success"]`) ||
		!strings.Contains(string(b), `"sources":["decode","client"]`) {
		t.Fatalf("spec JSON: %s", b)
	}
	var back Spec
	if err := json.Unmarshal(b, &back); err != nil || !slices.Equal(back.Phases, s.Phases) || !slices.Equal(back.Sources, s.Sources) || back.Rooms != 3 {
		t.Fatalf("round trip: %+v %v", back, err)
	}
}
