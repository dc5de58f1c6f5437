package control

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer/internal/cores"
	"github.com/kvxfer/kvxfer/kv"
)

// Shared-memory ops (request/reply): a client asks for a region, then drives
// rooms through it without round trips.
const (
	OpShmAttach = "shm_attach" // pid, and optional ring_entries, slots, index_words, spin_max_us
	OpShmDetach = "shm_detach" // session
)

// MaxShmSessions caps the regions one server holds at once, MaxShmBytes
// their bytes together (the regions are files in the control directory,
// often a tmpfs: memory).
const (
	MaxShmSessions = 64
	MaxShmBytes    = 256 << 20
)

// Doorbell tuning: the consumer spins (yielding) on an empty ring for its
// spin window before it sleeps on the futex; a sleep ends at the client's
// wake-up, or after shmSafetyWake at the latest (a safety net, counted when it
// finds work). Each safety timeout that finds nothing doubles the next one,
// up to shmSafetyWakeMax, so an idle session wakes less than once a second
// (docs/benchmarks.md, idle CPU); records or a doorbell reset it.
//
// The spin window adapts (nextSpin): shmSpin while the client submits now
// and then, up to shmSpinMax (or the session's spin_max_us) while it submits
// more often than that. A sleep
// is not free: the woken thread needs a core, and where the client's thread
// spins on one (a scheduler's loop) Linux can queue the woken thread behind
// it until the next tick, up to 4 ms on a 250 Hz kernel without preemption
// — what the abort storm's p99 measured (docs/benchmarks.md, control path).
// So while records keep coming less than shmSpinMax apart the consumer
// does not sleep: it spends up to a core while the client is that busy.
// Only for a client in another process (a scheduler, as deployed): a client
// in kvxferd's own process shares its Go scheduler's Ps with the consumer,
// and there a consumer that spins on instead of sleeping takes them from the
// client and the engine (the in-process abort storm's p50 went from 0.05 to
// 2 ms), so that session keeps shmSpin.
//
// Beyond shmSpin the consumer spins only while a processor is free
// (coreFree): with every core busy the spin takes one from the scheduler or
// the engine, and a client that submits steadily (the demo's scheduler) kept
// a core spinning for nothing, about a fifth of kvxferd's CPU per room.
const (
	shmSpin          = 50 * time.Microsecond
	shmSpinMax       = time.Millisecond // the default; a session may ask for 0..MaxShmSpin
	MaxShmSpin       = 100 * time.Millisecond
	shmSafetyWake    = 100 * time.Millisecond
	shmSafetyWakeMax = 6400 * time.Millisecond
	shmBatch         = 256 // records consumed between publications of head
)

// coreFree reports whether a processor is free (cores.Free): beyond shmSpin
// the consumer spins only then, since with every core busy its spin takes
// one from the scheduler or the engine.
var coreFree = cores.Free

// nextSpin is the spin window after a sleep that the client's doorbell ended
// idle after the ring went empty (the gap the client left, plus the wake-up's
// own latency), for a session whose window may grow to most: a gap shorter
// than most means records come faster than sleeping pays, so the window grows
// to twice the gap (at most most); a gap of 4 × most or more means the client
// paused, so the window is shmSpin again; a gap in between keeps it (it may be
// a short gap and a slow wake-up). A most of shmSpin or less keeps shmSpin.
func nextSpin(spin, idle, most time.Duration) time.Duration {
	switch {
	case most <= shmSpin:
		return shmSpin
	case idle < most:
		return min(most, max(spin, 2*idle))
	case idle >= 4*most:
		return shmSpin
	}
	return spin
}

// ShmStats are the shared-memory path's counters (Server.ShmStats).
type ShmStats struct {
	Sessions    int    // attached now
	Attached    uint64 // sessions ever attached
	Records     uint64 // records consumed
	Sleeps      uint64 // times a consumer slept on its doorbell
	Wakes       uint64 // sleeps ended by the client's doorbell (it cleared sleeping and woke the futex)
	MissedWakes uint64 // sleeps ended by the safety timeout with work waiting
	// FullWaits: times clients waited for room in a full ring or index area,
	// as they report it in their region's header (sessions attached now and
	// ended ones).
	FullWaits    uint64
	DroppedDead  uint64 // sessions dropped because the client's process exited
	DroppedBad   uint64 // sessions dropped for a record that did not decode
	RoomsLost    uint64 // rooms failed client_lost
	InvalidSends uint64 // send or init records refused (room failed invalid_request)
	// TracedOpens: opens that carried a valid traceparent (the room's span
	// is its child); IgnoredTraceparents: opens whose traceparent was not
	// valid (the room opens untraced, the W3C rule, as over request/reply).
	TracedOpens         uint64
	IgnoredTraceparents uint64
}

