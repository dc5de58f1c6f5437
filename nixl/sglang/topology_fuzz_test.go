package sglang_test

import (
	"encoding/binary"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// FuzzNewPeer feeds decode registrations of any geometry (TP size and rank,
// buffer counts, item lengths, slot counts, kinds, layer ids) to NewPeer
// against prefill ranks of several topologies. It must never panic, and a
// peer it accepts must never be planned a write outside the decode's
// registered buffers: every head slice and whole page lands inside one.
func FuzzNewPeer(f *testing.F) {
	f.Add([]byte{1, 2, 0, 4, 8, 1, 0, 0, 2, 2, 0, 0, 0})
	f.Add([]byte{2, 1, 0, 4, 16, 2, 1, 1, 1, 4, 1, 1, 3})
	f.Add([]byte{1, 4, 3, 2, 8, 1, 0, 0, 0, 8, 0, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 13 {
			return
		}
		ptp, dtp, drank := int(b[0]%5)+1, int(b[1]%9), int(int8(b[2]))
		heads, bph := int(b[3]%9), uint64(b[4]%33)
		ppp, pprank, mla := int(b[5]%3)+1, int(b[6]%3), b[7]&1 == 1
		layers, page := int(b[8]%5)+1, int(b[9]%5)+1
		kinds, ids, extra := b[10], b[11], int(b[12]%4)
		l := &sglang.Local{Sender: 1, TPSize: ptp, TPRank: int(b[6]) % ptp, MLA: mla, TotalKVHeads: heads, PageSize: page,
			PPSize: ppp, StartLayer: pprank * layers}
		srcHeads := max(1, heads/ptp)
		item := uint64(page*srcHeads) * max(bph, 1)
		nbuf := 2 * layers
		if mla {
			nbuf = layers
		}
		l.KV = sglang.Buffers{NumSlots: 8, Kind: nixl.VRAM}
		for i := range nbuf {
			l.KV.Ptrs = append(l.KV.Ptrs, uint64(i+1)<<32)
			l.KV.ItemLens = append(l.KV.ItemLens, item)
			if ids&1 == 1 {
				l.KVLayerIDs = append(l.KVLayerIDs, l.StartLayer+i%layers)
			}
		}
		l.Aux = sglang.Buffers{Ptrs: []uint64{1 << 50}, ItemLens: []uint64{64}, NumSlots: 4}
		dn := nbuf*max(1, ppp*int(b[12]&1)) + extra
		g := sglang.PeerGeometry{Agent: "dec", TPSize: dtp, TPRank: drank, GPU: 1, AuxPtrs: []uint64{1 << 51}, DstNumSlots: 8 + extra,
			DstKVItemLen: uint64(len(b)%4+1) * max(bph, 1) * uint64(page)}
		var rest []byte
		if len(b) > 13 {
			rest = b[13:]
		}
		for i := range dn {
			g.KVPtrs = append(g.KVPtrs, uint64(0x100+i)<<32)
			it := g.DstKVItemLen
			if len(rest) >= 2 && i < len(rest)/2 {
				it = uint64(binary.LittleEndian.Uint16(rest[2*i:])) % 4096
			}
			g.KVItemLens = append(g.KVItemLens, it)
			k := nixl.VRAM
			if kinds>>(i%8)&1 == 1 {
				k = nixl.DRAM
			}
			g.KVKinds = append(g.KVKinds, k)
			if ids&2 == 2 {
				g.KVLayerIDs = append(g.KVLayerIDs, uint32(i%max(1, dn/2)))
			}
		}
		p, err := sglang.NewPeer(l, g)
		if err != nil {
			return
		}
		inside := func(d nixl.Desc) bool {
			for i, ptr := range g.KVPtrs {
				end := ptr + g.KVItemLens[i]*uint64(g.DstNumSlots)
				if uint64(d.Addr) >= ptr && uint64(d.Addr)+d.Len <= end {
					return true
				}
			}
			return false
		}
		var plan sglang.Plan
		c := sglang.Chunk{Room: 1, IsLast: true, SrcPages: []int32{0, 7, 3}, DstPages: []int32{int32(7 + extra), 0, 2}, SrcAux: 1, DstAux: 2}
		if err := l.Plan(&plan, p, &c); err != nil {
			return
		}
		local := func(d nixl.Desc) bool {
			for i, ptr := range l.KV.Ptrs {
				if uint64(d.Addr) >= ptr && uint64(d.Addr)+d.Len <= ptr+l.KV.ItemLens[i]*uint64(l.KV.NumSlots) {
					return true
				}
			}
			return false
		}
		for _, r := range plan.Reqs {
			if r.Kind != sglang.ReqSlice {
				continue
			}
			for i, d := range r.Dst {
				if !inside(d) {
					t.Fatalf("head slice %+v outside every decode buffer (geometry %+v)", d, g)
				}
				if !local(r.Src[i]) || r.Src[i].Len != d.Len {
					t.Fatalf("head slice source %+v outside the prefill buffers or of another length than %+v", r.Src[i], d)
				}
			}
		}
		if _, sliced := p.Slice(); sliced {
			return
		}
		for i := range p.Parts() {
			for _, d := range sglang.KVDstSegDescs(l, p, i) {
				if !inside(d) {
					t.Fatalf("page descriptor %+v outside every decode buffer", d)
				}
			}
		}
	})
}
