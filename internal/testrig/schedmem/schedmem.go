package schedmem

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/transport/control"
)

// Layout is the geometry of the scheduler's memory.
type Layout struct {
	Layers   int // each has a K and a V buffer
	Slots    int // pages per KV buffer
	Item     int // bytes per page
	AuxSlots int
	AuxItems []uint64 // bytes per slot of each aux buffer; the last holds bootstrap_room
}

// KVLen is the bytes of the KV list.
func (l Layout) KVLen() int { return 2 * l.Layers * l.Slots * l.Item }

// AuxLen is the bytes of the aux list.
func (l Layout) AuxLen() int {
	n := 0
	for _, it := range l.AuxItems {
		n += int(it) * l.AuxSlots
	}
	return n
}

// Files creates the zeroed KV and aux files in dir.
func (l Layout) Files(t testing.TB, dir string) (kvPath, auxPath string) {
	t.Helper()
	kvPath, auxPath = filepath.Join(dir, "kv"), filepath.Join(dir, "aux")
	for path, n := range map[string]int{kvPath: l.KVLen(), auxPath: l.AuxLen()} {
		if err := os.WriteFile(path, make([]byte, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return kvPath, auxPath
}

// Registrations are the KV and aux registrations of memory whose backing
// (a file, a memfd, device memory) kvBase and auxBase name; each buffer is
// its base with its offset, length and item length.
func (l Layout) Registrations(kvBase, auxBase control.Region) (kv, aux *control.MemoryRegistration) {
	at := func(r control.Region, off, n, it uint64) control.Region {
		r.Offset, r.Length, r.ItemLen, r.Mem = off, n, it, nixl.DRAM
		return r
	}
	kv = &control.MemoryRegistration{Kind: control.KindKV}
	buf := uint64(l.Slots * l.Item)
	for b := range 2 * l.Layers {
		kv.Buffers = append(kv.Buffers, at(kvBase, uint64(b)*buf, buf, uint64(l.Item)))
	}
	aux = &control.MemoryRegistration{Kind: control.KindAux}
	off := uint64(0)
	for _, it := range l.AuxItems {
		aux.Buffers = append(aux.Buffers, at(auxBase, off, it*uint64(l.AuxSlots), it))
		off += it * uint64(l.AuxSlots)
	}
	return kv, aux
}

// FileRegistrations are Registrations of the files Files made.
func (l Layout) FileRegistrations(kvPath, auxPath string) (kv, aux *control.MemoryRegistration) {
	return l.Registrations(control.Region{Shm: kvPath}, control.Region{Shm: auxPath})
}

// AuxByte is byte k of aux buffer i for room r (the last buffer holds
// bootstrap_room instead, as a u64 in its first 8 bytes).
func AuxByte(r uint64, i, k int) byte { return byte(r) + byte(i)*13 + byte(k) + 1 }

// Prep writes room r's pages (page j of the request into prefill slot
// src[j]) and its aux row into aux slot auxSlot of the scheduler's kv and aux.
func (l Layout) Prep(kv, aux []byte, r uint64, src []int32, auxSlot int) {
	for j, slot := range src {
		for b := range 2 * l.Layers {
			page := kv[(b*l.Slots+int(slot))*l.Item : (b*l.Slots+int(slot)+1)*l.Item]
			for k := range page {
				page[k] = kvmem.Pattern(r, b, j, k)
			}
		}
	}
	off := 0
	for i, it := range l.AuxItems {
		row := aux[off+auxSlot*int(it) : off+(auxSlot+1)*int(it)]
		if i == len(l.AuxItems)-1 {
			clear(row)
			binary.LittleEndian.PutUint64(row, r)
		} else {
			for k := range row {
				row[k] = AuxByte(r, i, k)
			}
		}
		off += int(it) * l.AuxSlots
	}
}
