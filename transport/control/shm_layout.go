package control

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/kvxfer/kvxfer/kv"
)

// The shared-memory control path (docs/control-api.md, "Shared-memory path").
//
// One region per client, created by kvxferd on shm_attach (a request/reply op)
// as a 0600 file in the control directory, mapped by both sides:
//
//	[0, 4096)             header: geometry, then the ring indices and the doorbell, one cache line each
//	[ringOff, +entries*32) submission ring: fixed 32-byte records, single producer (the client), single consumer (kvxferd)
//	[indexOff, +words*4)   index area: page and state index arrays of send records (int32, little-endian)
//	[tableOff, +slots*32)  status table: one 32-byte slot per room the client has open
//
// Every field is little-endian; kvxferd refuses to run the path on a
// big-endian host. Offsets below are bytes from the start of the region.
const (
	shmMagic   = 0x31474e4952585642 // "BVXRING1" little-endian: 'B','V','X','R','I','N','G','1'
	shmVersion = 1

	shmHeaderSize = 4096
	// RecordSize is the size of one ring record; SlotSize of one status slot.
	RecordSize = 32
	SlotSize   = 32

	// Header fields (uint64 unless noted).
	hdrMagic    = 0
	hdrVersion  = 8  // uint32 version, uint32 record size
	hdrEntries  = 16 // uint32 ring entries (a power of two), uint32 slots
	hdrWords    = 24 // uint32 index words (a power of two), uint32 slot size
	hdrRingOff  = 32
	hdrIndexOff = 40
	hdrTableOff = 48
	hdrTail     = 64  // client: records published (monotonic)
	hdrIdxTail  = 72  // client: index words claimed (monotonic; informative)
	hdrHead     = 128 // kvxferd: records consumed (monotonic)
	hdrIdxHead  = 136 // kvxferd: index words released (monotonic)
	hdrSleeping = 192 // uint32 futex word: 1 while kvxferd sleeps on the doorbell
	hdrDropped  = 256 // uint32: non-zero once kvxferd dropped this client (a DropCode)
	hdrWakeups  = 264 // kvxferd: doorbell wake-ups taken (informative)
	hdrFullWait = 320 // client: times it waited for room in a full ring or index area (informative, client-reported)
)

// Record ops.
const (
	RecOpen  = 1 // slot, room, a = generation (uint32); with a traceparent: flags = its index words, b = index position
	RecInit  = 2 // room, a = num_pages, b = aux_index (int64)
	RecSend  = 3 // room, a = index position (monotonic, in int32 words), b = words
	RecAbort = 4 // room
	RecClear = 5 // slot, room
)

// MaxTraceparent caps the bytes of a traceparent an open record carries in
// the index area (a W3C version-00 value has 55; later versions may append
// fields).
const MaxTraceparent = 256

// DropCode says why kvxferd dropped a client (header hdrDropped).
const (
	DropNone     = 0
	DropGarbage  = 1 // a record that does not decode: the stream cannot be trusted
	DropDetached = 2 // the client detached, or the server stopped
	DropDead     = 3 // the client's process exited
)

// ReasonClientLost is the reason of rooms failed because their client was
// dropped (crashed, detached or sent garbage): kv.ReasonClientLost, in the
// table and in the engine alike.
const ReasonClientLost = uint8(kv.ReasonClientLost)

// Slot layout.
const (
	slotSeq    = 0  // even: stable; odd: a write is in progress
	slotRoom   = 8  // the room bound to the slot
	slotWord   = 16 // gen (uint32) | status<<32 | reason<<40 | written<<48
	slotPrefix = 24 // decode_prefix_len (int64)

	slotWritten = 1 << 48
)

// Limits on what shm_attach may ask for (outside input caps what it creates).
const (
	MaxRingEntries = 1 << 16
	MaxSlots       = 1 << 20
	MaxIndexWords  = 1 << 24

	DefaultRingEntries = 4096
	DefaultSlots       = 16384
	DefaultIndexWords  = 1 << 20
)

// shmGeometry is a region's shape.
type shmGeometry struct {
	entries, slots, words uint32
}

