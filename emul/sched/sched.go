package sched

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/control"
)

// Config configures a run.
type Config struct {
	Control     string // kvxferd's control endpoint
	Workload    workload.Config
	Rooms       int
	Concurrency int           // rooms between open and terminal at once
	Rate        float64       // rooms opened per second; 0: as fast as concurrency allows
	Grace       time.Duration // a room still non-terminal this long after open is pinned
	Shape       kvmem.Shape
	PageSize    int // tokens per page, for decode_prefix_len accounting
	Progress    func(done, total int)
}

// Result is one room's outcome on the prefill side.
type Result struct {
	Room    uint64
	Abort   workload.AbortKind
	Status  room.Status
	Reason  room.Reason
	Elapsed time.Duration
	Pinned  bool
}

// Summary is what a run reports.
type Summary struct {
	Rooms      int                       `json:"rooms"`
	Pinned     int                       `json:"pinned"`
	Outcomes   map[string]map[string]int `json:"outcomes"` // abort kind -> "Status/reason" -> rooms
	WallSecs   float64                   `json:"wall_seconds"`
	RoomsPerS  float64                   `json:"rooms_per_second"`
	P50Millis  float64                   `json:"p50_ms"`
	P99Millis  float64                   `json:"p99_ms"`
	Unexpected []string                  `json:"unexpected,omitempty"` // outcomes the plan rules out
}

// memory is the scheduler's KV and aux pools: one shared-memory file each.
type memory struct {
	dir     string
	kv, aux []byte
	shape   kvmem.Shape
	auxOff  []int
}

func newMemory(sh kvmem.Shape) (*memory, error) {
	root := "/dev/shm"
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		root = os.TempDir()
	}
	dir, err := os.MkdirTemp(root, "kvxfer-sched-")
	if err != nil {
		return nil, err
	}
	m := &memory{dir: dir, shape: sh}
	auxLen := 0
	for _, it := range sh.AuxItems {
		m.auxOff = append(m.auxOff, auxLen)
		auxLen += int(it) * sh.AuxSlots
	}
	if m.kv, err = mapFile(filepath.Join(dir, "kv"), 2*sh.Layers*sh.Slots*sh.Item); err != nil {
		m.close()
		return nil, err
	}
	if m.aux, err = mapFile(filepath.Join(dir, "aux"), auxLen); err != nil {
		m.close()
		return nil, err
	}
	return m, nil
}

func mapFile(path string, n int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := f.Truncate(int64(n)); err != nil {
		return nil, err
	}
	return syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
}

func (m *memory) close() {
	for _, b := range [][]byte{m.kv, m.aux} {
		if b != nil {
			syscall.Munmap(b)
		}
	}
	os.RemoveAll(m.dir)
}

// registrations describe the pools as SGLang's KVArgs would: K then V buffers
// of every layer, each its own region of the KV file; the aux buffers in order.
func (m *memory) registrations() []*control.MemoryRegistration {
	sh := m.shape
	kv := &control.MemoryRegistration{Kind: control.KindKV}
	bufLen := uint64(sh.Slots * sh.Item)
	for b := range 2 * sh.Layers {
		kv.Buffers = append(kv.Buffers, control.Region{Shm: filepath.Join(m.dir, "kv"), Offset: uint64(b) * bufLen,
			Length: bufLen, ItemLen: uint64(sh.Item), Mem: nixl.DRAM})
	}
	aux := &control.MemoryRegistration{Kind: control.KindAux}
	for i, it := range sh.AuxItems {
		aux.Buffers = append(aux.Buffers, control.Region{Shm: filepath.Join(m.dir, "aux"), Offset: uint64(m.auxOff[i]),
			Length: it * uint64(sh.AuxSlots), ItemLen: it, Mem: nixl.DRAM})
	}
	return []*control.MemoryRegistration{kv, aux}
}

// fillPage writes the room's j-th request page into prefill page slot.
func (m *memory) fillPage(r uint64, slot, j int) {
	sh := m.shape
	for b := range 2 * sh.Layers {
		off := (b*sh.Slots + slot) * sh.Item
		page := m.kv[off : off+sh.Item]
		for k := range page {
			page[k] = kvmem.Pattern(r, b, j, k)
		}
	}
}

