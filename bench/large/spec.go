package large

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// Geometry is one model's KV layout on one prefill rank and the size of its
// rooms: 2·Layers buffers (K of every layer, then V, SGLang's order), pages
// of PageTokens tokens of TokenBytes each per buffer, RoomPages pages a
// room. Pages are handed out in blocks of Run consecutive slots, on each side
// independently (a pool some way from fresh: runs of Run pages, in no order).
type Geometry struct {
	Name       string `json:"name"`
	Layers     int    `json:"layers"`
	PageTokens int    `json:"page_tokens"`
	TokenBytes int    `json:"token_bytes"`
	RoomPages  int    `json:"room_pages"`
	Run        int    `json:"run"`
}

// Bufs is the number of KV buffers (K and V of every layer).
func (g Geometry) Bufs() int { return 2 * g.Layers }

// PageBytes is one page of one buffer.
func (g Geometry) PageBytes() int { return g.PageTokens * g.TokenBytes }

// RoomBytes is the KV of one room.
func (g Geometry) RoomBytes() int { return g.Bufs() * g.RoomPages * g.PageBytes() }

// Slots is the pool's slot count for n rooms in flight: every room's pages,
// rounded up to whole blocks.
func (g Geometry) Slots(n int) int {
	blocks := (g.RoomPages + g.Run - 1) / g.Run
	return n * blocks * g.Run
}

func (g Geometry) String() string {
	return fmt.Sprintf("%s: %d layers × K,V, %d-token pages of %d B/token, %d pages (%s) a room, runs of %d",
		g.Name, g.Layers, g.PageTokens, g.TokenBytes, g.RoomPages, mib(g.RoomBytes()), g.Run)
}

func mib(n int) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// Pages hands n rooms their prefill and decode pages over pools of slots
// slots: each side's blocks of Run slots shuffled (seeded), room r taking the
// next blocks in that order and, within a block, consecutive slots.
func Pages(g Geometry, n, slots int, seed uint64) (src, dst [][]int32) {
	rng := rand.New(rand.NewPCG(seed, 0x1a46e))
	side := func() [][]int32 {
		perm := rng.Perm(slots / g.Run)
		out := make([][]int32, n)
		k := 0
		for r := range out {
			for len(out[r]) < g.RoomPages {
				b := perm[k]
				k++
				for s := 0; s < g.Run && len(out[r]) < g.RoomPages; s++ {
					out[r] = append(out[r], int32(b*g.Run+s))
				}
			}
		}
		return out
	}
	return side(), side()
}

// Room is one room's transfer in every form the engines post: the merged
// pairs (kvxfer, NIXL Python on the same list, memcpy), as offsets into the
// two slabs, and SGLang's per-page indices into the prepared lists.
type Room struct {
	Src, Dst []nixl.Desc // merged; Addr is an offset into the slab
	SrcIdx   []int32     // SGLang's prepared-path indices (buffer·slots + page)
	DstIdx   []int32
}

// Bytes is what the room moves.
func (r *Room) Bytes() (n uint64) {
	for _, d := range r.Src {
		n += d.Len
	}
	return n
}

// Geometries returns SGLang geometries of g over the two slabs (every
// buffer a contiguous NumSlots·PageBytes part, back to back), the local one
// and a decode peer with the same shape.
func Geometries(g Geometry, slots int, srcBase, dstBase uint64) (*sglang.Local, *sglang.Peer, error) {
	per := uint64(slots * g.PageBytes())
	l := &sglang.Local{KV: sglang.Buffers{NumSlots: slots, Kind: nixl.DRAM}}
	pg := sglang.PeerGeometry{Agent: "decode", DstKVItemLen: uint64(g.PageBytes()), DstNumSlots: slots, AuxPtrs: []uint64{1}}
	for b := range g.Bufs() {
		l.KV.Ptrs = append(l.KV.Ptrs, srcBase+uint64(b)*per)
		l.KV.ItemLens = append(l.KV.ItemLens, uint64(g.PageBytes()))
		pg.KVPtrs = append(pg.KVPtrs, dstBase+uint64(b)*per)
		pg.KVKinds = append(pg.KVKinds, nixl.DRAM)
	}
	// Aux is needed only by a last chunk, which this benchmark does not plan.
	l.Aux = sglang.Buffers{Ptrs: []uint64{1}, ItemLens: []uint64{8}, NumSlots: 1}
	if err := l.Validate(); err != nil {
		return nil, nil, err
	}
	p, err := sglang.NewPeer(l, pg)
	return l, p, err
}

// Rooms builds every room's lists: SGLang's plan for the chunk (one KV
// request over the prepared lists: its indices) and kvxfer's merged
// descriptors (sglang.MergedKV within the per-buffer regions), with addresses
// made offsets into the slabs.
func Rooms(g Geometry, slots int, src, dst [][]int32) ([]Room, error) {
	const sb, db = 1 << 40, 2 << 40 // made-up bases: only offsets leave here
	l, p, err := Geometries(g, slots, sb, db)
	if err != nil {
		return nil, err
	}
	sr, dr := sglang.KVRegions(l, p, 0)
	rooms := make([]Room, len(src))
	var plan sglang.Plan
	for i := range rooms {
		r := &rooms[i]
		if err := l.Plan(&plan, p, &sglang.Chunk{Room: uint64(i), SrcPages: src[i], DstPages: dst[i]}); err != nil {
			return nil, err
		}
		if len(plan.Reqs) != 1 || plan.Reqs[0].Kind != sglang.ReqKV {
			return nil, fmt.Errorf("large: plan of room %d is %d requests", i, len(plan.Reqs))
		}
		r.SrcIdx = append([]int32(nil), plan.Reqs[0].SrcIdx...)
		r.DstIdx = append([]int32(nil), plan.Reqs[0].DstIdx...)
		r.Src, r.Dst = sglang.MergedKV(nil, nil, l, p, 0, src[i], dst[i], sr, dr)
		for k := range r.Src {
			r.Src[k].Addr -= sb
			r.Dst[k].Addr -= db
		}
	}
	return rooms, nil
}
