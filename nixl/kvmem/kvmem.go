package kvmem

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// Shape is a rank's memory layout.
type Shape struct {
	Layers     int      // KV buffers = 2*Layers (K of every layer, then V)
	Slots      int      // pages per KV buffer
	Item       int      // bytes of one page of one layer buffer
	AuxSlots   int      // metadata buffer slots
	AuxItems   []uint64 // aux item sizes in SGLang order; the last is bootstrap_room
	StateSlots int      // 0: no hybrid state
	StateItem  int
	StateBufs  int
	// Topo places the pool in the model (nil: layers from 0, K and V, and
	// patterns keyed by buffer and byte). With it, pages hold a pattern of
	// each byte's logical coordinates, so ranks of different TP sizes or PP
	// stages check what they hold without knowing each other's layout.
	Topo *Topo
}

// Topo is a rank's place in the model: the layers and KV heads its pool
// holds and how a page lays them out (SGLang's: token-major, then head).
type Topo struct {
	MLA        bool  // one buffer per layer (Layers buffers), no heads
	StartLayer int   // model layer of the first buffer (PP stage)
	Heads      []int // global KV heads held, in order (MHA)
	HeadBytes  int   // bytes per head per token (MLA: per token)
	PageTokens int   // tokens per page (0: 1)
	// VRAM labels the KV buffers VRAM (loopback: host memory with the label),
	// which SGLang's prefill needs for heterogeneous-TP MHA destinations.
	VRAM bool
	// HostV puts the V buffers (MHA) in DRAM and the K buffers in VRAM: a
	// HiSparse-like pool of mixed memory kinds, which SGLang's prefill
	// writes in one part per run of equal kinds ("_part_i_n").
	HostV bool
}

// kinds is the memory kind of every KV buffer.
func (n *Node) kinds() []nixl.MemKind {
	out := make([]nixl.MemKind, len(n.Geo.KV.Ptrs))
	for b := range out {
		out[b] = n.Geo.KV.Kind
		if t := n.Shape.Topo; t != nil && t.HostV && !t.MLA && b >= n.Shape.Layers {
			out[b] = nixl.DRAM
		}
	}
	return out
}

// ItemLen is the page size in bytes the topology implies.
func (t *Topo) ItemLen() int {
	h := len(t.Heads)
	if t.MLA {
		h = 1
	}
	return max(t.PageTokens, 1) * h * t.HeadBytes
}

// Buffers is the number of KV buffers a shape registers.
func (sh Shape) Buffers() int {
	if sh.Topo != nil && sh.Topo.MLA {
		return sh.Layers
	}
	return 2 * sh.Layers
}

// BufLayer is the model layer of KV buffer b and whether it is V (MHA).
func (sh Shape) BufLayer(b int) (layer int, v bool) {
	start := 0
	if sh.Topo != nil {
		start = sh.Topo.StartLayer
	}
	if sh.Topo != nil && sh.Topo.MLA {
		return start + b, false
	}
	return start + b%max(sh.Layers, 1), b >= sh.Layers
}

// LogicalPattern is the byte of room r at model layer, K (v false) or V,
// request page j, token tok, global KV head g and byte x within the head.
func LogicalPattern(r uint64, layer int, v bool, j, tok, g, x int) byte {
	kv := 0
	if v {
		kv = 1
	}
	return byte(int(r%241)*11 + layer*31 + kv*17 + j*13 + tok*5 + g*29 + x*3 + 1)
}

// want is the byte at offset k of request page j of buffer b.
func (n *Node) want(r uint64, b, j, k int) byte {
	t := n.Shape.Topo
	if t == nil {
		return Pattern(r, b, j, k)
	}
	heads := t.Heads
	if t.MLA {
		heads = []int{0}
	}
	tokBytes := len(heads) * t.HeadBytes
	tok, in := k/tokBytes, k%tokBytes
	layer, v := n.Shape.BufLayer(b)
	return LogicalPattern(r, layer, v, j, tok, heads[in/t.HeadBytes], in%t.HeadBytes)
}

