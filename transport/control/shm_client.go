package control

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer/kv"
)

// ErrRingFull is returned when the submission ring (or its index area) stays
// full for longer than ShmClient.FullWait: nothing was submitted.
var ErrRingFull = errors.New("kvxfer control: shared-memory ring full")

// ErrDropped is returned once kvxferd has dropped the session (see DropCode).
var ErrDropped = errors.New("kvxfer control: kvxferd dropped this shared-memory session")

// ShmOptions sizes a region (0: the server's default).
type ShmOptions struct {
	RingEntries, Slots, IndexWords int
	// SpinMax is the most kvxferd's consumer keeps spinning on an empty
	// ring while records come faster than that (0: kvxferd's default,
	// 1 ms; 50 µs or less: it sleeps after 50 µs always; at most
	// MaxShmSpin). Spinning spends a core of kvxferd's for a doorbell
	// that never waits for one (docs/control-api.md §6.5).
	SpinMax time.Duration
}

// ShmClient drives rooms through a shared-memory session: ring records for
// open, init, send, abort and clear (no reply; errors show as the room's
// status), the status table for poll. It is the Go reference of what
// python/kvxfer/control.py's ShmSession does. Not safe for concurrent use:
// one scheduler goroutine is the ring's single producer.
type ShmClient struct {
	c       *Client
	r       *region
	session int64
	path    string

	tail, idxTail uint64
	head, idxHead uint64 // cached from the header
	free          []uint32
	gens          []uint32
	slotOf        map[uint64]uint32
	blob          []int32

	// FullWait bounds how long a submission waits for room in a full ring
	// before it returns ErrRingFull (default 1 s): spinning first, then
	// sleeping a millisecond at a time.
	FullWait time.Duration
}

