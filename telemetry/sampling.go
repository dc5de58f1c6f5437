package telemetry

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvxfer/kvxfer/kv"
)

// Sampling is the tail-sampling policy, applied when a room retires. Failed
// rooms are always kept, and so are rooms whose time from creation to a
// terminal status (or to retirement, if they never got one) is at least
// Slow. The others are kept with probability Ratio, decided from the trace id
// (the parent's, so that every service that samples by ratio agrees) or,
// without a parent, from the room id. With ParentBased, a room that has a
// parent follows the parent's sampled flag instead.
//
// Config.Sampling nil keeps every room.
type Sampling struct {
	Ratio       float64
	ParentBased bool
	// Slow: 0 means DefaultSlow; a negative value turns the
	// rule off (only Failed rooms are kept regardless of the ratio).
	Slow time.Duration
}

func (s Sampling) validate() error {
	if s.Ratio < 0 || s.Ratio > 1 || math.IsNaN(s.Ratio) {
		return fmt.Errorf("telemetry: sampling ratio %v: want 0..1", s.Ratio)
	}
	return nil
}

// keepReason is a sampling decision; its String is a metric label.
type keepReason uint8

const (
	dropSampled keepReason = iota
	keepFailed
	keepSlow
	keepSampled
	dropQueueFull
	numDecisions
)

var decisionNames = [numDecisions]string{"dropped_by_ratio", "kept_failed", "kept_slow", "kept_by_ratio", "dropped_queue_full"}

func (k keepReason) String() string { return decisionNames[k] }

func (s *Sampling) decide(r *roomRec) keepReason {
	if r.status == kv.StatusFailed {
		return keepFailed
	}
	slow := s.Slow
	if slow == 0 {
		slow = DefaultSlow
	}
	end := r.retiredAt
	if r.terminal {
		end = r.statusAt
	}
	if slow > 0 && time.Duration(end-r.created) >= slow {
		return keepSlow
	}
	if s.ParentBased && r.hasParent {
		if r.parentSampled {
			return keepSampled
		}
		return dropSampled
	}
	switch {
	case s.Ratio >= 1:
		return keepSampled
	case s.Ratio <= 0:
		return dropSampled
	}
	x := splitmix(r.id) >> 1
	if r.hasParent {
		id := r.parent.TraceID()
		x = binary.BigEndian.Uint64(id[8:16]) >> 1 // as sdktrace.TraceIDRatioBased
	}
	if x < uint64(s.Ratio*(1<<63)) {
		return keepSampled
	}
	return dropSampled
}

func splitmix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// SamplingFromEnv reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (the
// SDK's names and meanings, applied at retirement instead of at span start)
// and KVXFER_TRACE_SLOW (a Go duration; "off" disables the slow rule).
func SamplingFromEnv(getenv func(string) string) (Sampling, error) {
	s := Sampling{Ratio: 1}
	arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG"))
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		v, err := strconv.ParseFloat(arg, 64)
		if err != nil || v < 0 || v > 1 {
			return 0, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER_ARG %q: want a ratio in 0..1", arg)
		}
		return v, nil
	}
	var err error
	switch v := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")); v {
	case "", "parentbased_always_on":
		s.Ratio, s.ParentBased = 1, v != ""
	case "always_on":
		s.Ratio = 1
	case "always_off":
		s.Ratio = 0
	case "parentbased_always_off":
		s.Ratio, s.ParentBased = 0, true
	case "traceidratio":
		s.Ratio, err = ratio()
	case "parentbased_traceidratio":
		s.ParentBased = true
		s.Ratio, err = ratio()
	default:
		err = fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER %q is not supported", v)
	}
	if err != nil {
		return s, err
	}
	switch v := strings.TrimSpace(getenv("KVXFER_TRACE_SLOW")); v {
	case "":
	case "off":
		s.Slow = -1
	default:
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return s, fmt.Errorf("telemetry: KVXFER_TRACE_SLOW %q: want a positive duration or off", v)
		}
		s.Slow = d
	}
	return s, nil
}