// WrongBytesAt counts the bytes of decode page dst that do not hold the
// room's j-th page.
func (n *Node) WrongBytesAt(r uint64, dst, j int) int {
	it, bad := n.Shape.Item, 0
	for b, buf := range n.KV {
		if n.Shape.Topo == nil && PatternMatches(buf[dst*it:(dst+1)*it], r, b, j) {
			continue
		}
		for k, got := range buf[dst*it : (dst+1)*it] {
			if got != n.want(r, b, j, k) {
				bad++
			}
		}
	}
	return bad
}

// DefaultShape is small enough for tests and demos and shaped like SGLang's.
func DefaultShape() Shape {
	return Shape{
		Layers: 4, Slots: 256, Item: 4096, AuxSlots: 64,
		AuxItems: []uint64{16 * 4, 16 * 4, 16 * 4, 16 * 4, 128 * 4, 128 * 4, sglang.AuxRoomItemLen},
	}
}

// Allocator is a NIXL agent that allocates registrable host memory: the
// loopback agent (shared memory) or libnixl's (anonymous mappings).
type Allocator interface {
	nixl.Agent
	Alloc(n int) ([]byte, error)
}

// Node is one agent with its registered geometry and the bytes behind it.
type Node struct {
	// Agent is the loopback agent (nil for a node made by NewOn with another
	// backend); NIXL is the node's agent whatever its backend.
	Agent *loopback.Agent
	NIXL  Allocator
	Geo   sglang.Local
	Shape Shape
	KV    [][]byte
	Aux   [][]byte
	State [][]byte
}

// New creates a loopback agent named name and allocates and registers sh.
func New(name string, sh Shape, sender int, opts loopback.Options) (*Node, error) {
	ag, err := loopback.New(name, opts)
	if err != nil {
		return nil, err
	}
	n := &Node{Agent: ag, NIXL: ag, Shape: sh}
	if err := n.alloc(sender); err != nil {
		ag.Close()
		return nil, err
	}
	return n, nil
}

// NewOn allocates and registers sh with an agent of any backend (the real
// NIXL library for a decode on another host). The node owns the agent: Close
// closes it.
func NewOn(a Allocator, sh Shape, sender int) (*Node, error) {
	n := &Node{NIXL: a, Shape: sh}
	if la, ok := a.(*loopback.Agent); ok {
		n.Agent = la
	}
	if err := n.alloc(sender); err != nil {
		a.Close()
		return nil, err
	}
	return n, nil
}

