package telemetry

import (
	"sync/atomic"
	"testing"
	"unsafe"
)

// addLocal's plain add (addlocal.go) relies on atomic.Int64 being its int64
// alone; it adds exactly, and what it adds is what an atomic load reads.
func TestAddLocal(t *testing.T) {
	if s := unsafe.Sizeof(atomic.Int64{}); s != 8 {
		t.Fatalf("atomic.Int64 is %d bytes: addLocal's cast no longer holds", s)
	}
	var cs [3]atomic.Int64
	for i := range 1000 {
		addLocal(&cs[1], int64(i))
	}
	addLocal(&cs[1], -1)
	if cs[0].Load() != 0 || cs[2].Load() != 0 {
		t.Fatalf("neighbours written: %d %d", cs[0].Load(), cs[2].Load())
	}
	if v := cs[1].Load(); v != 999*1000/2-1 {
		t.Fatalf("sum %d", v)
	}
}
