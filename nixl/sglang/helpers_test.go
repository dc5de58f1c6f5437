package sglang_test

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// shape is an SGLang-like geometry for tests.
type shape struct {
	Layers     int // KV buffers = 2*Layers (K then V)
	Slots      int
	Item       int
	AuxSlots   int
	StateSlots int
	StateItem  int
}

var small = shape{Layers: 4, Slots: 64, Item: 4096, AuxSlots: 16, StateSlots: 32, StateItem: 1024}

// auxItems are SGLang's aux buffer item sizes, a short version of the real list;
// the last one is bootstrap_room (u64×8).
var auxItems = []uint64{16 * 4, 16 * 4, 16 * 4, 128 * 4, sglang.AuxRoomItemLen}

// node is one agent with its registered SGLang geometry and the bytes behind it.
type node struct {
	ag    *loopback.Agent
	geo   sglang.Local
	kv    [][]byte
	aux   [][]byte
	state [][]byte
}

var nodeSeq atomic.Int64

func newNode(t testing.TB, name string, sh shape, sender int) *node {
	t.Helper()
	ag, err := loopback.New(fmt.Sprintf("%s-%d", name, nodeSeq.Add(1)), loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ag.Close() })
	n := &node{ag: ag}
	alloc := func(size int) ([]byte, uint64) {
		b, err := ag.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		return b, uint64(nixl.DescOf(b, 0).Addr)
	}
	n.geo = sglang.Local{Sender: sender}
	n.geo.KV = sglang.Buffers{NumSlots: sh.Slots, Kind: nixl.VRAM, DevID: 0}
	for range 2 * sh.Layers {
		b, p := alloc(sh.Slots * sh.Item)
		n.kv = append(n.kv, b)
		n.geo.KV.Ptrs = append(n.geo.KV.Ptrs, p)
		n.geo.KV.ItemLens = append(n.geo.KV.ItemLens, uint64(sh.Item))
	}
	n.geo.Aux = sglang.Buffers{NumSlots: sh.AuxSlots, Kind: nixl.DRAM}
	for _, it := range auxItems {
		b, p := alloc(sh.AuxSlots * int(it))
		n.aux = append(n.aux, b)
		n.geo.Aux.Ptrs = append(n.geo.Aux.Ptrs, p)
		n.geo.Aux.ItemLens = append(n.geo.Aux.ItemLens, it)
	}
	if sh.StateSlots > 0 {
		st := sglang.Buffers{NumSlots: sh.StateSlots, Kind: nixl.VRAM}
		for range 2 {
			b, p := alloc(sh.StateSlots * sh.StateItem)
			n.state = append(n.state, b)
			st.Ptrs = append(st.Ptrs, p)
			st.ItemLens = append(st.ItemLens, uint64(sh.StateItem))
		}
		n.geo.State = []sglang.Buffers{st}
	}
	if err := n.geo.Validate(); err != nil {
		t.Fatal(err)
	}
	sets := []*sglang.Buffers{&n.geo.KV, &n.geo.Aux}
	for i := range n.geo.State {
		sets = append(sets, &n.geo.State[i])
	}
	if _, err := sglang.RegisterBuffers(ag, sets...); err != nil {
		t.Fatal(err)
	}
	return n
}

// pattern is the byte at offset k of slot s of buffer b on the prefill side.
func pattern(b, s, k int) byte { return byte(b*37 + s*11 + k*3 + 1) }

func fillKV(n *node, item int) {
	for b, buf := range n.kv {
		for s := 0; s < len(buf)/item; s++ {
			for k := range item {
				buf[s*item+k] = pattern(b, s, k)
			}
		}
	}
}

func fillState(n *node, item int) {
	for b, buf := range n.state {
		for s := 0; s < len(buf)/item; s++ {
			for k := range item {
				buf[s*item+k] = pattern(b+100, s, k)
			}
		}
	}
}

// writeAux writes the prefill aux slot for a room: every buffer gets a
// room-derived pattern and the last one the room itself (what set_buf does).
func writeAux(n *node, slot int, room uint64) {
	for i, buf := range n.aux {
		it := int(auxItems[i])
		item := buf[slot*it : (slot+1)*it]
		for k := range item {
			item[k] = byte(room) + byte(i) + byte(k)
		}
	}
	last := n.aux[len(n.aux)-1]
	binary.LittleEndian.PutUint64(last[slot*sglang.AuxRoomItemLen:], room)
}

// checkKVPage verifies that decode page d of every buffer holds prefill page s.
func checkKVPage(t testing.TB, dec *node, d, s, item int) {
	t.Helper()
	for b, buf := range dec.kv {
		got := buf[d*item : (d+1)*item]
		for k := range got {
			if got[k] != pattern(b, s, k) {
				t.Fatalf("%s buffer %d page %d byte %d = %d, want prefill page %d (%d)", dec.ag.Name(), b, d, k, got[k], s, pattern(b, s, k))
			}
		}
	}
}

// xferPool is the smallest transfer pool: make and post every request of a
// plan, poll them in one batch until terminal, release them.
type xferPool struct {
	t     testing.TB
	ag    nixl.Agent
	local nixl.ListID
	ids   []nixl.XferID
	st    []nixl.Status
}

func (p *xferPool) submit(plan *sglang.Plan, peer *sglang.Peer, peerList nixl.ListID) {
	p.t.Helper()
	for i := range plan.Reqs {
		x, err := sglang.MakeReq(p.ag, p.local, peerList, peer.Agent, &plan.Reqs[i])
		if err != nil {
			p.t.Fatalf("MakeReq %v: %v", plan.Reqs[i].Kind, err)
		}
		if _, err := p.ag.Post(x); err != nil {
			p.t.Fatalf("Post: %v", err)
		}
		p.ids = append(p.ids, x)
	}
}

func (p *xferPool) drain() {
	p.t.Helper()
	p.st = append(p.st[:0], make([]nixl.Status, len(p.ids))...)
	deadline := time.Now().Add(20 * time.Second)
	for spin := 0; ; spin++ {
		if err := p.ag.Poll(p.ids, p.st); err != nil {
			p.t.Fatal(err)
		}
		busy := 0
		for i, s := range p.st {
			switch s.State {
			case nixl.InProgress:
				busy++
			case nixl.Failed:
				p.t.Fatalf("request %d failed: %v", p.ids[i], s.Err)
			}
		}
		if busy == 0 {
			break
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%d requests still in flight", busy)
		}
		if spin > 100 {
			time.Sleep(50 * time.Microsecond)
		} else {
			runtime.Gosched()
		}
	}
	for _, x := range p.ids {
		if err := p.ag.Release(x); err != nil {
			p.t.Fatal(err)
		}
	}
	p.ids = p.ids[:0]
}

// waitDone drains an agent's notifications into a checker until every room is done.
func waitDone(t testing.TB, ag nixl.Agent, ck *sglang.Checker, rooms []uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var buf []nixl.Notif
	for spin := 0; ; spin++ {
		buf, _ = ag.Notifs(buf[:0])
		for _, n := range buf {
			if _, err := ck.Feed(n.Msg); err != nil {
				t.Fatalf("%s: %v", ag.Name(), err)
			}
		}
		done := 0
		for _, r := range rooms {
			if ck.Done(r) {
				done++
			}
		}
		if done == len(rooms) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d rooms done", ag.Name(), done, len(rooms))
		}
		if spin > 100 {
			time.Sleep(50 * time.Microsecond)
		} else {
			runtime.Gosched()
		}
	}
}
