package sglang_test

import (
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// BenchmarkPlanStagedVsSlices plans one 64-page chunk of prefill rank 0 of
// TP 2 (4 of 8 KV heads, 256 B per head and token, page 16, 32 layers) for a
// decode of TP 1, through head slices into decode's pages (Plan) and into a
// staging region (Plan with Chunk.Staged), with scattered source pages.
// descs/op is the NIXL descriptors the write carries.
func BenchmarkPlanStagedVsSlices(b *testing.B) {
	const layers, page, headBytes, pages = 32, 16, 256, 64
	item := uint64(page * 4 * headBytes)
	l := &sglang.Local{Sender: 0, TPSize: 2, TPRank: 0, TotalKVHeads: 8, PageSize: page}
	l.KV = sglang.Buffers{NumSlots: 4096, Kind: nixl.VRAM, DevID: 1}
	for i := range 2 * layers {
		l.KV.Ptrs = append(l.KV.Ptrs, uint64(1+i)<<36)
		l.KV.ItemLens = append(l.KV.ItemLens, item)
	}
	l.Aux = sglang.Buffers{Ptrs: []uint64{0x100000}, ItemLens: []uint64{64}, NumSlots: 8}
	g := sglang.PeerGeometry{Agent: "dec", DstKVItemLen: 2 * item, DstNumSlots: 4096, TPSize: 1, GPU: 3,
		AuxPtrs: []uint64{0x900000}, StagingBase: 1 << 44, StagingSize: 1 << 30}
	for i := range 2 * layers {
		g.KVPtrs = append(g.KVPtrs, uint64(0x100+i)<<36)
	}
	p, err := sglang.NewPeer(l, g)
	if err != nil {
		b.Fatal(err)
	}
	src, dst := make([]int32, pages), make([]int32, pages)
	for i := range src {
		src[i], dst[i] = int32(7*i%4093), int32(11*i%4093)
	}
	for _, staged := range []bool{false, true} {
		name := "slices"
		c := &sglang.Chunk{Room: 1, ChunkID: 0, SrcPages: src, DstPages: dst}
		if staged {
			name, c.Staged = "staged", &sglang.StagedRegion{ChunkIdx: 0, PageStart: 0, Offset: 0}
		}
		b.Run(name, func(b *testing.B) {
			var plan sglang.Plan
			descs := 0
			for b.Loop() {
				if err := l.Plan(&plan, p, c); err != nil {
					b.Fatal(err)
				}
				descs = 0
				for i := range plan.Reqs {
					descs += len(plan.Reqs[i].Src)
				}
			}
			b.ReportMetric(float64(descs), "descs/op")
		})
	}
}
