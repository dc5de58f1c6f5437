package workload

import (
	"reflect"
	"testing"
)

func TestRoomIDUniqueNonZero(t *testing.T) {
	for _, seed := range []uint64{0, 1, 42, 1 << 63} {
		seen := make(map[uint64]int, 200000)
		for i := range 200000 {
			id := RoomID(seed, i)
			if id == 0 || id >= 1<<63 {
				t.Fatalf("seed %d room %d: id %d out of range", seed, i, id)
			}
			if j, dup := seen[id]; dup {
				t.Fatalf("seed %d: rooms %d and %d share id %d", seed, j, i, id)
			}
			seen[id] = i
		}
	}
}

// TestGolden pins the rule: the scheduler emulator (another package, maybe
// another language) must derive exactly these values.
func TestGolden(t *testing.T) {
	if got := RoomID(1, 0); got != goldenRoom0 {
		t.Errorf("RoomID(1, 0) = %d, want %d", got, goldenRoom0)
	}
	if got := Draw(1, 0, 1); got != goldenDraw {
		t.Errorf("Draw(1, 0, 1) = %#x, want %#x", got, goldenDraw)
	}
}

func TestPlanDeterministicAndConsistent(t *testing.T) {
	c := Default(7)
	c.AbortShare, c.PrefixShare, c.DummyShare = 0.5, 0.3, 0.3
	kinds := map[AbortKind]int{}
	full := 0
	for i := range 5000 {
		p := c.Plan(i)
		if q := c.Plan(i); !reflect.DeepEqual(p, q) {
			t.Fatalf("plan %d not deterministic", i)
		}
		sum := 0
		for _, k := range p.Chunks {
			sum += k
			if k == 0 && p.Pages != 0 {
				t.Fatalf("plan %d: empty chunk in %v", i, p.Chunks)
			}
		}
		if sum != p.Pages || len(p.Chunks) == 0 || p.Pages > c.MaxPages || len(p.Chunks) > c.MaxChunks+1 {
			t.Fatalf("plan %d: pages %d chunks %v", i, p.Pages, p.Chunks)
		}
		if p.Abort == AbortPrefillMidTransfer && len(p.Chunks) < 2 {
			t.Fatalf("plan %d: mid-transfer abort with %v", i, p.Chunks)
		}
		if p.AbortDelay < 0 || p.AbortDelay >= c.MaxAbortDelay || (p.AbortDelay != 0 && p.Abort != AbortDecodeAfterInfo) {
			t.Fatalf("plan %d: delay %v for %v", i, p.AbortDelay, p.Abort)
		}
		if p.fullPrefixHit() {
			full++
		}
		kinds[p.Abort]++
	}
	for _, k := range AbortKinds() {
		if kinds[k] == 0 {
			t.Errorf("no plan with abort %v", k)
		}
	}
	if full == 0 {
		t.Error("no full prefix hit")
	}
	if planFor(3, 9).Room != RoomID(3, 9) {
		t.Error("PlanFor room")
	}
}