// shmAttachReq holds shm_attach's and shm_detach's fields.
type shmAttachReq struct {
	pid, entries, slots, words, session, spinMax int64
	hasPid, hasSession, hasSpinMax               bool
}

// shmField decodes one shm_attach/shm_detach field (protocol.go's field).
func (q *request) shmField(r *reader, key string) error {
	v, err := r.readInt()
	if err != nil {
		return err
	}
	switch key {
	case "pid":
		q.shm.pid, q.shm.hasPid = v, true
	case "ring_entries":
		q.shm.entries = v
	case "slots":
		q.shm.slots = v
	case "index_words":
		q.shm.words = v
	case "session":
		q.shm.session, q.shm.hasSession = v, true
	case "spin_max_us":
		q.shm.spinMax, q.shm.hasSpinMax = v, true
	}
	return nil
}

// shmHub is a server's sessions. Attach and detach run on the server's
// goroutine; sessions end on their own goroutines too, so it is locked.
type shmHub struct {
	mu       sync.Mutex
	sessions map[int64]*shmSession
	next     int64
	sink     *statusSink
	dir      string

	attached, records, sleeps, missed, dead, bad, lost, invalid atomic.Uint64
	traced, untraced, wakes, fullWaits                          atomic.Uint64
}

// ShmStats returns the shared-memory path's counters.
func (s *Server) ShmStats() ShmStats {
	h := &s.shm
	h.mu.Lock()
	n := len(h.sessions)
	full := h.fullWaits.Load()
	for _, ss := range h.sessions {
		full += ss.fullWaits()
	}
	h.mu.Unlock()
	return ShmStats{Sessions: n, Attached: h.attached.Load(), Records: h.records.Load(), Sleeps: h.sleeps.Load(),
		Wakes: h.wakes.Load(), FullWaits: full,
		MissedWakes: h.missed.Load(), DroppedDead: h.dead.Load(), DroppedBad: h.bad.Load(), RoomsLost: h.lost.Load(),
		InvalidSends: h.invalid.Load(), TracedOpens: h.traced.Load(), IgnoredTraceparents: h.untraced.Load()}
}

// ShmSession describes one attached session (Server.ShmSessions, kvxferd's
// /debug/shm).
type ShmSession struct {
	ID          int64  `json:"id"`
	PID         int64  `json:"pid"`
	RingEntries uint32 `json:"ring_entries"`
	Slots       uint32 `json:"slots"`
	IndexWords  uint32 `json:"index_words"`
	Tail        uint64 `json:"tail"` // records the client published
	Head        uint64 `json:"head"` // records kvxferd consumed
	Sleeping    bool   `json:"sleeping"`
	FullWaits   uint64 `json:"full_waits"`
	// SpinMicros is how long the consumer spins on an empty ring before it
	// sleeps, as its last doorbell left it (nextSpin).
	SpinMicros int64 `json:"spin_us"`
}

