package sched

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/kvxfer/kvxfer/emul/pages"
	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/kv"
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
	PageSize    int  // tokens per page, for decode_prefix_len accounting
	Path        Path // PathShm (default) or PathReqRep
	// SpinMax is the shared-memory session's spin_max_us (ShmOptions.SpinMax):
	// how long kvxferd's consumer may keep spinning on the ring; 0: its default.
	SpinMax  time.Duration
	Progress func(done, total int)
}

// Result is one room's outcome on the prefill side.
type Result struct {
	Room    uint64
	Abort   workload.AbortKind
	Status  kv.Status
	Reason  kv.Reason
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
		kvmem.PatternRow(m.kv[off:off+sh.Item], r, b, j)
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

// Path is how the emulator talks to kvxferd.
type Path string

const (
	// PathShm: the shared-memory ring and status table (the default): no
	// call waits for kvxferd; each iteration is one pass over the table.
	PathShm Path = "shm"
	// PathReqRep: one request/reply round trip per call, one batched poll
	// per iteration (the control API as it was before the ring; kept for
	// side-by-side benchmarks).
	PathReqRep Path = "reqrep"
)

// driver is what the loop needs of a path.
type driver interface {
	open(id uint64) error
	init(id uint64, numPages, aux int) error
	send(id uint64, pages []int32) error
	abort(id uint64) error
	// finish is clear() for a room that succeeded, failure_exception() (which
	// clears) for one that failed.
	finish(id uint64, failed bool) error
	// prefixLen is pop_decode_prefix_len: r is the room's latest poll answer.
	prefixLen(id uint64, r kv.Reply) (int, error)
	poll(ids []uint64, out []kv.Reply) ([]kv.Reply, error)
}

type shmDriver struct{ s *control.ShmClient }

func (d shmDriver) open(id uint64) error                        { return d.s.Open(id) }
func (d shmDriver) init(id uint64, n, aux int) error            { return d.s.Init(id, n, aux) }
func (d shmDriver) send(id uint64, pages []int32) error         { return d.s.Send(id, pages, nil) }
func (d shmDriver) abort(id uint64) error                       { return d.s.Abort(id) }
func (d shmDriver) finish(id uint64, _ bool) error              { return d.s.Clear(id) }
func (d shmDriver) prefixLen(_ uint64, r kv.Reply) (int, error) { return r.PrefixLen, nil }
func (d shmDriver) poll(ids []uint64, out []kv.Reply) ([]kv.Reply, error) {
	return d.s.Poll(ids, out)
}

type rrDriver struct{ c *control.Client }

func (d rrDriver) open(id uint64) error {
	_, err := d.c.Open(id, "")
	return err
}
func (d rrDriver) init(id uint64, n, aux int) error    { return d.c.Init(id, n, aux) }
func (d rrDriver) send(id uint64, pages []int32) error { return d.c.Send(id, pages, nil) }
func (d rrDriver) abort(id uint64) error               { return d.c.Abort(id) }
func (d rrDriver) finish(id uint64, failed bool) error {
	if !failed {
		return d.c.Clear(id)
	}
	_, err := d.c.Failure([]uint64{id}, true)
	return err
}
func (d rrDriver) prefixLen(id uint64, _ kv.Reply) (int, error) {
	pl, err := d.c.PopDecodePrefixLen([]uint64{id})
	if err != nil || len(pl) == 0 {
		return 0, err
	}
	return pl[0], nil
}
func (d rrDriver) poll(ids []uint64, out []kv.Reply) ([]kv.Reply, error) {
	return d.c.Poll(ids, out)
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
	if cfg.Path == "" {
		cfg.Path = PathShm
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
	var drv driver
	switch cfg.Path {
	case PathShm:
		shm, err := control.AttachShm(cli, control.ShmOptions{Slots: max(2*cfg.Concurrency, 64), SpinMax: cfg.SpinMax})
		if err != nil {
			return nil, Summary{}, fmt.Errorf("sched: shm_attach: %w", err)
		}
		defer shm.Close()
		drv = shmDriver{shm}
	case PathReqRep:
		drv = rrDriver{cli}
	default:
		return nil, Summary{}, fmt.Errorf("sched: unknown path %q (shm or reqrep)", cfg.Path)
	}
	s := &loop{cfg: cfg, mem: mem, drv: drv, free: pages.New(cfg.Shape.Slots), auxFree: pages.New(cfg.Shape.AuxSlots)}
	return s.run()
}

type loop struct {
	cfg     Config
	mem     *memory
	drv     driver
	free    *pages.Pool // prefill KV pages
	auxFree *pages.Pool
	live    []*live // the queued rooms, in admission order
	results []Result
	moved   bool // the pass changed something
}

// run is the scheduler's event loop: each iteration admits new requests,
// reads every queued room's status in one pass (one table read on the shm
// path, one batched poll on reqrep), and acts on what changed. An iteration
// that changed nothing parks for a millisecond (the emulated forward pass;
// nothing below 1 ms, which fires at ~1.1 ms here anyway).
func (s *loop) run() ([]Result, Summary, error) {
	start := time.Now()
	next := 0
	var ids []uint64
	var replies []kv.Reply
	lastProgress := time.Now()
	for next < s.cfg.Rooms || len(s.live) > 0 {
		s.moved = false
		for next < s.cfg.Rooms && len(s.live) < s.cfg.Concurrency {
			if s.cfg.Rate > 0 && time.Since(start).Seconds()*s.cfg.Rate < float64(next) {
				break
			}
			if err := s.open(s.cfg.Workload.Plan(next)); err != nil {
				return nil, Summary{}, err
			}
			next++
			s.moved = true
		}
		ids = ids[:0]
		for _, l := range s.live {
			ids = append(ids, l.plan.Room)
		}
		var err error
		if replies, err = s.drv.poll(ids, replies); err != nil {
			return nil, Summary{}, err
		}
		// One clock read per pass for the pinned-room check (a read per
		// queued room per pass was 1 % of the machine); a terminal room's
		// time-to-terminal still reads the clock when it is seen.
		now := time.Now()
		queued := s.live
		s.live = s.live[:0:0]
		for i, l := range queued {
			keep, err := s.step(l, replies[i], now)
			if err != nil {
				return nil, Summary{}, err
			}
			if keep {
				s.live = append(s.live, l)
			}
		}
		if s.cfg.Progress != nil && now.Sub(lastProgress) >= time.Second {
			lastProgress = now
			s.cfg.Progress(len(s.results), s.cfg.Rooms)
		}
		if !s.moved {
			time.Sleep(time.Millisecond)
		}
	}
	return s.results, summarize(s.results, time.Since(start)), nil
}

func (s *loop) open(p workload.Plan) error {
	aux, ok := s.auxFree.TryTake(1)
	if !ok {
		return fmt.Errorf("sched: no free aux slot of %d (raise the shape's aux slots or lower the concurrency)", s.cfg.Shape.AuxSlots)
	}
	l := &live{plan: p, opened: time.Now(), aux: int(aux[0])}
	if l.pages, ok = s.free.TryTake(p.Pages); !ok {
		s.auxFree.Put(aux)
		return fmt.Errorf("sched: %d prefill pages wanted, %d of %d held (raise the shape's slots or lower the concurrency)", p.Pages, s.free.Held(), s.cfg.Shape.Slots)
	}
	for j, slot := range l.pages {
		s.mem.fillPage(p.Room, int(slot), j)
	}
	s.mem.writeAux(l.aux, p.Room)
	if err := s.drv.open(p.Room); err != nil {
		return err
	}
	s.live = append(s.live, l)
	return nil
}

// step advances one room by what its status said, as prefill.py does; keep
// is false once the room left the queues. now is the pass's clock reading.
func (s *loop) step(l *live, rep kv.Reply, now time.Time) (keep bool, err error) {
	id := l.plan.Room
	if rep.Status.Terminal() {
		return false, s.finish(l, rep)
	}
	if now.Sub(l.opened) > s.cfg.Grace {
		s.results = append(s.results, Result{Room: id, Abort: l.plan.Abort, Status: rep.Status, Pinned: true, Elapsed: now.Sub(l.opened)})
		s.release(l)
		return false, nil
	}
	if l.phase != bootstrapQueue || rep.Status != kv.StatusWaitingForInput {
		return true, nil
	}
	s.moved = true
	// finalize_bootstrap: pop the decode prefix, init, then the forward pass
	// and its chunked sends.
	if _, err := s.drv.prefixLen(id, rep); err != nil {
		return true, err
	}
	if err := s.drv.init(id, l.plan.Pages, l.aux); err != nil {
		return true, err
	}
	l.phase = inflightQueue
	if l.plan.Abort == workload.AbortPrefillClient {
		return true, s.drv.abort(id)
	}
	next := 0
	for c, n := range l.plan.Chunks {
		if err := s.drv.send(id, l.pages[next:next+n]); err != nil {
			return true, err
		}
		next += n
		if c == 0 && l.plan.Abort == workload.AbortPrefillMidTransfer {
			return true, s.drv.abort(id)
		}
	}
	return true, nil
}

func (s *loop) finish(l *live, rep kv.Reply) error {
	s.moved = true
	if err := s.drv.finish(l.plan.Room, rep.Status != kv.StatusSuccess); err != nil {
		return err
	}
	s.results = append(s.results, Result{Room: l.plan.Room, Abort: l.plan.Abort, Status: rep.Status, Reason: rep.Reason, Elapsed: time.Since(l.opened)})
	s.release(l)
	return nil
}

func (s *loop) release(l *live) {
	s.free.Put(l.pages)
	s.auxFree.Put([]int32{int32(l.aux)})
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
		if r.Reason != kv.ReasonNone {
			outcome += "/" + r.Reason.String()
		}
		sum.Outcomes[k][outcome]++
		lat = append(lat, r.Elapsed)
		if r.Abort.ByPrefill() && r.Status == kv.StatusSuccess {
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
