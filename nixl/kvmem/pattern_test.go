package kvmem

import (
	"testing"

	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// TestPatternRowIsPattern: the period-copy row is Pattern byte for byte, for
// rooms, buffers and slots that cover every residue the formula mixes, and
// lengths around the 256-byte period.
func TestPatternRowIsPattern(t *testing.T) {
	rooms := []uint64{0, 1, 250, 251, 252, 1<<62 + 12345, ^uint64(0)}
	for _, r := range rooms {
		for b := 0; b < 70; b += 3 {
			for _, slot := range []int{0, 1, 7, 255, 256, 4095} {
				for _, n := range []int{0, 1, 255, 256, 257, 1000, 1024} {
					row := make([]byte, n)
					PatternRow(row, r, b, slot)
					for k, got := range row {
						if want := Pattern(r, b, slot, k); got != want {
							t.Fatalf("room %d buffer %d slot %d len %d: byte %d is %d, want %d", r, b, slot, n, k, got, want)
						}
					}
					if !PatternMatches(row, r, b, slot) {
						t.Fatalf("room %d buffer %d slot %d len %d: its own row does not match", r, b, slot, n)
					}
					for _, k := range []int{0, n / 2, n - 1} {
						if n == 0 {
							break
						}
						row[k] ^= 0x40
						if PatternMatches(row, r, b, slot) {
							t.Fatalf("room %d buffer %d slot %d len %d: byte %d flipped still matches", r, b, slot, n, k)
						}
						row[k] ^= 0x40
					}
				}
			}
		}
	}
	// Another room's, buffer's or page's row never matches (the check keys on all three).
	row := make([]byte, 1024)
	PatternRow(row, 42, 3, 5)
	for _, o := range [][3]int{{43, 3, 5}, {42, 4, 5}, {42, 3, 6}} {
		if PatternMatches(row, uint64(o[0]), o[1], o[2]) {
			t.Errorf("row of (42, 3, 5) matches %v", o)
		}
	}
}

// TestNodeCheckFindsEveryWrongByte: FillPageAt/CheckPageAt/WrongBytesAt on a
// Node (fast path, no Topo) agree with the byte-by-byte definition.
func TestNodeCheckFindsEveryWrongByte(t *testing.T) {
	sh := DefaultShape()
	sh.Slots = 8
	n, err := New("kvmem-pattern-test", sh, 0, loopback.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	const r = 987654321
	n.FillPageAt(r, 2, 5)
	for b, buf := range n.KV {
		for k := range sh.Item {
			if got, want := buf[2*sh.Item+k], Pattern(r, b, 5, k); got != want {
				t.Fatalf("buffer %d byte %d is %d, want %d", b, k, got, want)
			}
		}
	}
	if err := n.CheckPageAt(r, 2, 5); err != nil {
		t.Fatal(err)
	}
	if w := n.WrongBytesAt(r, 2, 5); w != 0 {
		t.Fatalf("%d wrong bytes in a filled page", w)
	}
	last := len(n.KV) - 1
	n.KV[0][2*sh.Item] ^= 1
	n.KV[last][3*sh.Item-1] ^= 1
	n.KV[last][2*sh.Item+300] ^= 1
	if err := n.CheckPageAt(r, 2, 5); err == nil {
		t.Fatal("corrupted page passed")
	}
	if w := n.WrongBytesAt(r, 2, 5); w != 3 {
		t.Fatalf("WrongBytesAt = %d, want 3", w)
	}
	if err := n.CheckPageAt(r, 2, 4); err == nil {
		t.Fatal("page checked against another request page passed")
	}
}
