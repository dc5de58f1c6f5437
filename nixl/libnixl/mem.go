package libnixl

import (
	"fmt"
	"os"
	"syscall"
)

// mmap maps n bytes (rounded up to whole pages) of private anonymous memory and
// returns the whole mapping (syscall.Munmap needs it unsliced). UCX registers it
// with ucp_mem_map; the Go runtime never moves or frees it.
func mmap(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("libnixl: Alloc(%d)", n)
	}
	pg := os.Getpagesize()
	size := (n + pg - 1) / pg * pg
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("libnixl: mmap %d bytes: %w", size, err)
	}
	if size >= hugePage {
		// Transparent huge pages where the kernel only gives them on request
		// (THP "madvise", Debian's default): far fewer pages for UCX to pin and
		// for cma's process_vm_writev to walk. numpy does the same for large
		// arrays, which is what the Python side of a comparison gets. Advisory.
		_ = syscall.Madvise(b, madvHugepage)
	}
	return b, nil
}

const (
	hugePage     = 2 << 20
	madvHugepage = 14 // MADV_HUGEPAGE
)

func unmap(full []byte) error { return syscall.Munmap(full) }