func (g shmGeometry) validate() *Error {
	pow2 := func(v uint32) bool { return v != 0 && v&(v-1) == 0 }
	switch {
	case !pow2(g.entries) || g.entries > MaxRingEntries:
		return errorf(CodeBadRequest, "ring_entries %d: a power of two up to %d", g.entries, MaxRingEntries)
	case g.slots == 0 || g.slots > MaxSlots:
		return errorf(CodeBadRequest, "slots %d out of range [1, %d]", g.slots, MaxSlots)
	case !pow2(g.words) || g.words > MaxIndexWords:
		return errorf(CodeBadRequest, "index_words %d: a power of two up to %d", g.words, MaxIndexWords)
	}
	return nil
}

func (g shmGeometry) ringOff() int  { return shmHeaderSize }
func (g shmGeometry) indexOff() int { return g.ringOff() + int(g.entries)*RecordSize }
func (g shmGeometry) tableOff() int { return align(g.indexOff()+int(g.words)*4, 64) }
func (g shmGeometry) size() int     { return align(g.tableOff()+int(g.slots)*SlotSize, 4096) }

func align(n, a int) int { return (n + a - 1) / a * a }

// region is a mapped control region; both the server and the Go client use it.
// Every shared word is accessed with sync/atomic (sequentially consistent in
// Go: a release store and an acquire load on both x86-64 and arm64).
type region struct {
	mem []byte
	g   shmGeometry
}

func (r *region) u64(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&r.mem[off]))
}

func (r *region) u32(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&r.mem[off]))
}

// initHeader writes the geometry (the server, before the client maps it).
func (r *region) initHeader() {
	g := r.g
	binary.LittleEndian.PutUint64(r.mem[hdrMagic:], shmMagic)
	binary.LittleEndian.PutUint32(r.mem[hdrVersion:], shmVersion)
	binary.LittleEndian.PutUint32(r.mem[hdrVersion+4:], RecordSize)
	binary.LittleEndian.PutUint32(r.mem[hdrEntries:], g.entries)
	binary.LittleEndian.PutUint32(r.mem[hdrEntries+4:], g.slots)
	binary.LittleEndian.PutUint32(r.mem[hdrWords:], g.words)
	binary.LittleEndian.PutUint32(r.mem[hdrWords+4:], SlotSize)
	binary.LittleEndian.PutUint64(r.mem[hdrRingOff:], uint64(g.ringOff()))
	binary.LittleEndian.PutUint64(r.mem[hdrIndexOff:], uint64(g.indexOff()))
	binary.LittleEndian.PutUint64(r.mem[hdrTableOff:], uint64(g.tableOff()))
}

// readHeader checks a mapped header and returns its geometry (the client).
func readHeader(mem []byte) (shmGeometry, error) {
	if len(mem) < shmHeaderSize {
		return shmGeometry{}, fmt.Errorf("control: shm region of %d bytes is smaller than its header", len(mem))
	}
	le := binary.LittleEndian
	if le.Uint64(mem[hdrMagic:]) != shmMagic || le.Uint32(mem[hdrVersion:]) != shmVersion ||
		le.Uint32(mem[hdrVersion+4:]) != RecordSize || le.Uint32(mem[hdrWords+4:]) != SlotSize {
		return shmGeometry{}, fmt.Errorf("control: not a version %d kvxfer shm region", shmVersion)
	}
	g := shmGeometry{entries: le.Uint32(mem[hdrEntries:]), slots: le.Uint32(mem[hdrEntries+4:]), words: le.Uint32(mem[hdrWords:])}
	if e := g.validate(); e != nil {
		return g, e
	}
	if g.size() > len(mem) || le.Uint64(mem[hdrTableOff:]) != uint64(g.tableOff()) {
		return g, fmt.Errorf("control: shm region geometry does not match its size")
	}
	return g, nil
}

// Record is one decoded ring record.
type Record struct {
	Op uint8
	// Flags is the record's second byte: an open's traceparent size in
	// index words (0: none); zero in every other record.
	Flags uint8
	Slot  uint32
	Room  uint64
	A, B  uint64
}

// putRecord encodes rec at b (RecordSize bytes).
func putRecord(b []byte, rec Record) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], uint64(rec.Op)|uint64(rec.Flags)<<8|uint64(rec.Slot)<<32)
	le.PutUint64(b[8:], rec.Room)
	le.PutUint64(b[16:], rec.A)
	le.PutUint64(b[24:], rec.B)
}