// ShmSessions lists the sessions attached now, by id.
func (s *Server) ShmSessions() []ShmSession {
	h := &s.shm
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]ShmSession, 0, len(h.sessions))
	for _, ss := range h.sessions {
		v := ShmSession{ID: ss.id, PID: ss.pid, RingEntries: ss.r.g.entries, Slots: ss.r.g.slots, IndexWords: ss.r.g.words,
			SpinMicros: ss.spinNs.Load() / 1e3}
		ss.memMu.RLock()
		if !ss.unmapped {
			v.Tail, v.Head = ss.r.u64(hdrTail).Load(), ss.r.u64(hdrHead).Load()
			v.Sleeping, v.FullWaits = ss.r.u32(hdrSleeping).Load() == 1, ss.r.u64(hdrFullWait).Load()
		}
		ss.memMu.RUnlock()
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (s *Server) shmDir() (string, error) {
	if s.ipc != nil {
		return filepath.Dir(s.ipc.path), nil
	}
	h := &s.shm
	if h.dir == "" {
		d, err := os.MkdirTemp("", "kvxfer-shm-")
		if err != nil {
			return "", err
		}
		h.dir = d
	}
	return h.dir, nil
}

func (s *Server) shmAttach(b []byte, q *request) ([]byte, *Error) {
	if littleEndian := *(*byte)(unsafe.Pointer(&[]uint16{1}[0])) == 1; !littleEndian {
		return b, errorf(CodeUnsupported, "the shared-memory path needs a little-endian host")
	}
	se, ok := s.cfg.Engine.(SinkEngine)
	if !ok {
		return b, errorf(CodeUnsupported, "this engine has no status table")
	}
	if !q.shm.hasPid || q.shm.pid <= 0 || q.shm.pid > math.MaxInt32 {
		return b, errorf(CodeBadRequest, "shm_attach needs the client's pid")
	}
	g := shmGeometry{entries: DefaultRingEntries, slots: DefaultSlots, words: DefaultIndexWords}
	for _, f := range []struct {
		v   int64
		dst *uint32
	}{{q.shm.entries, &g.entries}, {q.shm.slots, &g.slots}, {q.shm.words, &g.words}} {
		if f.v < 0 || f.v > math.MaxUint32 {
			return b, errorf(CodeBadRequest, "shm_attach size %d out of range", f.v)
		}
		if f.v > 0 {
			*f.dst = uint32(f.v)
		}
	}
	if e := g.validate(); e != nil {
		return b, e
	}
	spinMax := shmSpinMax
	if q.shm.hasSpinMax {
		if q.shm.spinMax < 0 || q.shm.spinMax > MaxShmSpin.Microseconds() {
			return b, errorf(CodeBadRequest, "shm_attach spin_max_us %d out of range 0..%d", q.shm.spinMax, MaxShmSpin.Microseconds())
		}
		spinMax = time.Duration(q.shm.spinMax) * time.Microsecond
	}
	h := &s.shm
	h.mu.Lock()
	n, bytes := len(h.sessions), g.size()
	for _, ss := range h.sessions {
		bytes += ss.r.g.size()
	}
	h.mu.Unlock()
	if n >= MaxShmSessions {
		return b, errorf(CodeBusy, "%d shared-memory sessions attached already", MaxShmSessions)
	}
	if bytes > MaxShmBytes {
		return b, errorf(CodeBusy, "shared-memory sessions would hold %d bytes, more than %d", bytes, MaxShmBytes)
	}
	watch, err := watchPid(int(q.shm.pid))
	if err != nil {
		return b, errorf(CodeBadRequest, "pid %d: %v", q.shm.pid, err)
	}
	dir, err := s.shmDir()
	if err != nil {
		watch.Close()
		return b, errorf(CodeInternal, "shm directory: %v", err)
	}
	h.mu.Lock()
	if h.sessions == nil {
		h.sessions = map[int64]*shmSession{}
	}
	if h.sink == nil {
		h.sink = newStatusSink()
		se.SetStatusSink(h.sink)
	}
	h.next++
	id := h.next
	h.mu.Unlock()
	path := filepath.Join(dir, ".kvxfer-shm-"+strconv.Itoa(os.Getpid())+"-"+strconv.FormatInt(id, 10))
	mem, err := createRegion(path, g.size())
	if err != nil {
		watch.Close()
		return b, errorf(CodeInternal, "shm region: %v", err)
	}
	ss := &shmSession{id: id, pid: q.shm.pid, hub: h, eng: s.cfg.Engine, log: s.log, r: &region{mem: mem, g: g}, path: path, watch: watch,
		bindings: make([]*slotBinding, g.slots), done: make(chan struct{}), polls: make(chan []*slotBinding, 64)}
	ss.ops = recordOps(s.cfg.Engine)
	ss.r.initHeader()
	ss.spinNs.Store(int64(shmSpin))
	ss.spinMax = spinMax
	h.mu.Lock()
	h.sessions[id] = ss
	h.mu.Unlock()
	h.attached.Add(1)
	ss.start()

	b = appendMapHeader(b, 12)
	b = appendInt(appendStr(b, "session"), id)
	b = appendStr(appendStr(b, "path"), path)
	b = appendInt(appendStr(b, "size"), int64(g.size()))
	b = appendInt(appendStr(b, "ring_entries"), int64(g.entries))
	b = appendInt(appendStr(b, "slots"), int64(g.slots))
	b = appendInt(appendStr(b, "index_words"), int64(g.words))
	b = appendInt(appendStr(b, "ring_off"), int64(g.ringOff()))
	b = appendInt(appendStr(b, "index_off"), int64(g.indexOff()))
	b = appendInt(appendStr(b, "table_off"), int64(g.tableOff()))
	b = appendInt(appendStr(b, "spin_max_us"), spinMax.Microseconds())
	codes := append(kv.Reasons(), kv.ReasonNone)
	b = appendArrayHeader(appendStr(b, "reason_names"), len(codes))
	for _, c := range codes {
		b = appendArrayHeader(b, 2)
		b = appendStr(appendInt(b, int64(c)), ReasonName(uint8(c)))
	}
	b = appendArrayHeader(appendStr(b, "reason_messages"), len(codes))
	for _, c := range codes {
		b = appendArrayHeader(b, 2)
		b = appendStr(appendInt(b, int64(c)), ReasonMessage(uint8(c)))
	}
	return b, nil
}

func (s *Server) shmDetach(b []byte, q *request) ([]byte, *Error) {
	if !q.shm.hasSession {
		return b, errorf(CodeBadRequest, "shm_detach needs session")
	}
	h := &s.shm
	h.mu.Lock()
	ss := h.sessions[q.shm.session]
	h.mu.Unlock()
	if ss == nil {
		return b, errorf(CodeBadRequest, "no shared-memory session %d", q.shm.session)
	}
	ss.end(DropDetached)
	<-ss.done
	return appendMapHeader(b, 0), nil
}

// closeShm ends every session (the server is stopping).
func (s *Server) closeShm() {
	h := &s.shm
	h.mu.Lock()
	var all []*shmSession
	for _, ss := range h.sessions {
		all = append(all, ss)
	}
	h.mu.Unlock()
	for _, ss := range all {
		ss.end(DropDetached)
		<-ss.done
	}
	if h.sink != nil {
		if se, ok := s.cfg.Engine.(SinkEngine); ok {
			se.SetStatusSink(nil)
		}
	}
	if h.dir != "" {
		os.RemoveAll(h.dir)
	}
}

func createRegion(path string, size int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		os.Remove(path)
		return nil, err
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return mem, nil
}

// shmSession is one client's region and the goroutine that consumes its ring.
// bindings, head and cursor are the consumer's alone.
type shmSession struct {
	id    int64
	pid   int64
	hub   *shmHub
	eng   Engine
	log   interface{ Error(string, ...any) }
	r     *region
	path  string
	watch *pidWatch

	closing  atomic.Uint32 // a DropCode once the session is ending
	spinNs   atomic.Int64  // the consumer's spin window (ShmSession.SpinMicros)
	spinMax  time.Duration // the most the window grows to (spin_max_us)
	memMu    sync.RWMutex  // unmapping waits for wake-ups in progress
	unmapped bool
	done     chan struct{}
	polls    chan []*slotBinding
	// ops takes the records' room operations: a BatchEngine's batch, sent
	// at the end of each drain (flush), or the engine itself.
	ops RecordBatch

	bindings []*slotBinding
	head     uint64
	cursor   uint64 // index words consumed
	opened   []*slotBinding
}

func (ss *shmSession) start() {
	go func() {
		if ss.watch.Wait() {
			ss.end(DropDead)
		}
	}()
	go ss.pollOpens()
	go ss.run()
}

// fullWaits is what the client reported in the header (0 once unmapped).
func (ss *shmSession) fullWaits() uint64 {
	ss.memMu.RLock()
	defer ss.memMu.RUnlock()
	if ss.unmapped {
		return 0
	}
	return ss.r.u64(hdrFullWait).Load()
}

// end asks the session to end with code (the first code wins).
func (ss *shmSession) end(code uint32) {
	ss.closing.CompareAndSwap(0, code)
	ss.memMu.RLock()
	if !ss.unmapped {
		futexWakeWord(ss.r.u32(hdrSleeping))
	}
	ss.memMu.RUnlock()
}

// pollOpens answers each batch of opens from the engine's poll (see
// slotBinding.offer).
func (ss *shmSession) pollOpens() {
	var rooms []uint64
	var out []kv.Reply
	for bs := range ss.polls {
		rooms = rooms[:0]
		for _, b := range bs {
			rooms = append(rooms, b.room)
		}
		out = ss.eng.Poll(rooms, out)
		for i, b := range bs {
			if i < len(out) {
				b.offer(out[i])
			}
		}
	}
}

// nextSafetyWake is the safety timeout after one that found the ring still
// empty: double, at most shmSafetyWakeMax.
func nextSafetyWake(d time.Duration) time.Duration { return min(2*d, shmSafetyWakeMax) }

func (ss *shmSession) run() {
	r := ss.r
	tail, sleeping := r.u64(hdrTail), r.u32(hdrSleeping)
	mask := uint64(r.g.entries - 1)
	var spinStart time.Time
	spinning := false
	safety := shmSafetyWake
	spin := shmSpin
	most := ss.spinMax
	if ss.pid == int64(os.Getpid()) {
		most = shmSpin // a client in this process: see shmSpinMax
	}
	var rec [RecordSize]byte
	for {
		if code := ss.closing.Load(); code != 0 {
			ss.teardown(code, "")
			return
		}
		t := tail.Load()
		if t == ss.head {
			if !spinning {
				spinning, spinStart = true, time.Now()
			}
			if spun := time.Since(spinStart); spun < spin && (spun < shmSpin || coreFree()) {
				runtime.Gosched()
				continue
			}
			sleeping.Store(1)
			if tail.Load() != ss.head || ss.closing.Load() != 0 {
				sleeping.Store(0)
				continue
			}
			ss.hub.sleeps.Add(1)
			slept := time.Now()
			futexWaitWord(sleeping, 1, safety)
			if sleeping.Swap(0) == 0 {
				ss.hub.wakes.Add(1) // the client cleared sleeping: its doorbell
				safety = shmSafetyWake
				spin = nextSpin(spin, time.Since(spinStart), most)
			} else if time.Since(slept) >= safety {
				spin = shmSpin // no doorbell for a safety timeout: idle
				if tail.Load() != ss.head {
					ss.hub.missed.Add(1)
				} else {
					safety = nextSafetyWake(safety) // idle: sleep longer
				}
			}
			ss.spinNs.Store(int64(spin))
			spinning = false
			continue
		}
		spinning, safety = false, shmSafetyWake
		if t-ss.head > uint64(r.g.entries) {
			ss.teardown(DropGarbage, fmt.Sprintf("tail %d is more than a ring ahead of head %d", t, ss.head))
			return
		}
		for n := 0; ss.head != t && n < shmBatch; n++ {
			off := r.g.ringOff() + int(ss.head&mask)*RecordSize
			copy(rec[:], r.mem[off:off+RecordSize])
			if err := ss.safeApply(rec[:]); err != nil {
				ss.teardown(DropGarbage, err.Error())
				return
			}
			ss.head++
			ss.hub.records.Add(1)
		}
		ss.ops.Flush()
		r.u64(hdrIdxHead).Store(ss.cursor)
		r.u64(hdrHead).Store(ss.head)
		if len(ss.opened) > 0 {
			ss.polls <- ss.opened
			ss.opened = nil
		}
	}
}

// safeApply is apply with a panic (a bug in an engine call) turned into an
// error: the session drops, the server goes on.
func (ss *shmSession) safeApply(b []byte) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic applying a record: %v", p)
		}
	}()
	return ss.apply(b)
}

