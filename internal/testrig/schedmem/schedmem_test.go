package schedmem

import (
	"encoding/binary"
	"testing"

	"github.com/kvxfer/kvxfer/nixl/kvmem"
)

var small = Layout{Layers: 1, Slots: 4, Item: 8, AuxSlots: 2, AuxItems: []uint64{4, 8}}

func TestRegistrationsTileTheFiles(t *testing.T) {
	kv, aux := small.FileRegistrations("kv", "aux")
	if len(kv.Buffers) != 2 || len(aux.Buffers) != 2 {
		t.Fatalf("%d KV and %d aux buffers", len(kv.Buffers), len(aux.Buffers))
	}
	if b := kv.Buffers[1]; b.Shm != "kv" || b.Offset != 32 || b.Length != 32 || b.ItemLen != 8 {
		t.Fatalf("V buffer %+v", b)
	}
	if b := aux.Buffers[1]; b.Shm != "aux" || b.Offset != 8 || b.Length != 16 || b.ItemLen != 8 {
		t.Fatalf("second aux buffer %+v", b)
	}
	if small.KVLen() != 64 || small.AuxLen() != 24 {
		t.Fatalf("lengths %d %d", small.KVLen(), small.AuxLen())
	}
}

func TestPrepWritesThePatternDecodeChecks(t *testing.T) {
	kv, aux := make([]byte, small.KVLen()), make([]byte, small.AuxLen())
	small.Prep(kv, aux, 9, []int32{2}, 1)
	if kv[2*8+3] != kvmem.Pattern(9, 0, 0, 3) || kv[(4+2)*8] != kvmem.Pattern(9, 1, 0, 0) || kv[0] != 0 {
		t.Fatal("KV pages not where the slots say")
	}
	if aux[4+1] != AuxByte(9, 0, 1) || binary.LittleEndian.Uint64(aux[8+8:]) != 9 {
		t.Fatalf("aux rows %v", aux)
	}
}
