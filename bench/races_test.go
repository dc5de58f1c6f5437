package bench

import "testing"

// TestRaces runs every race scenario against every engine it names and checks
// the outcome: the upstream port reproduces each race, the fixed port and the
// actor engine do not pin, leak or lose the abort.
func TestRaces(t *testing.T) {
	for _, s := range Races() {
		for _, k := range s.Kinds {
			t.Run(s.Name+"/"+string(k), func(t *testing.T) {
				o, err := s.RunOn(k)
				if err != nil {
					t.Fatalf("run: %v", err)
				}
				if err := s.Check(o); err != nil {
					t.Fatalf("%v\noutcome: %s", err, o)
				}
			})
		}
	}
}