func (n *Node) alloc(sender int) error {
	sh := n.Shape
	var err error
	buf := func(size int) (b []byte, ptr uint64) {
		if err != nil {
			return nil, 0
		}
		b, err = n.NIXL.Alloc(size)
		if err != nil {
			return nil, 0
		}
		return b, uint64(nixl.DescOf(b, 0).Addr)
	}
	kind := nixl.DRAM
	if t := sh.Topo; t != nil {
		if t.ItemLen() != sh.Item || t.HeadBytes <= 0 || (!t.MLA && len(t.Heads) == 0) {
			return fmt.Errorf("kvmem: topology %+v implies %d-byte pages, shape says %d", *t, t.ItemLen(), sh.Item)
		}
		if t.VRAM {
			kind = nixl.VRAM
		}
	}
	n.Geo = sglang.Local{Sender: sender, KV: sglang.Buffers{NumSlots: sh.Slots, Kind: kind}}
	for range sh.Buffers() {
		b, p := buf(sh.Slots * sh.Item)
		n.KV = append(n.KV, b)
		n.Geo.KV.Ptrs = append(n.Geo.KV.Ptrs, p)
		n.Geo.KV.ItemLens = append(n.Geo.KV.ItemLens, uint64(sh.Item))
	}
	n.Geo.Aux = sglang.Buffers{NumSlots: sh.AuxSlots, Kind: nixl.DRAM}
	for _, it := range sh.AuxItems {
		b, p := buf(sh.AuxSlots * int(it))
		n.Aux = append(n.Aux, b)
		n.Geo.Aux.Ptrs = append(n.Geo.Aux.Ptrs, p)
		n.Geo.Aux.ItemLens = append(n.Geo.Aux.ItemLens, it)
	}
	if sh.StateSlots > 0 {
		st := sglang.Buffers{NumSlots: sh.StateSlots, Kind: nixl.DRAM}
		for range max(sh.StateBufs, 1) {
			b, p := buf(sh.StateSlots * sh.StateItem)
			n.State = append(n.State, b)
			st.Ptrs = append(st.Ptrs, p)
			st.ItemLens = append(st.ItemLens, uint64(sh.StateItem))
		}
		n.Geo.State = []sglang.Buffers{st}
	}
	if err != nil {
		return fmt.Errorf("kvmem: allocating %s: %w", n.NIXL.Name(), err)
	}
	if err := n.Geo.Validate(); err != nil {
		return err
	}
	sets := []*sglang.Buffers{&n.Geo.KV, &n.Geo.Aux}
	if t := sh.Topo; t != nil && t.HostV && !t.MLA {
		// One registration per memory kind, as SGLang's register_buffer_to_engine.
		kv := n.Geo.KV
		k, v := kv, kv
		k.Ptrs, k.ItemLens = kv.Ptrs[:sh.Layers], kv.ItemLens[:sh.Layers]
		v.Ptrs, v.ItemLens, v.Kind, v.DevID = kv.Ptrs[sh.Layers:], kv.ItemLens[sh.Layers:], nixl.DRAM, 0
		sets = []*sglang.Buffers{&k, &v, &n.Geo.Aux}
	}
	for i := range n.Geo.State {
		sets = append(sets, &n.Geo.State[i])
	}
	_, err = sglang.RegisterBuffers(n.NIXL, sets...)
	return err
}

// LayerIDs is the model layer of every KV buffer (SGLang's kv_layer_ids for
// a pool that reports them: K ids then V ids for MHA).
func (n *Node) LayerIDs() []int {
	out := make([]int, len(n.KV))
	for b := range out {
		out[b], _ = n.Shape.BufLayer(b)
	}
	return out
}

// Close closes the agent and unmaps its memory.
func (n *Node) Close() error { return n.NIXL.Close() }

// Peer is the geometry a decode node announces in its registration frame.
func (n *Node) Peer() sglang.PeerGeometry {
	g := n.Geo.AsPeer(n.NIXL.Name())
	g.KVKinds = n.kinds()
	return g
}

// Pattern is the byte a prefill node holds at offset k of page slot of buffer b
// for room r: decode checks every received byte against it.
func Pattern(r uint64, b, slot, k int) byte { return byte(int(r%251)*7 + b*37 + slot*11 + k*3 + 1) }

// patternTab[i] is byte(3i). Pattern(r, b, slot, k) is byte(c + 3k) with
// c = Pattern(r, b, slot, 0), and 3 is invertible mod 256 (3·171 = 513), so
// the row is patternTab[k0+k mod 256] with k0 = 171c mod 256: a 256-byte
// period that copy and bytes.Equal move at memory speed.
var patternTab = func() (t [512]byte) {
	for i := range t {
		t[i] = byte(3 * i)
	}
	return t
}()

// patternPeriod is the first 256 bytes of the row of (r, b, slot).
func patternPeriod(r uint64, b, slot int) []byte {
	k0 := int(Pattern(r, b, slot, 0)) * 171 & 255
	return patternTab[k0 : k0+256]
}

// PatternRow writes Pattern(r, b, slot, k) into dst[k] for every k.
func PatternRow(dst []byte, r uint64, b, slot int) {
	per := patternPeriod(r, b, slot)
	for len(dst) > 0 {
		dst = dst[copy(dst, per):]
	}
}