// apply executes one record. An error drops the client.
func (ss *shmSession) apply(b []byte) error {
	rec, err := decodeRecord(b, ss.r.g)
	if err != nil {
		return err
	}
	switch rec.Op {
	case RecOpen:
		if old := ss.bindings[rec.Slot]; old != nil {
			old.close(false)
			ss.hub.sink.withdraw(old)
		}
		var tp string
		if rec.Flags != 0 {
			words, err := ss.takeIndex(rec.B, uint64(rec.Flags))
			if err != nil {
				return err
			}
			tp, _ = decodeTraceparent(words)
		}
		nb := &slotBinding{r: ss.r, slot: rec.Slot, gen: uint32(rec.A), room: rec.Room}
		nb.reset()
		ss.bindings[rec.Slot] = nb
		ss.hub.sink.deposit(nb)
		if _, ok := ss.eng.(TracedOpener); ok && tp != "" && validTraceparent(tp) {
			ss.hub.traced.Add(1)
			ss.ops.OpenTraced(rec.Room, tp)
		} else {
			if rec.Flags != 0 {
				ss.hub.untraced.Add(1)
			}
			ss.ops.Open(rec.Room)
		}
		ss.opened = append(ss.opened, nb)
	case RecInit:
		numPages, aux := int64(rec.A), int64(rec.B)
		if numPages < 0 || numPages > math.MaxInt32 || aux < 0 || aux > math.MaxInt32 {
			ss.invalidRoom(rec.Room)
			return nil
		}
		ss.ops.Init(rec.Room, int(numPages), int(aux))
	case RecSend:
		words, err := ss.takeIndex(rec.A, rec.B)
		if err != nil {
			return err
		}
		pages, state, err := decodeSendBlob(words)
		if err != nil {
			ss.invalidRoom(rec.Room)
			return nil
		}
		ss.ops.Send(rec.Room, pages, state)
	case RecAbort:
		ss.ops.Abort(rec.Room)
	case RecClear:
		b := ss.bindings[rec.Slot]
		if b == nil || b.room != rec.Room {
			return fmt.Errorf("clear of room %d in slot %d, which holds no such room", rec.Room, rec.Slot)
		}
		b.close(false)
		ss.hub.sink.withdraw(b)
		ss.bindings[rec.Slot] = nil
		ss.ops.Clear(rec.Room)
	}
	return nil
}

