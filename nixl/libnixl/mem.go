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
	return b, nil
}

func unmap(full []byte) error { return syscall.Munmap(full) }
