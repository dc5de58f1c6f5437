package loopback

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"github.com/kvxfer/kvxfer/nixl"
)

// mapping is one shared-memory file mapped into this process: either one of our
// own allocations or a peer's file. Its bytes are never Go heap.
type mapping struct {
	path string
	data []byte // the whole mapping, len == file size
	// unmapped is set (under Agent.copyMu held for writing) when data is gone;
	// workers check it under copyMu held for reading before touching data.
	unmapped bool
	// regs counts local registrations inside this mapping (own allocations only).
	regs int
	// attached: another process's file mapped by Attach; never deleted here.
	attached bool
	// peer: a peer's segment mapped by LoadPeer.
	peer bool
}

func (m *mapping) base() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m.data)))) }

// contains reports whether [addr, addr+n) is inside the mapping and returns the offset.
func (m *mapping) contains(addr, n uint64) (uint64, bool) {
	b := m.base()
	if addr < b || addr+n < addr || addr+n > b+uint64(len(m.data)) {
		return 0, false
	}
	return addr - b, true
}

// shmRoot is where agent directories live: /dev/shm (tmpfs, so files are memory)
// when it exists, else the system temp directory.
func shmRoot() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

var pageSize = uint64(os.Getpagesize())

// createMapping creates a file of at least n bytes (rounded up to a page) and maps it shared.
func createMapping(path string, n int) (*mapping, error) {
	if n <= 0 {
		return nil, nixl.Errorf(nixl.ErrInvalid, "loopback: alloc %d bytes", n)
	}
	size := (uint64(n) + pageSize - 1) / pageSize * pageSize
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, segMode)
	if err != nil {
		return nil, nixl.Errorf(nixl.ErrBackend, "loopback: create %s: %v", path, err)
	}
	defer f.Close()
	if err := f.Chmod(segMode); err != nil { // exact, whatever the umask: peers check it
		os.Remove(path)
		return nil, nixl.Errorf(nixl.ErrBackend, "loopback: chmod %s: %v", path, err)
	}
	if err := f.Truncate(int64(size)); err != nil {
		os.Remove(path)
		return nil, nixl.Errorf(nixl.ErrBackend, "loopback: truncate %s: %v", path, err)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, nixl.Errorf(nixl.ErrBackend, "loopback: mmap %s: %v", path, err)
	}
	return &mapping{path: path, data: data}, nil
}

// mapShared maps the first size bytes of the open file f read-write, shared.
func mapShared(f *os.File, size uint64) (*mapping, error) {
	if size == 0 || size > uint64(maxMapLen) {
		return nil, nixl.Errorf(nixl.ErrInvalid, "loopback: mapping of %d bytes of %s", size, f.Name())
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, nixl.Errorf(nixl.ErrBackend, "loopback: mmap %s: %v", f.Name(), err)
	}
	return &mapping{path: f.Name(), data: data}, nil
}

// maxMapLen bounds one mapping (an int on every platform this builds for).
const maxMapLen = 1<<62 - 1

// unmap releases the mapping; the caller holds Agent.copyMu for writing.
func (m *mapping) unmap() error {
	if m.unmapped {
		return nil
	}
	m.unmapped = true
	// m.data keeps its header (never dereferenced again) so that readers of the
	// slice header under other locks do not race with this write.
	err := syscall.Munmap(m.data)
	if err != nil {
		return fmt.Errorf("loopback: munmap %s: %w", m.path, err)
	}
	return nil
}