// takeIndex consumes the n index words a record says start at pos: they
// must start where the previous blob ended, or at the wrap when they did not
// fit before the end. The words alias the region (copy what is kept).
func (ss *shmSession) takeIndex(pos, n uint64) ([]int32, error) {
	w := uint64(ss.r.g.words)
	want := ss.cursor
	if want%w+n > w {
		want = (want/w + 1) * w // the blob did not fit before the end: it starts at the wrap
	}
	if pos != want {
		return nil, fmt.Errorf("index words at position %d, expected %d", pos, want)
	}
	ss.cursor = pos + n
	if n == 0 {
		return nil, nil
	}
	start := ss.r.g.indexOff() + int(pos%w)*4
	return unsafe.Slice((*int32)(unsafe.Pointer(&ss.r.mem[start])), int(n)), nil
}

// invalidRoom fails a room whose record carried values it cannot take: no
// reply, the room's status says it (Failed, invalid_request). An engine
// without Fail gets an Abort.
func (ss *shmSession) invalidRoom(id uint64) {
	ss.hub.invalid.Add(1)
	ss.failRoom(id, kv.ReasonInvalidRequest)
}

// failRoom fails a room with why; an engine without Fail gets an Abort.
func (ss *shmSession) failRoom(id uint64, why kv.Reason) { ss.ops.Fail(id, why) }

