// Package workload generates SGLang-shaped prefill workloads and drives any
// bench.Engine through them with one scheduler loop, so that the actor engine
// and the dict-based ports are measured by the same code over the same
// transfer layer.
package workload

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	wl "github.com/kvxfer/kvxfer/emul/workload"
)

// Phases is the default abort phases of a Spec: the four the recorded bench
// results use (after-info and after-init are played too when a Spec names them).
func Phases() []wl.Phase {
	return []wl.Phase{wl.BeforeSender, wl.BeforeInit, wl.InChunk, wl.AfterSuccess}
}

// Range is an inclusive integer range [Min, Max].
type Range struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

func (r Range) draw(rng *rand.Rand) int {
	if r.Max <= r.Min {
		return r.Min
	}
	return r.Min + rng.IntN(r.Max-r.Min+1)
}

// Spec describes a workload. The zero value of every optional field is a
// sensible default (see Normalize).
type Spec struct {
	Rooms int `json:"rooms"` // rooms to run
	// Concurrency bounds the rooms alive at once (closed loop). Used when
	// Rate is zero.
	Concurrency int `json:"concurrency,omitempty"`
	// Rate, if positive, is the open-loop arrival rate in rooms per second
	// (Poisson arrivals): rooms are admitted when they arrive, however many
	// are alive.
	Rate   float64 `json:"rate,omitempty"`
	Chunks Range   `json:"chunks"` // chunks per room (default 1..4)
	Pages  Range   `json:"pages"`  // pages per chunk (default 1..4)
	// TwoAgents is the share of rooms served by two decode agents (a
	// replicated or split decode): both must send their transfer info.
	TwoAgents float64 `json:"two_agents"`
	// Latency is the transfer latency range, drawn uniformly per NIXL request
	// by the loopback backend. A wide range opens the window in which an
	// abort lands while a non-last chunk is on the wire.
	Latency [2]time.Duration `json:"latency_ns"`
	// SlowShare of the requests take Slow instead: a tail (a congested
	// link, a retransmission) on top of the uniform range.
	SlowShare float64       `json:"slow_share,omitempty"`
	Slow      time.Duration `json:"slow_ns,omitempty"`
	// AbortShare of rooms is aborted, at a phase drawn from Phases (default
	// all) by a source drawn from Sources (default both).
	AbortShare float64     `json:"abort_share"`
	Phases     []wl.Phase  `json:"phases"`
	Sources    []wl.Source `json:"sources"`
	Seed       uint64      `json:"seed"`
}

// Normalize fills the defaults and rejects what cannot run.
func (s Spec) Normalize() (Spec, error) {
	if s.Rooms <= 0 {
		return s, fmt.Errorf("workload: %d rooms", s.Rooms)
	}
	if s.Rate <= 0 && s.Concurrency <= 0 {
		s.Concurrency = 64
	}
	if s.Chunks.Min <= 0 {
		s.Chunks = Range{1, 4}
	}
	if s.Pages.Min <= 0 {
		s.Pages = Range{1, 4}
	}
	if len(s.Phases) == 0 {
		s.Phases = Phases()
	}
	if slices.Contains(s.Phases, wl.NoAbort) {
		return s, fmt.Errorf("workload: %q is not an abort phase", wl.NoAbort)
	}
	if len(s.Sources) == 0 {
		s.Sources = []wl.Source{wl.Decode, wl.Client}
	}
	if s.AbortShare < 0 || s.AbortShare > 1 || s.TwoAgents < 0 || s.TwoAgents > 1 || s.SlowShare < 0 || s.SlowShare > 1 {
		return s, fmt.Errorf("workload: shares must be in [0, 1]")
	}
	if s.Latency[1] < s.Latency[0] {
		return s, fmt.Errorf("workload: latency range %v..%v", s.Latency[0], s.Latency[1])
	}
	return s, nil
}

// LatencyFunc is the per-request latency distribution of s for the
// loopback backend's fault injection, nil for none.
func (s Spec) LatencyFunc() func() time.Duration {
	lo, hi, share, slow := s.Latency[0], s.Latency[1], s.SlowShare, s.Slow
	if hi <= 0 && (share <= 0 || slow <= 0) {
		return nil
	}
	return func() time.Duration {
		if share > 0 && rand.Float64() < share {
			return slow
		}
		if hi <= lo {
			return lo
		}
		return lo + rand.N(hi-lo+1)
	}
}

// Generate draws the plans of s (emul/workload's Plan: Index, Pages, Chunks,
// Agents, Abort and, with a Rate, Arrival; the driver names the rooms). The
// same spec and seed give the same plans, so every engine of a comparison runs
// the same rooms.
func Generate(s Spec) ([]wl.Plan, error) {
	s, err := s.Normalize()
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(s.Seed, s.Seed^0x243f6a8885a308d3))
	plans := make([]wl.Plan, s.Rooms)
	var at time.Duration
	for i := range plans {
		p := wl.Plan{Index: i, Agents: 1}
		if rng.Float64() < s.TwoAgents {
			p.Agents = 2
		}
		n := s.Chunks.draw(rng)
		for range n {
			p.Chunks = append(p.Chunks, s.Pages.draw(rng))
		}
		if rng.Float64() < s.AbortShare {
			ph := s.Phases[rng.IntN(len(s.Phases))]
			p.Abort = wl.Abort(ph, s.Sources[rng.IntN(len(s.Sources))])
			// An abort inside a non-last chunk needs a second chunk.
			if ph == wl.InChunk && len(p.Chunks) < 2 {
				p.Chunks = append(p.Chunks, s.Pages.draw(rng))
			}
		}
		for _, c := range p.Chunks {
			p.Pages += c
		}
		if s.Rate > 0 {
			at += time.Duration(rng.ExpFloat64() / s.Rate * float64(time.Second))
			p.Arrival = at
		}
		plans[i] = p
	}
	return plans, nil
}