// decodeRecord decodes and checks one record's structure against the
// region's geometry. An error means the client's stream cannot be trusted
// (the client is dropped); values a room can refuse on its own (num_pages out
// of range) are not errors here.
func decodeRecord(b []byte, g shmGeometry) (Record, error) {
	le := binary.LittleEndian
	w := le.Uint64(b[0:])
	rec := Record{Op: uint8(w), Flags: uint8(w >> 8), Slot: uint32(w >> 32), Room: le.Uint64(b[8:]), A: le.Uint64(b[16:]), B: le.Uint64(b[24:])}
	if w>>16&0xffff != 0 {
		return rec, fmt.Errorf("record reserved bytes %#x are not zero", w>>16&0xffff)
	}
	if rec.Flags != 0 && rec.Op != RecOpen {
		return rec, fmt.Errorf("op %d carries flags %#x", rec.Op, rec.Flags)
	}
	if rec.Op < RecOpen || rec.Op > RecClear {
		return rec, fmt.Errorf("unknown record op %d", rec.Op)
	}
	if rec.Room > MaxRoom {
		return rec, fmt.Errorf("room %d is not below 2^63", rec.Room)
	}
	switch rec.Op {
	case RecOpen, RecClear:
		if rec.Slot >= g.slots {
			return rec, fmt.Errorf("slot %d out of range (%d slots)", rec.Slot, g.slots)
		}
		if rec.Op == RecOpen && rec.A > math.MaxUint32 {
			return rec, fmt.Errorf("open generation %d is not a uint32", rec.A)
		}
		if rec.Op == RecOpen && uint32(rec.Flags) > g.words {
			return rec, fmt.Errorf("open traceparent of %d index words, the area holds %d", rec.Flags, g.words)
		}
	case RecSend:
		if rec.B > uint64(g.words) {
			return rec, fmt.Errorf("send of %d index words, the area holds %d", rec.B, g.words)
		}
	}
	if rec.Op != RecOpen && rec.Op != RecClear && rec.Slot != 0 {
		return rec, fmt.Errorf("op %d carries slot %d", rec.Op, rec.Slot)
	}
	return rec, nil
}

// decodeSendBlob decodes a send record's index words:
//
//	[n_pages, pages..., n_state (-1: no state), (len_i (-1: None), data_i...)...]
//
// The result is fresh memory (the engine keeps it).
func decodeSendBlob(words []int32) (pages []int32, state [][]int32, err error) {
	i := 0
	next := func(what string) (int32, error) {
		if i >= len(words) {
			return 0, fmt.Errorf("send blob ends before its %s", what)
		}
		v := words[i]
		i++
		return v, nil
	}
	take := func(n int32, what string) ([]int32, error) {
		if n < 0 || int(n) > len(words)-i {
			return nil, fmt.Errorf("send blob %s of %d words does not fit (%d left)", what, n, len(words)-i)
		}
		out := append([]int32{}, words[i:i+int(n)]...)
		i += int(n)
		return out, nil
	}
	n, err := next("page count")
	if err != nil {
		return nil, nil, err
	}
	if pages, err = take(n, "pages"); err != nil {
		return nil, nil, err
	}
	ns, err := next("state count")
	if err != nil {
		return nil, nil, err
	}
	if ns < -1 || int(ns) > len(words)-i {
		return nil, nil, fmt.Errorf("send blob state count %d out of range", ns)
	}
	if ns >= 0 {
		state = make([][]int32, ns)
		for c := range state {
			l, err := next("state length")
			if err != nil {
				return nil, nil, err
			}
			if l == -1 {
				continue
			}
			if state[c], err = take(l, "state component"); err != nil {
				return nil, nil, err
			}
		}
	}
	if i != len(words) {
		return nil, nil, fmt.Errorf("send blob has %d trailing words", len(words)-i)
	}
	return pages, state, nil
}

// appendSendBlob is the inverse of decodeSendBlob.
func appendSendBlob(b []int32, pages []int32, state [][]int32) []int32 {
	b = append(b, int32(len(pages)))
	b = append(b, pages...)
	if state == nil {
		return append(b, -1)
	}
	b = append(b, int32(len(state)))
	for _, s := range state {
		if s == nil {
			b = append(b, -1)
			continue
		}
		b = append(b, int32(len(s)))
		b = append(b, s...)
	}
	return b
}

