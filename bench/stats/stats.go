// Package stats holds the few statistics the benchmark report quotes:
// nearest-rank percentiles over samples that may include "never" (a room
// that never reached the event, counted as +Inf so a pinned room pushes the
// tail to infinity instead of vanishing from it), empirical CDFs, medians
// of repeated runs and ratios of medians.
package stats

import (
	"math"
	"slices"
	"time"
)

// Inf stands for a sample that never happened (a pinned room's
// abort-to-terminal).
const Inf = time.Duration(math.MaxInt64)

// Sorted returns a sorted copy of xs with never extra Inf samples appended.
func Sorted(xs []time.Duration, never int) []time.Duration {
	out := make([]time.Duration, 0, len(xs)+never)
	out = append(out, xs...)
	slices.Sort(out)
	for range never {
		out = append(out, Inf)
	}
	return out
}

// Percentile is the nearest-rank p-quantile (0 < p <= 1) of sorted samples:
// the smallest sample with at least p of the samples at or below it. It
// returns 0 for no samples and Inf when that rank falls on a "never".
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Summary is the usual percentiles of one sample set.
type Summary struct {
	N     int           `json:"n"`
	Never int           `json:"never"`
	P50   time.Duration `json:"p50_ns"`
	P99   time.Duration `json:"p99_ns"`
	P999  time.Duration `json:"p999_ns"`
	Max   time.Duration `json:"max_ns"`
}

// Summarize computes the Summary of xs plus never "never" samples.
func Summarize(xs []time.Duration, never int) Summary {
	s := Sorted(xs, never)
	out := Summary{N: len(s), Never: never, P50: Percentile(s, 0.50), P99: Percentile(s, 0.99), P999: Percentile(s, 0.999)}
	if len(s) > 0 {
		out.Max = s[len(s)-1]
	}
	return out
}

// Point is one step of an empirical CDF: the share F of samples at or below X.
type Point struct {
	X time.Duration `json:"x_ns"`
	F float64       `json:"f"`
}

// CDF returns the empirical CDF of sorted samples, at most maxPoints points
// (evenly spaced in rank, always including the largest finite sample). Inf
// samples are left out, so the curve of a set with pinned rooms stops below 1.
func CDF(sorted []time.Duration, maxPoints int) []Point {
	n := len(sorted)
	finite := n
	for finite > 0 && sorted[finite-1] == Inf {
		finite--
	}
	if finite == 0 || maxPoints <= 0 {
		return nil
	}
	step := max(1, finite/maxPoints)
	var out []Point
	for i := step - 1; i < finite; i += step {
		out = append(out, Point{X: sorted[i], F: float64(i+1) / float64(n)})
	}
	if last := finite - 1; out[len(out)-1].X != sorted[last] || out[len(out)-1].F != float64(finite)/float64(n) {
		out = append(out, Point{X: sorted[last], F: float64(finite) / float64(n)})
	}
	return out
}

// Median of xs (the mean of the middle two for an even count); 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// Ratio is a/b, or 0 when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Counted is the percentiles of counts (scheduler iterations per abort).
type Counted struct {
	N   int `json:"n"`
	P50 int `json:"p50"`
	P99 int `json:"p99"`
	Max int `json:"max"`
}

// SummarizeCounts computes the Counted of xs (nearest rank, as Percentile).
func SummarizeCounts(xs []int) Counted {
	s := slices.Clone(xs)
	slices.Sort(s)
	at := func(p float64) int {
		if len(s) == 0 {
			return 0
		}
		return s[min(max(int(math.Ceil(p*float64(len(s)))), 1), len(s))-1]
	}
	out := Counted{N: len(s), P50: at(0.50), P99: at(0.99)}
	if len(s) > 0 {
		out.Max = s[len(s)-1]
	}
	return out
}
