package daemon

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// WithFileMapping gives a NIXL agent that cannot map files itself (the libnixl
// backend) the Attach the daemon needs: the scheduler's shared-memory file is
// mapped shared into this process and registered like any host memory. The
// mappings are released when the agent closes. The file is checked as the
// loopback backend checks it (loopback.OpenAttachable). Copies out of it are the
// library's (C, often the NIC's), so a scheduler truncating its file under a
// live transfer is outside what Go can guard here; do not truncate live pools.
func WithFileMapping(a nixl.Agent) Agent {
	f := &fileMapped{Agent: a}
	w, d := progressOf(a)
	switch {
	case w != nil && d != nil:
		return &struct {
			*fileMapped
			nixl.Waker
			nixl.Dueer
		}{f, w, d}
	case w != nil:
		return &struct {
			*fileMapped
			nixl.Waker
		}{f, w}
	}
	return f
}

type fileMapped struct {
	nixl.Agent
	// mu is an I/O boundary: the mmaps of the scheduler's memory files,
	// added by the NIXL agent's Attach (memory registration, on the control
	// API's goroutine) and unmapped by its Close. An owner does not fit: the
	// list is touched only around those two syscalls, each a handful of times
	// per process, and both callers must have the result before they return.
	mu   sync.Mutex
	maps [][]byte
}

// SendNotifs implements nixl.NotifBatcher (the agent's own, if it has one).
func (f *fileMapped) SendNotifs(peer string, msgs [][]byte) error {
	return nixl.SendNotifs(f.Agent, peer, msgs)
}

// Batch implements nixl.Batcher: the agent's own batch, if it has one.
func (f *fileMapped) Batch(fn func(nixl.Requests)) error { return nixl.InBatch(f.Agent, fn) }

// PollsItself implements nixl.SelfPoller: the agent's own answer.
func (f *fileMapped) PollsItself() bool { return nixl.PollsItself(f.Agent) }

func (f *fileMapped) Attach(path string) ([]byte, error) {
	// The same checks as the loopback backend's Attach: a regular file of
	// ours, writable by no one else, not reached through a final symlink.
	fd, size, err := loopback.OpenAttachable(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	return f.mapFile(fd, size)
}

// AttachFile maps an open memory file (a sealed memfd the scheduler passed).
func (f *fileMapped) AttachFile(fd *os.File) ([]byte, error) {
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", fd.Name(), err)
	}
	if !st.Mode().IsRegular() || st.Size() <= 0 {
		return nil, fmt.Errorf("attach %s: not a non-empty regular file", fd.Name())
	}
	return f.mapFile(fd, st.Size())
}

func (f *fileMapped) mapFile(fd *os.File, size int64) ([]byte, error) {
	b, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("attach %s: mmap: %w", fd.Name(), err)
	}
	f.mu.Lock()
	f.maps = append(f.maps, b)
	f.mu.Unlock()
	return b, nil
}

// Close closes the agent first (it deregisters the memory), then unmaps.
func (f *fileMapped) Close() error {
	err := f.Agent.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.maps {
		err = errors.Join(err, syscall.Munmap(b))
	}
	f.maps = nil
	return err
}
