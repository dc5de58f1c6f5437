package daemon

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/kvxfer/kvxfer/nixl"
)

// WithFileMapping gives a NIXL agent that cannot map files itself (the libnixl
// backend) the Attach the daemon needs: the scheduler's shared-memory file is
// mapped shared into this process and registered like any host memory. The
// mappings are released when the agent closes.
func WithFileMapping(a nixl.Agent) Agent { return &fileMapped{Agent: a} }

type fileMapped struct {
	nixl.Agent
	mu   sync.Mutex
	maps [][]byte
}

func (f *fileMapped) Attach(path string) ([]byte, error) {
	fd, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", path, err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() <= 0 {
		return nil, fmt.Errorf("attach %s: empty file", path)
	}
	b, err := syscall.Mmap(int(fd.Fd()), 0, int(st.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("attach %s: mmap: %w", path, err)
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
