package nixl

import "sync"

// Wakers is the registry behind a backend's Waker: OnProgress adds a wake-up,
// Wake calls them all. Wake-ups run under the registry's lock, so none is
// called after its stop returned; they must not call back into the agent.
// The zero value is ready to use.
type Wakers struct {
	mu  sync.Mutex
	seq uint64
	fns map[uint64]func()
}

// OnProgress registers wake; stop removes it.
func (w *Wakers) OnProgress(wake func()) (stop func()) {
	w.mu.Lock()
	id := w.seq
	w.seq++
	if w.fns == nil {
		w.fns = map[uint64]func(){}
	}
	w.fns[id] = wake
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.fns, id)
		w.mu.Unlock()
	}
}

// Wake calls every registered wake-up.
func (w *Wakers) Wake() {
	w.mu.Lock()
	for _, f := range w.fns {
		f()
	}
	w.mu.Unlock()
}
