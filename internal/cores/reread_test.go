package cores

import "testing"

// TestReadLoadavgAgain: the kept file answers every read, not only the
// first (a read from the start each time, not from where the last ended).
func TestReadLoadavgAgain(t *testing.T) {
	if _, err := readLoadavg(); err != nil {
		t.Skipf("no /proc/loadavg here: %v", err)
	}
	for i := range 3 {
		if _, err := readLoadavg(); err != nil {
			t.Fatalf("read %d after the first: %v", i+2, err)
		}
	}
}
