package suite

import "testing"

func TestHeapPerRoomSaysNothingItCannotMeasure(t *testing.T) {
	for _, c := range []struct {
		mid, after, live, want float64
	}{
		{mid: 2_000_000, after: 1_000_000, live: 1000, want: 1000},
		{mid: 2_000_000, after: 1_000_000, live: 99, want: 0},  // an open loop's handful of rooms
		{mid: 1_000_000, after: 1_200_000, live: 500, want: 0}, // the heap grew after they ended
		{mid: 1_000_000, after: 1_000_000, live: 500, want: 0},
	} {
		if got := heapPerRoom(c.mid, c.after, c.live); got != c.want {
			t.Errorf("heapPerRoom(%v, %v, %v) = %v, want %v", c.mid, c.after, c.live, got, c.want)
		}
	}
}