// recordOps is where a session's records go: a BatchEngine's batch, or
// the engine one call per record.
func recordOps(eng Engine) RecordBatch {
	if be, ok := eng.(BatchEngine); ok {
		if b := be.NewRecordBatch(); b != nil {
			return b
		}
	}
	return directOps{eng}
}

// directOps hands each record's operation to the engine at once.
type directOps struct{ Engine }

func (d directOps) OpenTraced(id uint64, traceparent string) {
	d.Engine.(TracedOpener).OpenTraced(id, traceparent)
}

func (d directOps) Fail(id uint64, why kv.Reason) {
	if f, ok := d.Engine.(interface{ Fail(uint64, kv.Reason) }); ok {
		f.Fail(id, why)
		return
	}
	d.Engine.Abort(id)
}

func (directOps) Flush() {}

// teardown ends the session on the consumer's goroutine: every bound room
// that is not terminal fails client_lost (in the table and in the engine),
// every bound room is cleared, the region is released.
func (ss *shmSession) teardown(code uint32, why string) {
	ss.closing.CompareAndSwap(0, code)
	code = ss.closing.Load()
	h := ss.hub
	switch code {
	case DropDead:
		h.dead.Add(1)
	case DropGarbage:
		h.bad.Add(1)
		ss.log.Error("control: dropping a shared-memory client that sent a bad record", "session", ss.id, "error", why)
	}
	for i, b := range ss.bindings {
		if b == nil {
			continue
		}
		h.sink.withdraw(b)
		if !b.close(true) {
			h.lost.Add(1)
			ss.failRoom(b.room, kv.ReasonClientLost)
		}
		ss.ops.Clear(b.room)
		ss.bindings[i] = nil
	}
	ss.ops.Flush() // after the records taken before: a room's operations keep their order
	close(ss.polls)
	ss.watch.Close()
	os.Remove(ss.path)
	h.mu.Lock()
	delete(h.sessions, ss.id)
	h.fullWaits.Add(ss.r.u64(hdrFullWait).Load())
	h.mu.Unlock()
	// The client sees the drop once the teardown is done: its rooms are
	// failed and cleared, the session is gone from the stats.
	ss.r.u32(hdrDropped).Store(code)
	// Every binding is closed: nothing writes the region any more (a late
	// poll answer or room actor finds its binding closed). An in-process
	// client has its own mapping.
	ss.memMu.Lock()
	ss.unmapped = true
	syscall.Munmap(ss.r.mem)
	ss.memMu.Unlock()
	close(ss.done)
}