// AttachShm asks kvxferd (through c) for a shared-memory session and maps it.
func AttachShm(c *Client, o ShmOptions) (*ShmClient, error) {
	fields := map[string]any{"pid": int64(os.Getpid())}
	for k, v := range map[string]int{"ring_entries": o.RingEntries, "slots": o.Slots, "index_words": o.IndexWords} {
		if v > 0 {
			fields[k] = int64(v)
		}
	}
	if o.SpinMax > 0 {
		fields["spin_max_us"] = max(1, o.SpinMax.Microseconds())
	}
	res, err := c.Call(OpShmAttach, fields)
	if err != nil {
		return nil, err
	}
	m, _ := res.(map[string]any)
	path, _ := m["path"].(string)
	session, _ := m["session"].(int64)
	size, _ := m["size"].(int64)
	if path == "" || size <= 0 {
		return nil, fmt.Errorf("kvxfer control: shm_attach answered %v", res)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	f.Close()
	if err != nil {
		return nil, err
	}
	os.Remove(path) // mapped by both sides now: nothing else needs the name
	g, err := readHeader(mem)
	if err != nil {
		syscall.Munmap(mem)
		return nil, err
	}
	s := &ShmClient{c: c, r: &region{mem: mem, g: g}, session: session, path: path, gens: make([]uint32, g.slots),
		slotOf: map[uint64]uint32{}, FullWait: time.Second}
	for i := int(g.slots) - 1; i >= 0; i-- {
		s.free = append(s.free, uint32(i))
	}
	return s, nil
}

// Session is the server's id of this session.
func (s *ShmClient) Session() int64 { return s.session }

// Dropped is the DropCode kvxferd left in the header (DropNone while live).
func (s *ShmClient) Dropped() uint32 { return s.r.u32(hdrDropped).Load() }

// Close detaches (kvxferd fails the rooms still open with client_lost and
// clears every room) and unmaps the region. A second Close does nothing.
func (s *ShmClient) Close() error {
	if s.r.mem == nil {
		return nil
	}
	var err error
	if s.Dropped() == DropNone {
		_, err = s.c.Call(OpShmDetach, map[string]any{"session": s.session})
	}
	syscall.Munmap(s.r.mem)
	s.r.mem = nil
	return err
}

// reserve waits until the ring has a free record and the index area n free
// words (at the position pos it returns).
func (s *ShmClient) reserve(n uint64) (pos uint64, err error) {
	g := s.r.g
	w := uint64(g.words)
	pos = s.idxTail
	if n > 0 && pos%w+n > w {
		pos = (pos/w + 1) * w
	}
	fits := func() bool {
		return s.tail-s.head < uint64(g.entries) && pos+n-s.idxHead <= w
	}
	if fits() {
		return pos, nil
	}
	start := time.Now()
	for i := 0; ; i++ {
		if s.Dropped() != DropNone {
			return 0, ErrDropped
		}
		s.idxHead = s.r.u64(hdrIdxHead).Load()
		s.head = s.r.u64(hdrHead).Load()
		if fits() {
			return pos, nil
		}
		if i == 0 {
			s.r.u64(hdrFullWait).Add(1) // full indeed (not only a stale head): one wait
		}
		if n > w {
			return 0, fmt.Errorf("kvxfer control: a send of %d index words does not fit an area of %d", n, w)
		}
		el := time.Since(start)
		if el > s.FullWait {
			return 0, ErrRingFull
		}
		if el < 100*time.Microsecond {
			runtime.Gosched()
		} else {
			time.Sleep(time.Millisecond)
		}
	}
}

// submit writes rec at the tail, publishes it and rings the doorbell if
// kvxferd sleeps. The tail store and the sleeping load are sequentially
// consistent (Go atomics), the Dekker pairing with the consumer's store of
// sleeping and load of tail: one of the two always sees the other.
func (s *ShmClient) submit(rec Record) error {
	if s.Dropped() != DropNone {
		return ErrDropped
	}
	if _, err := s.reserve(0); err != nil {
		return err
	}
	s.put(rec)
	s.publish()
	return nil
}

func (s *ShmClient) put(rec Record) {
	off := s.r.g.ringOff() + int(s.tail&uint64(s.r.g.entries-1))*RecordSize
	putRecord(s.r.mem[off:off+RecordSize], rec)
	s.tail++
}

func (s *ShmClient) publish() {
	s.r.u64(hdrIdxTail).Store(s.idxTail)
	s.r.u64(hdrTail).Store(s.tail)
	if sl := s.r.u32(hdrSleeping); sl.Load() == 1 && sl.CompareAndSwap(1, 0) {
		futexWakeWord(sl)
	}
}

// Barrier waits until kvxferd has consumed every record submitted so far
// (bounded by FullWait: ErrRingFull). They have reached the engine then, so
// what is sent to the engine by another path afterwards (a request/reply
// call, or in tests a decode message) is ordered after them.
func (s *ShmClient) Barrier() error {
	start := time.Now()
	for i := 0; ; i++ {
		if s.head = s.r.u64(hdrHead).Load(); s.head >= s.tail {
			return nil
		}
		if s.Dropped() != DropNone {
			return ErrDropped
		}
		el := time.Since(start)
		if el > s.FullWait {
			return ErrRingFull
		}
		if el < 100*time.Microsecond {
			runtime.Gosched()
		} else {
			time.Sleep(time.Millisecond)
		}
	}
}

// Open opens a room in a free slot of the table.
func (s *ShmClient) Open(roomID uint64) error { return s.OpenTraced(roomID, "") }

// OpenTraced is Open with the scheduler's W3C traceparent ("" for none),
// carried in the index area: the room's span is its child. kvxferd ignores
// a value that is not a valid traceparent (the room opens untraced), as
// over request/reply; one longer than MaxTraceparent is refused here.
func (s *ShmClient) OpenTraced(roomID uint64, traceparent string) error {
	if len(traceparent) > MaxTraceparent {
		return fmt.Errorf("kvxfer control: a traceparent of %d bytes is longer than %d", len(traceparent), MaxTraceparent)
	}
	if _, ok := s.slotOf[roomID]; ok {
		return fmt.Errorf("kvxfer control: room %d is open in this session already", roomID)
	}
	if len(s.free) == 0 {
		return fmt.Errorf("kvxfer control: all %d status slots are in use", s.r.g.slots)
	}
	slot := s.free[len(s.free)-1]
	s.gens[slot]++
	rec := Record{Op: RecOpen, Slot: slot, Room: roomID, A: uint64(s.gens[slot])}
	var err error
	if traceparent == "" {
		err = s.submit(rec)
	} else {
		var pos, n uint64
		if pos, n, err = s.stage(appendTraceparent(s.blob[:0], traceparent)); err == nil {
			rec.Flags, rec.B = uint8(n), pos
			s.put(rec)
			s.publish()
		}
	}
	if err != nil {
		s.gens[slot]--
		return err
	}
	s.free = s.free[:len(s.free)-1]
	s.slotOf[roomID] = slot
	return nil
}

// Init is sender.init(num_pages, aux_index).
func (s *ShmClient) Init(roomID uint64, numPages, auxIndex int) error {
	return s.submit(Record{Op: RecInit, Room: roomID, A: uint64(int64(numPages)), B: uint64(int64(auxIndex))})
}

// Send is sender.send(pages, state): the indices go to the index area.
func (s *ShmClient) Send(roomID uint64, pages []int32, state [][]int32) error {
	if s.Dropped() != DropNone {
		return ErrDropped
	}
	pos, n, err := s.stage(appendSendBlob(s.blob[:0], pages, state))
	if err != nil {
		return err
	}
	s.put(Record{Op: RecSend, Room: roomID, A: pos, B: n})
	s.publish()
	return nil
}

// stage waits for a free record and room for blob in the index area, copies
// blob there and claims it: the caller's record (put next) names pos and n.
func (s *ShmClient) stage(blob []int32) (pos, n uint64, err error) {
	if s.Dropped() != DropNone {
		return 0, 0, ErrDropped
	}
	s.blob = blob
	n = uint64(len(blob))
	if pos, err = s.reserve(n); err != nil {
		return 0, 0, err
	}
	if n > 0 {
		w := uint64(s.r.g.words)
		dst := unsafe.Slice((*int32)(unsafe.Pointer(&s.r.mem[s.r.g.indexOff()+int(pos%w)*4])), len(blob))
		copy(dst, blob)
	}
	s.idxTail = pos + n
	return pos, n, nil
}

// Abort is sender.abort().
func (s *ShmClient) Abort(roomID uint64) error { return s.submit(Record{Op: RecAbort, Room: roomID}) }

// Clear is sender.clear(): the room's slot is free again at once (its next
// generation can never show this room's status).
func (s *ShmClient) Clear(roomID uint64) error {
	slot, ok := s.slotOf[roomID]
	if !ok {
		return fmt.Errorf("kvxfer control: room %d is not open in this session", roomID)
	}
	if err := s.submit(Record{Op: RecClear, Slot: slot, Room: roomID}); err != nil {
		return err
	}
	delete(s.slotOf, roomID)
	s.free = append(s.free, slot)
	return nil
}

// Poll reads the rooms' statuses from the table: no message, no system call.
// A room kvxferd has not yet written for this open answers Bootstrapping, as
// a fresh SGLang sender does. out is reused when it has the capacity.
func (s *ShmClient) Poll(rooms []uint64, out []kv.Reply) ([]kv.Reply, error) {
	out = append(out[:0], make([]kv.Reply, len(rooms))...)
	for i, id := range rooms {
		slot, ok := s.slotOf[id]
		if !ok {
			return out, fmt.Errorf("kvxfer control: room %d is not open in this session", id)
		}
		v := s.readSlot(slot)
		if v.Gen != s.gens[slot] || v.Room != id || !v.Written {
			out[i] = kv.Reply{Status: kv.StatusBootstrapping}
			continue
		}
		out[i] = kv.Reply{Status: v.Status, Reason: kv.Reason(v.Reason), PrefixLen: int(v.PrefixLen)}
	}
	return out, nil
}

// readSlot retries a torn read (a write in progress) until it is whole.
func (s *ShmClient) readSlot(slot uint32) SlotView {
	for i := 0; ; i++ {
		if v, ok := s.r.readSlot(slot); ok {
			return v
		}
		if i > 64 {
			runtime.Gosched()
		}
	}
}
