package dict

import (
	"sync"

	"github.com/kvxfer/kvxfer/kv"
)

// Point names a place in the engine's goroutines where a race window opens.
// Upstream's windows are GIL switches, which happen anywhere and rarely; a hook
// at a Point turns one of them into a place a test can stop at on purpose.
type Point uint8

const (
	// BootstrapBeforeInsert: the transfer-info handler, before
	// transfer_infos[room][agent] = info.
	BootstrapBeforeInsert Point = iota
	// BootstrapBeforeAbort: the ABORT handler, before its membership test.
	BootstrapBeforeAbort
	// WorkerDequeued: a worker took a chunk off its queue, before its checks.
	WorkerDequeued
	// WorkerBeforeTransferring: the checks passed, before update(Transferring).
	WorkerBeforeTransferring
	// WorkerPosted: every write of the chunk was posted, before the worker
	// waits for them (the chunk's transfer window is open).
	WorkerPosted
	// WorkerBeforeFinish: every write completed, before the closing update
	// (Transferring, or Success on the last chunk).
	WorkerBeforeFinish
	// WorkerDone: the worker finished with the chunk (sent, skipped or failed).
	WorkerDone
	// UpdateBetweenReadAndWrite: inside upstream's update_status, after its
	// sticky-Failed check and before the write. Fires on every update, from
	// every goroutine; Event.Status is the status being written.
	UpdateBetweenReadAndWrite
	numPoints
)

var pointNames = [numPoints]string{
	"bootstrap-before-insert", "bootstrap-before-abort", "worker-dequeued",
	"worker-before-transferring", "worker-posted", "worker-before-finish",
	"worker-done", "update-between-read-and-write",
}

func (p Point) String() string {
	if p < numPoints {
		return pointNames[p]
	}
	return "point?"
}

// Event is what a hook sees.
type Event struct {
	Point  Point
	Room   uint64
	Chunk  int       // worker points: the chunk id
	Last   bool      // worker points: the chunk is the last
	Status kv.Status // UpdateBetweenReadAndWrite: the status being written
	Skip   bool      // WorkerDone: the chunk was skipped or failed, not sent
}

// Hooks holds the callbacks; the zero value has none and costs one read lock
// per point reached. Callbacks run in the engine goroutine that reached the
// point and may block it.
type Hooks struct {
	mu  sync.RWMutex
	fns [numPoints][]*hookFn
}

type hookFn struct{ fn func(Event) }

// On adds fn at p and returns a function that removes it.
func (h *Hooks) On(p Point, fn func(Event)) (remove func()) {
	f := &hookFn{fn: fn}
	h.mu.Lock()
	h.fns[p] = append(h.fns[p], f)
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		list := h.fns[p]
		for i, g := range list {
			if g == f {
				h.fns[p] = append(list[:i:i], list[i+1:]...)
				return
			}
		}
	}
}

func (h *Hooks) at(ev Event) {
	if h == nil {
		return
	}
	h.mu.RLock()
	list := h.fns[ev.Point]
	h.mu.RUnlock()
	for _, f := range list {
		f.fn(ev)
	}
}

// Pausepoint holds the first event that matched at its point until Release.
type Pausepoint struct {
	// Reached is closed when a goroutine stopped at the point; Event is set then.
	Reached chan struct{}
	Event   Event
	release chan struct{}
	once    sync.Once
	remove  func()
}

// Pause stops the first goroutine that reaches p with an event for which match
// returns true (nil matches all), until Release. Later events pass.
func Pause(h *Hooks, p Point, match func(Event) bool) *Pausepoint {
	pp := &Pausepoint{Reached: make(chan struct{}), release: make(chan struct{})}
	var mu sync.Mutex
	fired := false
	pp.remove = h.On(p, func(ev Event) {
		if match != nil && !match(ev) {
			return
		}
		mu.Lock()
		first := !fired
		fired = true
		mu.Unlock()
		if !first {
			return
		}
		pp.Event = ev
		close(pp.Reached)
		<-pp.release
	})
	return pp
}

// Release lets the paused goroutine go on (or lets the first match pass
// without stopping) and removes the hook. It is idempotent.
func (pp *Pausepoint) Release() {
	pp.once.Do(func() {
		close(pp.release)
		if pp.remove != nil {
			pp.remove()
		}
	})
}

// Inert returns a Pausepoint that is already reached and released, for
// engines without hooks (the actor engine has no windows to widen).
func Inert() *Pausepoint {
	pp := &Pausepoint{Reached: make(chan struct{}), release: make(chan struct{})}
	close(pp.Reached)
	pp.Release()
	return pp
}

// Watch returns a channel closed when an event at p first matches; it never
// blocks the engine.
func Watch(h *Hooks, p Point, match func(Event) bool) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	var remove func()
	var mu sync.Mutex
	mu.Lock()
	remove = h.On(p, func(ev Event) {
		if match != nil && !match(ev) {
			return
		}
		once.Do(func() {
			close(ch)
			mu.Lock() // remove is assigned once On returned
			r := remove
			mu.Unlock()
			r()
		})
	})
	mu.Unlock()
	return ch
}

// ForRoom matches events of one room; ForChunk of one chunk of one room.
func ForRoom(id uint64) func(Event) bool { return func(ev Event) bool { return ev.Room == id } }

func ForChunk(id uint64, chunk int) func(Event) bool {
	return func(ev Event) bool { return ev.Room == id && ev.Chunk == chunk }
}

// HasPoint reports whether the engine ever reaches p: Fixed updates a status
// in one atomic step, so it has no UpdateBetweenReadAndWrite window.
func (e *Engine) HasPoint(p Point) bool {
	return p < numPoints && !(e.fixed && p == UpdateBetweenReadAndWrite)
}
