package sglang_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// roomSpec is one test room: page counts per chunk (0 allowed only last).
type roomSpec struct {
	room   uint64
	chunks []int
	state  bool
}

// decodeSide is one decode rank as the prefill sees it, plus what it should hold.
type decodeSide struct {
	n        *node
	peer     *sglang.Peer
	list     nixl.ListID
	ck       *sglang.Checker
	nextPage int
	nextAux  int
	nextSt   int
	pages    map[int]int // dst page -> src page
	states   map[int]int // dst state slot -> src state slot
	aux      map[uint64][2]int
}

// TestEndToEnd: one prefill, two decode ranks with different slot counts, rooms
// of 1–8 chunks, state, aux, and prefix hits (empty last chunk → aux_nokv in
// both forms). Decode memory must hold exactly the expected bytes and decode's
// completion rule must say done for every room.
func TestEndToEnd(t *testing.T) {
	pre := newNode(t, "prefill", small, sglang.SenderID(0, 1, 0))
	fillKV(pre, small.Item)
	fillState(pre, small.StateItem)
	dshape := small
	dshape.Slots = 96 // decode's dst_num_slots differs from prefill's
	decs := []*decodeSide{
		{n: newNode(t, "decodeA", dshape, 0)},
		{n: newNode(t, "decodeB", small, 0)},
	}
	localList, err := sglang.PrepLocalKV(pre.ag, &pre.geo)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range decs {
		md, _ := d.n.ag.LocalMetadata()
		name, err := pre.ag.LoadPeer(md)
		if err != nil {
			t.Fatal(err)
		}
		if d.peer, err = sglang.NewPeer(&pre.geo, d.n.geo.AsPeer(name)); err != nil {
			t.Fatal(err)
		}
		if d.list, err = sglang.PrepPeerKV(pre.ag, &pre.geo, d.peer); err != nil {
			t.Fatal(err)
		}
		d.ck = sglang.NewChecker()
		d.pages, d.states, d.aux = map[int]int{}, map[int]int{}, map[uint64][2]int{}
	}
	rooms := []roomSpec{
		{room: 101, chunks: []int{3}},
		{room: 102, chunks: []int{2, 2}, state: true},
		{room: 103, chunks: []int{1, 4, 1}},
		{room: 104, chunks: []int{2, 1, 1, 3, 1}, state: true},
		{room: 105, chunks: []int{1, 1, 2, 1, 1, 2, 1, 1}},
		{room: 106, chunks: []int{0}, state: true}, // decode prefix covers everything
		{room: 107, chunks: []int{2, 1, 0}},        // earlier KV, then an empty last chunk
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pool := &xferPool{t: t, ag: pre.ag, local: localList}
	var plan sglang.Plan
	var roomIDs []uint64
	for _, rs := range rooms {
		roomIDs = append(roomIDs, rs.room)
		srcAux := int(rs.room) % small.AuxSlots
		writeAux(pre, srcAux, rs.room)
		// Room 107 needs the counted nokv form; the baseline form cannot
		// complete it (decode would expect 0 chunks but hold 2).
		pre.geo.NoKV = sglang.NoKVBaseline
		if rs.room == 107 {
			pre.geo.NoKV = sglang.NoKVWithCount
		}
		for _, d := range decs {
			d.ck.Expect(rs.room, 1, rs.state)
		}
		kvChunks := 0
		for ci, np := range rs.chunks {
			last := ci == len(rs.chunks)-1
			src := make([]int32, np)
			for i := range src {
				src[i] = int32(rng.IntN(small.Slots))
			}
			if np >= 3 { // a contiguous run, so merging is exercised
				src[1], src[2] = src[0]+1, src[0]+2
				if int(src[2]) >= small.Slots {
					src[0], src[1], src[2] = 0, 1, 2
				}
			}
			for _, d := range decs {
				dst := make([]int32, np)
				for i := range dst {
					dst[i] = int32(d.nextPage)
					d.pages[d.nextPage] = int(src[i])
					d.nextPage++
				}
				c := sglang.Chunk{Room: rs.room, ChunkID: ci, IsLast: last, SrcPages: src, DstPages: dst, NoKVChunks: kvChunks}
				if last {
					c.SrcAux, c.DstAux = srcAux, d.nextAux
					d.aux[rs.room] = [2]int{srcAux, d.nextAux}
					d.nextAux++
					if rs.state {
						ss, ds := []int32{int32(rs.room % 8), int32(rs.room%8) + 1, 20}, make([]int32, 3)
						for i := range ds {
							ds[i] = int32(d.nextSt)
							d.states[d.nextSt] = int(ss[i])
							d.nextSt++
						}
						c.SrcState, c.DstState = [][]int32{ss}, [][]int32{ds}
					}
				}
				if err := pre.geo.Plan(&plan, d.peer, &c); err != nil {
					t.Fatalf("room %d chunk %d: %v", rs.room, ci, err)
				}
				pool.submit(&plan, d.peer, d.list)
			}
			pool.drain()
			if np > 0 {
				kvChunks++
			}
		}
	}
	for _, d := range decs {
		waitDone(t, d.n.ag, d.ck, roomIDs)
		verifyDecode(t, pre, d)
	}
}

func verifyDecode(t *testing.T, pre *node, d *decodeSide) {
	t.Helper()
	item := small.Item
	for dp, sp := range d.pages {
		checkKVPage(t, d.n, dp, sp, item)
	}
	zero := make([]byte, item)
	for b, buf := range d.n.kv {
		for dp := 0; dp < len(buf)/item; dp++ {
			if _, used := d.pages[dp]; !used && !bytes.Equal(buf[dp*item:(dp+1)*item], zero) {
				t.Fatalf("%s buffer %d page %d was written but belongs to no room", d.n.ag.Name(), b, dp)
			}
		}
	}
	si := small.StateItem
	for ds, ss := range d.states {
		for b := range d.n.state {
			if !bytes.Equal(d.n.state[b][ds*si:(ds+1)*si], pre.state[b][ss*si:(ss+1)*si]) {
				t.Fatalf("%s state buffer %d slot %d != prefill slot %d", d.n.ag.Name(), b, ds, ss)
			}
		}
	}
	for room, slots := range d.aux {
		last := len(d.n.aux) - 1
		if err := sglang.CheckAuxRoom(d.n.aux[last], sglang.AuxRoomItemLen, slots[1], room); err != nil {
			t.Fatal(err)
		}
		for i := range d.n.aux {
			it := int(auxItems[i])
			if !bytes.Equal(d.n.aux[i][slots[1]*it:(slots[1]+1)*it], pre.aux[i][slots[0]*it:(slots[0]+1)*it]) {
				t.Fatalf("%s aux buffer %d slot %d differs from prefill slot %d", d.n.ag.Name(), i, slots[1], slots[0])
			}
		}
	}
}
