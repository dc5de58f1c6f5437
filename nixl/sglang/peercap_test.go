package sglang_test

import (
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// TestPeerDescsCap: a registration announcing a huge dst_num_slots is refused
// before kvxferd builds its descriptor list, with the reason; the largest
// allowed count is accepted and its list has exactly that many descriptors.
func TestPeerDescsCap(t *testing.T) {
	l := fakeLocal(4, 8, 256) // 32 local descriptors: the cap is the 2^20 floor
	if got := l.MaxPeerKVDescs(); got != sglang.PeerDescsFloor {
		t.Fatalf("cap %d", got)
	}
	geo := func(slots int) sglang.PeerGeometry {
		g := sglang.PeerGeometry{Agent: "dec", DstKVItemLen: 256, DstNumSlots: slots, GPU: 3,
			AuxPtrs: []uint64{0x900000, 0xa00000}}
		for b := range 4 {
			g.KVPtrs = append(g.KVPtrs, uint64(0x10+b)<<32)
		}
		return g
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, slots := range []int{sglang.PeerDescsFloor/4 + 1, 1 << 40, math.MaxInt64, -1} {
		_, err := sglang.NewPeer(l, geo(slots))
		if err == nil || !strings.Contains(err.Error(), "more descriptors than kvxferd prepares for one decode peer") {
			t.Fatalf("slots %d: %v", slots, err)
		}
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("refusing allocated %d bytes", grew)
	}
	p, err := sglang.NewPeer(l, geo(sglang.PeerDescsFloor/4))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(sglang.KVDstDescs(l, p)); n != sglang.PeerDescsFloor {
		t.Fatalf("%d descriptors", n)
	}
	// A larger local pool raises the cap to 16 × its own list.
	big := fakeLocal(4, 1<<17, 256) // 2^19 local descriptors
	if got := big.MaxPeerKVDescs(); got != 16<<19 {
		t.Fatalf("cap %d", got)
	}
	if _, err := sglang.NewPeer(big, geo(16<<17)); err != nil {
		t.Fatalf("16× the local slots: %v", err)
	}
	if _, err := sglang.NewPeer(big, geo(16<<17+1)); err == nil {
		t.Fatal("one slot over the cap accepted")
	}
}
