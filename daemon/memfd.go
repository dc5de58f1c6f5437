package daemon

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Memfds are the memory files (memfd_create) that kvxferd's parent, the SGLang
// scheduler, allocated its host KV, state and aux pools in and passed at exec.
// They carry no name anyone could redirect: register_memory names one by its
// descriptor number, and only numbers given here are accepted.
type Memfds map[int]*os.File

// maxMemfds caps -memfd (a model of 128 layers has 256 KV buffers, plus aux and
// state lists).
const maxMemfds = 4096

// requiredSeals are the seals a memfd must carry: a file that can no longer
// shrink cannot take pages away from under a transfer (no SIGBUS), and one
// that cannot grow keeps its size as registered.
const requiredSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// OpenMemfds takes the inherited descriptors of a -memfd list ("5,6,7"): each
// must be a sealed memfd (F_SEAL_SHRINK and F_SEAL_GROW), a regular file of
// positive size. They are set close-on-exec.
func OpenMemfds(list string) (Memfds, error) {
	out := Memfds{}
	if strings.TrimSpace(list) == "" {
		return out, nil
	}
	parts := strings.Split(list, ",")
	if len(parts) > maxMemfds {
		return nil, fmt.Errorf("-memfd: %d descriptors, at most %d", len(parts), maxMemfds)
	}
	for _, p := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 3 || n > 1<<20 {
			out.Close()
			return nil, fmt.Errorf("-memfd: %q is not a descriptor number above 2", p)
		}
		if _, dup := out[n]; dup {
			out.Close()
			return nil, fmt.Errorf("-memfd: descriptor %d given twice", n)
		}
		if err := checkMemfd(n); err != nil {
			out.Close()
			return nil, fmt.Errorf("-memfd: descriptor %d: %w", n, err)
		}
		unix.CloseOnExec(n)
		out[n] = os.NewFile(uintptr(n), "memfd:"+strconv.Itoa(n))
	}
	return out, nil
}

func checkMemfd(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("not open (%v)", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("not a regular file (mode %#o)", st.Mode)
	}
	if st.Size <= 0 {
		return fmt.Errorf("empty file")
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("not a memfd (F_GET_SEALS: %v)", err)
	}
	if seals&requiredSeals != requiredSeals {
		return fmt.Errorf("memfd seals %#x lack F_SEAL_SHRINK|F_SEAL_GROW (%#x)", seals, requiredSeals)
	}
	return nil
}

// Numbers lists the descriptors in order.
func (m Memfds) Numbers() []int {
	out := make([]int, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	sort.Ints(out)
	return out
}

// Close closes every descriptor (their mappings stay valid until unmapped).
func (m Memfds) Close() {
	for n, f := range m {
		f.Close()
		delete(m, n)
	}
}