// PatternMatches reports whether page[k] == Pattern(r, b, slot, k) for every k.
func PatternMatches(page []byte, r uint64, b, slot int) bool {
	per := patternPeriod(r, b, slot)
	for len(page) > 0 {
		m := min(len(page), len(per))
		if !bytes.Equal(page[:m], per[:m]) {
			return false
		}
		page = page[m:]
	}
	return true
}

// FillPage writes room r's pattern into page slot of every KV buffer, keyed by
// the slot itself.
func (n *Node) FillPage(r uint64, slot int) { n.FillPageAt(r, slot, slot) }

// FillPageAt writes into page slot the pattern of the room's j-th page. Keying
// by the page's position in the request (not by the prefill slot) lets a decode
// in another process check bytes without knowing prefill's page numbers.
func (n *Node) FillPageAt(r uint64, slot, j int) {
	it := n.Shape.Item
	for b, buf := range n.KV {
		page := buf[slot*it : (slot+1)*it]
		if n.Shape.Topo == nil {
			PatternRow(page, r, b, j)
			continue
		}
		for k := range page {
			page[k] = n.want(r, b, j, k)
		}
	}
}

// CheckPage verifies that decode page dst holds prefill page src of room r
// (filled with FillPage).
func (n *Node) CheckPage(r uint64, dst, src int) error { return n.CheckPageAt(r, dst, src) }

// CheckPageAt verifies that decode page dst holds the room's j-th page
// (filled with FillPageAt).
func (n *Node) CheckPageAt(r uint64, dst, j int) error {
	it := n.Shape.Item
	for b, buf := range n.KV {
		page := buf[dst*it : (dst+1)*it]
		if n.Shape.Topo == nil && PatternMatches(page, r, b, j) {
			continue
		}
		for k, got := range page {
			if want := n.want(r, b, j, k); got != want {
				return fmt.Errorf("room %d: decode buffer %d page %d byte %d is %d, want %d (request page %d)", r, b, dst, k, got, want, j)
			}
		}
	}
	return nil
}

// WriteAux fills the aux slot of room r as the scheduler's set_buf would: a
// room-derived pattern, and the room itself in the bootstrap_room buffer.
func (n *Node) WriteAux(slot int, r uint64) {
	for i, buf := range n.Aux {
		it := int(n.Shape.AuxItems[i])
		item := buf[slot*it : (slot+1)*it]
		for k := range item {
			item[k] = byte(r) + byte(i) + byte(k)
		}
	}
	last := n.Aux[len(n.Aux)-1]
	binary.LittleEndian.PutUint64(last[slot*sglang.AuxRoomItemLen:], r)
}

// CheckAux verifies decode aux slot for room r (including the room check decode
// itself makes before committing a request).
func (n *Node) CheckAux(slot int, r uint64) error {
	last := n.Aux[len(n.Aux)-1]
	if err := sglang.CheckAuxRoom(last, sglang.AuxRoomItemLen, slot, r); err != nil {
		return err
	}
	for i := 0; i < len(n.Aux)-1; i++ {
		it := int(n.Shape.AuxItems[i])
		item := n.Aux[i][slot*it : (slot+1)*it]
		for k, got := range item {
			if want := byte(r) + byte(i) + byte(k); got != want {
				return fmt.Errorf("room %d: aux buffer %d slot %d byte %d is %d, want %d", r, i, slot, k, got, want)
			}
		}
	}
	return nil
}

// ZeroPages clears the given pages in every KV buffer (decode reusing them).
func (n *Node) ZeroPages(slots []int32) {
	it := n.Shape.Item
	for _, buf := range n.KV {
		for _, s := range slots {
			clear(buf[int(s)*it : (int(s)+1)*it])
		}
	}
}

// PagesZero reports whether the given pages are all zero in every KV buffer.
func (n *Node) PagesZero(slots []int32) bool {
	it := n.Shape.Item
	for _, buf := range n.KV {
		for _, s := range slots {
			for _, b := range buf[int(s)*it : (int(s)+1)*it] {
				if b != 0 {
					return false
				}
			}
		}
	}
	return true
}