// writeAux is MetadataBuffers.set_buf for the room: the pattern decode checks,
// and the room in slot 0 of the bootstrap_room buffer.
func (m *memory) writeAux(slot int, r uint64) {
	for i, it := range m.shape.AuxItems {
		item := m.aux[m.auxOff[i]+slot*int(it) : m.auxOff[i]+(slot+1)*int(it)]
		for k := range item {
			item[k] = byte(r) + byte(i) + byte(k)
		}
	}
	last := len(m.shape.AuxItems) - 1
	binary.LittleEndian.PutUint64(m.aux[m.auxOff[last]+slot*sglang.AuxRoomItemLen:], r)
}

// phase of a room in the scheduler's queues.
type phase uint8

const (
	bootstrapQueue phase = iota // opened, waiting for WaitingForInput
	inflightQueue               // inited and sent, waiting for terminal
)

type live struct {
	plan   workload.Plan
	phase  phase
	opened time.Time
	pages  []int32
	aux    int
}

// Run registers memory and runs the workload; it returns every room's result.
func Run(cfg Config) ([]Result, Summary, error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 60 * time.Second
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 1
	}
	if need := cfg.Concurrency * max(cfg.Workload.MaxPages, 1); cfg.Shape.Slots < need || cfg.Shape.AuxSlots < cfg.Concurrency {
		return nil, Summary{}, fmt.Errorf("sched: %d slots / %d aux slots cannot hold %d rooms of up to %d pages", cfg.Shape.Slots, cfg.Shape.AuxSlots, cfg.Concurrency, cfg.Workload.MaxPages)
	}
	mem, err := newMemory(cfg.Shape)
	if err != nil {
		return nil, Summary{}, err
	}
	defer mem.close()
	cli, err := control.Dial(cfg.Control)
	if err != nil {
		return nil, Summary{}, err
	}
	defer cli.Close()
	if _, err := cli.Hello(nil); err != nil {
		return nil, Summary{}, fmt.Errorf("sched: hello: %w", err)
	}
	for _, reg := range mem.registrations() {
		if _, err := cli.RegisterMemory(reg); err != nil {
			return nil, Summary{}, fmt.Errorf("sched: register_memory %s: %w", reg.Kind, err)
		}
	}
	s := &loop{cfg: cfg, mem: mem, cli: cli, free: newFreeList(cfg.Shape.Slots), auxFree: newFreeList(cfg.Shape.AuxSlots)}
	return s.run()
}

type loop struct {
	cfg     Config
	mem     *memory
	cli     *control.Client
	free    *freeList
	auxFree *freeList
	live    map[uint64]*live
	results []Result
}

func (s *loop) run() ([]Result, Summary, error) {
	s.live = map[uint64]*live{}
	start := time.Now()
	next := 0
	var ids []uint64
	var replies []room.Reply
	lastProgress := time.Now()
	for next < s.cfg.Rooms || len(s.live) > 0 {
		// Admit new requests (the bootstrap queue), within concurrency and rate.
		for next < s.cfg.Rooms && len(s.live) < s.cfg.Concurrency {
			if s.cfg.Rate > 0 && time.Since(start).Seconds()*s.cfg.Rate < float64(next) {
				break
			}
			if err := s.open(s.cfg.Workload.Plan(next)); err != nil {
				return nil, Summary{}, err
			}
			next++
		}
		// One batched poll of every queued room per iteration.
		ids = ids[:0]
		for id := range s.live {
			ids = append(ids, id)
		}
		var err error
		if replies, err = s.cli.Poll(ids, replies); err != nil {
			return nil, Summary{}, err
		}
		for i, id := range ids {
			if err := s.step(s.live[id], replies[i]); err != nil {
				return nil, Summary{}, err
			}
		}
		if s.cfg.Progress != nil && time.Since(lastProgress) >= time.Second {
			lastProgress = time.Now()
			s.cfg.Progress(len(s.results), s.cfg.Rooms)
		}
		time.Sleep(time.Millisecond) // a forward pass's worth of other work (sub-ms sleeps take ~1.1 ms here anyway)
	}
	return s.results, summarize(s.results, time.Since(start)), nil
}

