package bench

import "testing"

// TestCensus runs the mixed workload on every engine: the fixed port and the
// actor engine end with every room terminal and nothing left; the upstream
// port is only reported (its counts depend on the schedule), except that the
// late infos after clear always leak there.
func TestCensus(t *testing.T) {
	for _, k := range Kinds() {
		t.Run(string(k), func(t *testing.T) {
			tg, err := NewTarget(k)
			if err != nil {
				t.Fatal(err)
			}
			defer tg.Close()
			r := census(tg, 200, 1)
			t.Logf("%s: %+v", k, r)
			if r.Succeeded+r.Failed+r.Pinned != r.Rooms {
				t.Fatalf("rooms unaccounted for: %+v", r)
			}
			if k == Upstream {
				if r.Leaked == 0 {
					t.Fatalf("upstream left nothing behind: %+v", r)
				}
				return
			}
			if r.Pinned != 0 || r.Leaked != 0 {
				t.Fatalf("%s pinned or leaked: %+v", k, r)
			}
		})
	}
}
