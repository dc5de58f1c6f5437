// Package workload generates SGLang-shaped prefill workloads and drives any
// bench.Engine through them with one scheduler loop, so that the actor engine
// and the dict-based ports are measured by the same code over the same
// transfer layer.
package workload

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Phase is where in a room's life an abort lands.
type Phase uint8

const (
	// NoAbort: the room runs to completion.
	NoAbort Phase = iota
	// BeforeSender: decode's ABORT reaches prefill before the scheduler
	// creates the sender, and decode sends no transfer info (it gave up); a
	// client abort lands right after Open, before decode's infos.
	BeforeSender
	// BeforeInit: every transfer info is in (the room polled
	// WaitingForInput), the scheduler has not called init yet.
	BeforeInit
	// InChunk: right after the first chunk of a room with two chunks or
	// more was sent, while its writes are in flight (the "RDMA window").
	InChunk
	// AfterSuccess: the room polled Success, before the scheduler clears it.
	AfterSuccess
	numPhases
)

// AbortPhases lists every phase an abort can be injected at.
func AbortPhases() []Phase { return []Phase{BeforeSender, BeforeInit, InChunk, AfterSuccess} }

var phaseNames = [numPhases]string{"none", "before-sender", "before-init", "in-chunk", "after-success"}

func (p Phase) String() string {
	if p < numPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", p)
}

// MarshalText names the phase in JSON.
func (p Phase) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText is the inverse of MarshalText.
func (p *Phase) UnmarshalText(b []byte) error {
	for i, n := range phaseNames {
		if n == string(b) {
			*p = Phase(i)
			return nil
		}
	}
	return fmt.Errorf("workload: unknown phase %q", b)
}

// Source is who aborts.
type Source uint8

const (
	// Decode sends an ABORT frame (Engine.DecodeAbort).
	Decode Source = iota
	// Client is the scheduler's sender.abort() (Engine.Abort).
	Client
)

func (s Source) String() string {
	if s == Client {
		return "client"
	}
	return "decode"
}

// MarshalText names the source in JSON.
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText is the inverse of MarshalText.
func (s *Source) UnmarshalText(b []byte) error {
	switch string(b) {
	case "decode":
		*s = Decode
	case "client":
		*s = Client
	default:
		return fmt.Errorf("workload: unknown source %q", b)
	}
	return nil
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
	AbortShare float64  `json:"abort_share"`
	Phases     []Phase  `json:"phases"`
	Sources    []Source `json:"sources"`
	Seed       uint64   `json:"seed"`
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
		s.Phases = AbortPhases()
	}
	if len(s.Sources) == 0 {
		s.Sources = []Source{Decode, Client}
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

// Plan is one room's script: what the scheduler sends and where it aborts.
type Plan struct {
	Chunks  []int // pages per chunk
	Agents  int   // decode agents (1 or 2)
	Abort   Phase
	From    Source
	Arrival time.Duration // open loop: offset from the start of the run
}

// Pages is the room's page count (what init announces).
func (p Plan) Pages() int {
	n := 0
	for _, c := range p.Chunks {
		n += c
	}
	return n
}

// Generate draws the plans of s. The same spec and seed give the same plans,
// so every engine of a comparison runs the same rooms.
func Generate(s Spec) ([]Plan, error) {
	s, err := s.Normalize()
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(s.Seed, s.Seed^0x243f6a8885a308d3))
	plans := make([]Plan, s.Rooms)
	var at time.Duration
	for i := range plans {
		p := Plan{Agents: 1}
		if rng.Float64() < s.TwoAgents {
			p.Agents = 2
		}
		n := s.Chunks.draw(rng)
		for range n {
			p.Chunks = append(p.Chunks, s.Pages.draw(rng))
		}
		if rng.Float64() < s.AbortShare {
			p.Abort = s.Phases[rng.IntN(len(s.Phases))]
			p.From = s.Sources[rng.IntN(len(s.Sources))]
			// An abort inside a non-last chunk needs a second chunk.
			if p.Abort == InChunk && len(p.Chunks) < 2 {
				p.Chunks = append(p.Chunks, s.Pages.draw(rng))
			}
		}
		if s.Rate > 0 {
			at += time.Duration(rng.ExpFloat64() / s.Rate * float64(time.Second))
			p.Arrival = at
		}
		plans[i] = p
	}
	return plans, nil
}