func (s *loop) open(p workload.Plan) error {
	l := &live{plan: p, opened: time.Now(), aux: int(s.auxFree.take(1)[0])}
	l.pages = s.free.take(p.Pages)
	for j, slot := range l.pages {
		s.mem.fillPage(p.Room, int(slot), j)
	}
	s.mem.writeAux(l.aux, p.Room)
	if _, err := s.cli.Open(p.Room, ""); err != nil {
		return err
	}
	s.live[p.Room] = l
	return nil
}

// step advances one room by what its poll said, as prefill.py does.
func (s *loop) step(l *live, rep room.Reply) error {
	id := l.plan.Room
	if rep.Status.Terminal() {
		return s.finish(l, rep)
	}
	if time.Since(l.opened) > s.cfg.Grace {
		s.results = append(s.results, Result{Room: id, Abort: l.plan.Abort, Status: rep.Status, Pinned: true, Elapsed: time.Since(l.opened)})
		s.release(l)
		return nil
	}
	if l.phase != bootstrapQueue || rep.Status != room.WaitingForInput {
		return nil
	}
	// finalize_bootstrap: pop the decode prefix, init, then the forward pass
	// and its chunked sends.
	if _, err := s.cli.PopDecodePrefixLen([]uint64{id}); err != nil {
		return err
	}
	if err := s.cli.Init(id, l.plan.Pages, l.aux); err != nil {
		return err
	}
	l.phase = inflightQueue
	if l.plan.Abort == workload.AbortPrefillClient {
		return s.cli.Abort(id)
	}
	next := 0
	for c, n := range l.plan.Chunks {
		if err := s.cli.Send(id, l.pages[next:next+n], nil); err != nil {
			return err
		}
		next += n
		if c == 0 && l.plan.Abort == workload.AbortPrefillMidTransfer {
			return s.cli.Abort(id)
		}
	}
	return nil
}

func (s *loop) finish(l *live, rep room.Reply) error {
	id := l.plan.Room
	if rep.Status == room.Success {
		if err := s.cli.Clear(id); err != nil {
			return err
		}
	} else if _, err := s.cli.Failure([]uint64{id}, true); err != nil { // failure_exception (clears)
		return err
	}
	s.results = append(s.results, Result{Room: id, Abort: l.plan.Abort, Status: rep.Status, Reason: rep.Reason, Elapsed: time.Since(l.opened)})
	s.release(l)
	return nil
}

func (s *loop) release(l *live) {
	s.free.put(l.pages)
	s.auxFree.put([]int32{int32(l.aux)})
	delete(s.live, l.plan.Room)
}

func summarize(rs []Result, wall time.Duration) Summary {
	sum := Summary{Rooms: len(rs), Outcomes: map[string]map[string]int{}, WallSecs: wall.Seconds()}
	var lat []time.Duration
	for _, r := range rs {
		if r.Pinned {
			sum.Pinned++
			continue
		}
		k := r.Abort.String()
		if sum.Outcomes[k] == nil {
			sum.Outcomes[k] = map[string]int{}
		}
		outcome := r.Status.String()
		if r.Reason != room.ReasonNone {
			outcome += "/" + r.Reason.String()
		}
		sum.Outcomes[k][outcome]++
		lat = append(lat, r.Elapsed)
		if r.Abort.ByPrefill() && r.Status == room.Success {
			sum.Unexpected = append(sum.Unexpected, fmt.Sprintf("room %d: prefill aborted it but it succeeded", r.Room))
		}
	}
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		sum.P50Millis = float64(lat[n/2]) / 1e6
		sum.P99Millis = float64(lat[min(n-1, n*99/100)]) / 1e6
	}
	if wall > 0 {
		sum.RoomsPerS = float64(len(rs)) / wall.Seconds()
	}
	return sum
}

type freeList struct{ free []int32 }

func newFreeList(n int) *freeList {
	f := &freeList{}
	for i := n - 1; i >= 0; i-- {
		f.free = append(f.free, int32(i))
	}
	return f
}

func (f *freeList) take(n int) []int32 {
	out := slices.Clone(f.free[len(f.free)-n:])
	f.free = f.free[:len(f.free)-n]
	return out
}

func (f *freeList) put(ps []int32) { f.free = append(f.free, ps...) }
