package stats

import (
	"testing"
	"time"
)

func ms(xs ...int) []time.Duration {
	out := make([]time.Duration, len(xs))
	for i, x := range xs {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestPercentileNearestRank(t *testing.T) {
	s := Sorted(ms(5, 1, 4, 2, 3, 10, 9, 8, 7, 6), 0)
	for _, c := range []struct {
		p    float64
		want int
	}{{0.5, 5}, {0.1, 1}, {0.11, 2}, {0.99, 10}, {1, 10}, {0.0001, 1}} {
		if got := Percentile(s, c.p); got != time.Duration(c.want)*time.Millisecond {
			t.Errorf("p%v = %v, want %dms", c.p, got, c.want)
		}
	}
	if Percentile(nil, 0.5) != 0 {
		t.Error("empty set")
	}
}

func TestNeverPushesTailToInf(t *testing.T) {
	xs := make([]time.Duration, 98)
	for i := range xs {
		xs[i] = time.Duration(i+1) * time.Microsecond
	}
	s := Summarize(xs, 2) // 100 samples, 2 never
	if s.N != 100 || s.Never != 2 || s.P50 != 50*time.Microsecond {
		t.Fatalf("summary %+v", s)
	}
	if s.P99 != Inf || s.P999 != Inf || s.Max != Inf {
		t.Fatalf("two pinned rooms out of 100 must put p99 at Inf: %+v", s)
	}
	if s := Summarize(xs, 0); s.P99 != 98*time.Microsecond {
		t.Fatalf("without pins p99 = %v", s.P99)
	}
}

func TestCDF(t *testing.T) {
	s := Sorted(ms(1, 2, 3, 4), 1)
	c := CDF(s, 10)
	if len(c) != 4 {
		t.Fatalf("%d points: %v", len(c), c)
	}
	for i, p := range c {
		if p.X != time.Duration(i+1)*time.Millisecond || p.F != float64(i+1)/5 {
			t.Fatalf("point %d = %+v", i, p)
		}
	}
	// Thinned: monotone, ends at the last finite sample.
	big := make([]time.Duration, 1000)
	for i := range big {
		big[i] = time.Duration(i)
	}
	c = CDF(Sorted(big, 0), 7)
	for i := 1; i < len(c); i++ {
		if c[i].X < c[i-1].X || c[i].F <= c[i-1].F {
			t.Fatalf("not monotone at %d: %v", i, c)
		}
	}
	if last := c[len(c)-1]; last.X != 999 || last.F != 1 {
		t.Fatalf("last point %+v", last)
	}
	if CDF(Sorted(nil, 3), 5) != nil {
		t.Fatal("all never: no curve")
	}
}

func TestMedianAndRatio(t *testing.T) {
	if Median([]float64{3, 1, 2}) != 2 || Median([]float64{4, 1, 3, 2}) != 2.5 || Median(nil) != 0 {
		t.Fatal("median")
	}
	if Ratio(3, 2) != 1.5 || Ratio(1, 0) != 0 {
		t.Fatal("ratio")
	}
}

func TestSummarizeCountsNearestRank(t *testing.T) {
	xs := make([]int, 0, 100)
	for i := 100; i >= 1; i-- { // unsorted on purpose
		xs = append(xs, i)
	}
	if got := SummarizeCounts(xs); got != (Counted{N: 100, P50: 50, P99: 99, Max: 100}) {
		t.Fatalf("counts of 1..100: %+v", got)
	}
	if xs[0] != 100 {
		t.Fatal("SummarizeCounts sorted its input in place")
	}
	if got := SummarizeCounts(nil); got != (Counted{}) {
		t.Fatalf("no samples: %+v", got)
	}
}