func sendBlobWords(pages []int32, state [][]int32) int {
	n := 2 + len(pages)
	for _, s := range state {
		n += 1 + len(s)
	}
	return n
}

// traceparentWords is the index words a traceparent of n bytes takes:
// [n, bytes packed little-endian four to a word, zero-padded].
func traceparentWords(n int) int { return 1 + (n+3)/4 }

// appendTraceparent encodes tp as traceparentWords(len(tp)) words.
func appendTraceparent(b []int32, tp string) []int32 {
	b = append(b, int32(len(tp)))
	for i := 0; i < len(tp); i += 4 {
		var w [4]byte
		copy(w[:], tp[i:])
		b = append(b, int32(binary.LittleEndian.Uint32(w[:])))
	}
	return b
}

// decodeTraceparent is the inverse of appendTraceparent; ok is false when
// the words do not hold one (a length out of range or not matching, bytes
// after the value that are not zero). The value itself is checked by the
// caller (validTraceparent).
func decodeTraceparent(words []int32) (tp string, ok bool) {
	if len(words) == 0 {
		return "", false
	}
	n := int(words[0])
	if n <= 0 || n > MaxTraceparent || traceparentWords(n) != len(words) {
		return "", false
	}
	b := make([]byte, 4*(len(words)-1))
	for i, w := range words[1:] {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(w))
	}
	for _, c := range b[n:] {
		if c != 0 {
			return "", false
		}
	}
	return string(b[:n]), true
}

// Slot words.

// progress orders statuses as a room moves: Bootstrapping < WaitingForInput <
// Transferring < terminal (Failed and Success are absorbing). Slot writes
// never go backwards in it.
func progress(s kv.Status) int {
	if s.Terminal() {
		return 4
	}
	return int(s)
}

func packSlotWord(gen uint32, st kv.Status, why uint8, written bool) uint64 {
	w := uint64(gen) | uint64(st)<<32 | uint64(why)<<40
	if written {
		w |= slotWritten
	}
	return w
}

// SlotView is one slot as read (ReadSlot).
type SlotView struct {
	Room      uint64
	Gen       uint32
	Status    kv.Status
	Reason    uint8 // a kv.Reason code
	Written   bool  // kvxferd wrote a status for this generation
	PrefixLen int64
}

// writeSlot is the seqlock writer: seq odd, fields, seq even. Callers
// serialize writers of one slot (slotBinding's mutex).
func (r *region) writeSlot(i uint32, roomID uint64, word uint64, prefix int64) {
	off := r.g.tableOff() + int(i)*SlotSize
	seq := r.u64(off + slotSeq)
	s := seq.Load()
	seq.Store(s + 1)
	r.u64(off + slotRoom).Store(roomID)
	r.u64(off + slotWord).Store(word)
	r.u64(off + slotPrefix).Store(uint64(prefix))
	seq.Store(s + 2)
}

// readSlot is the seqlock reader: ok is false when the read was torn (a write
// was in progress or completed between the two reads of seq); retry then.
func (r *region) readSlot(i uint32) (v SlotView, ok bool) {
	off := r.g.tableOff() + int(i)*SlotSize
	s1 := r.u64(off + slotSeq).Load()
	roomID := r.u64(off + slotRoom).Load()
	w := r.u64(off + slotWord).Load()
	p := r.u64(off + slotPrefix).Load()
	s2 := r.u64(off + slotSeq).Load()
	if s1 != s2 || s1&1 != 0 {
		return v, false
	}
	return SlotView{Room: roomID, Gen: uint32(w), Status: kv.Status(w >> 32 & 0xff), Reason: uint8(w >> 40),
		Written: w&slotWritten != 0, PrefixLen: int64(p)}, true
}

// ReasonName is the protocol's name for a table reason code.
func ReasonName(code uint8) string { return kv.Reason(code).String() }

// ReasonMessage is what failure_exception raises for a Failed slot with this
// reason code (FailureMessage's wording).
func ReasonMessage(code uint8) string {
	return FailureMessage(kv.Reply{Status: kv.StatusFailed, Reason: kv.Reason(code)})
}
