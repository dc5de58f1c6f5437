package control

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"

	"github.com/kvxfer/kvxfer/nixl"
)

// BufferKind says which KVArgs list a registration describes.
type BufferKind string

const (
	KindKV    BufferKind = "kv"    // kv_data_*: one buffer per layer (K then V for MHA)
	KindAux   BufferKind = "aux"   // aux_data_*: the metadata buffers, always DRAM
	KindState BufferKind = "state" // state_data_* of one hybrid-state component
)

// CUDAIPCHandleSize is the size of a cudaIpcMemHandle_t / CUipcMemHandle.
const CUDAIPCHandleSize = 64

// ShmDir is where a bare shared-memory name lives (Python's
// multiprocessing.shared_memory and POSIX shm_open both use it on Linux).
const ShmDir = "/dev/shm"

// Region is one buffer of a registration: where the daemon finds the bytes the
// scheduler's KVArgs pointer refers to. The scheduler process and kvxferd share memory
// by a memory file kvxferd inherited from the scheduler at exec (Memfd), by a named
// file (Shm, a /dev/shm name or an absolute path, mapped at Offset), or, for GPU
// memory, by a CUDA IPC handle. Exactly one of the three is set.
type Region struct {
	// Shm is a bare name under ShmDir (e.g. Python's SharedMemory.name) or an
	// absolute, clean path.
	Shm string
	// Memfd is the descriptor number of a memory file (memfd) that kvxferd's
	// parent passed it at exec and named in -memfd; no other descriptor is
	// accepted, so a client can only name memory kvxferd was given. 0 is unset
	// (descriptor 0 is standard input).
	Memfd   int64
	Offset  uint64 // byte offset of the buffer inside the file
	Length  uint64 // data_len: bytes of the whole buffer
	ItemLen uint64 // item_len: bytes of one slot (one page of one layer for KV)
	Mem     nixl.MemKind
	Dev     uint64 // GPU index for VRAM; 0 for DRAM
	// CUDAIPC is the cudaIpcMemHandle_t (64 bytes) of the device allocation
	// that holds a VRAM buffer; Offset is then the buffer's offset from the
	// allocation base and Dev the GPU. The control layer checks the shape; the
	// daemon opens it (daemon/vram.go, docs/vram.md) and refuses a handle it
	// cannot open, a wrong device or no GPU access at registration.
	CUDAIPC []byte
}

// Path is the named file that backs the region ("" for a memfd or CUDA IPC region).
func (g Region) Path() string {
	if g.Shm == "" || strings.HasPrefix(g.Shm, "/") {
		return g.Shm
	}
	return filepath.Join(ShmDir, g.Shm)
}

// Slots is Length / ItemLen.
func (g Region) Slots() uint64 {
	if g.ItemLen == 0 {
		return 0
	}
	return g.Length / g.ItemLen
}

// MemoryRegistration describes one KVArgs buffer list: what register_memory carries.
// It maps onto nixl/sglang.Buffers (one ItemLen per buffer, one slot count, one memory
// kind and device for the list).
type MemoryRegistration struct {
	Kind BufferKind
	// Component and StateType identify a state list (state_types[Component]); both
	// are zero for kv and aux.
	Component int
	StateType string
	Buffers   []Region
}

// NumSlots is the common slot count of the buffers (valid after Validate).
func (m *MemoryRegistration) NumSlots() int {
	if len(m.Buffers) == 0 {
		return 0
	}
	return int(m.Buffers[0].Slots())
}

// Validate checks what the control layer can check without touching memory, with
// the same rules nixl/sglang applies to a Local geometry: a homogeneous list (one
// memory kind and device, one slot count), whole slots, aux in DRAM on device 0, and a
// source that is exactly one of a file or a CUDA IPC handle. Errors have
// CodeInvalidMemory.
func (m *MemoryRegistration) Validate() error {
	bad := func(format string, args ...any) error {
		return errorf(CodeInvalidMemory, "%s: "+format, append([]any{m.Kind}, args...)...)
	}
	switch m.Kind {
	case KindKV, KindAux:
		if m.Component != 0 || m.StateType != "" {
			return bad("component and state_type are for state only")
		}
	case KindState:
		if m.Component < 0 || m.Component > math.MaxInt16 {
			return bad("component %d out of range", m.Component)
		}
	default:
		return errorf(CodeInvalidMemory, "kind %q is not kv, aux or state", m.Kind)
	}
	if len(m.Buffers) == 0 {
		return bad("no buffers")
	}
	first := m.Buffers[0]
	for i, g := range m.Buffers {
		if msg := g.validate(); msg != "" {
			return bad("buffer %d: %s", i, msg)
		}
		if g.Mem != first.Mem || g.Dev != first.Dev {
			return bad("buffer %d is %s device %d, buffer 0 is %s device %d: one list must be homogeneous", i, g.Mem, g.Dev, first.Mem, first.Dev)
		}
		if g.Slots() != first.Slots() {
			return bad("buffer %d has %d slots, buffer 0 has %d", i, g.Slots(), first.Slots())
		}
	}
	if m.Kind == KindAux && (first.Mem != nixl.DRAM || first.Dev != 0) {
		return bad("aux buffers must be DRAM device 0")
	}
	if uint64(len(m.Buffers))*first.Slots() > math.MaxInt32 {
		return bad("%d buffers × %d slots exceed int32 descriptor indices", len(m.Buffers), first.Slots())
	}
	return nil
}

func (g Region) validate() string {
	switch {
	case !g.Mem.Valid():
		return fmt.Sprintf("memory kind %s", g.Mem)
	case g.Mem == nixl.DRAM && g.Dev != 0:
		return fmt.Sprintf("DRAM on device %d", g.Dev)
	case g.ItemLen == 0 || g.Length == 0:
		return fmt.Sprintf("length %d, item length %d: both must be positive", g.Length, g.ItemLen)
	case g.Length%g.ItemLen != 0:
		return fmt.Sprintf("length %d is not a whole number of %d-byte items", g.Length, g.ItemLen)
	case g.Offset+g.Length < g.Offset || g.Offset+g.Length > math.MaxInt64:
		return fmt.Sprintf("offset %d + length %d overflows", g.Offset, g.Length)
	case g.Memfd < 0 || g.Memfd > math.MaxInt32:
		return fmt.Sprintf("memfd %d out of range", g.Memfd)
	case g.sources() != 1:
		return "exactly one of shm, memfd and cuda_ipc must be set"
	case len(g.CUDAIPC) > 0 && g.Mem != nixl.VRAM:
		return "cuda_ipc is for VRAM only"
	case len(g.CUDAIPC) > 0 && len(g.CUDAIPC) != CUDAIPCHandleSize:
		return fmt.Sprintf("cuda_ipc is %d bytes; a cudaIpcMemHandle_t is %d", len(g.CUDAIPC), CUDAIPCHandleSize)
	}
	if g.Shm != "" {
		return checkShm(g.Shm)
	}
	return ""
}

func (g Region) sources() int {
	n := 0
	if g.Shm != "" {
		n++
	}
	if g.Memfd != 0 {
		n++
	}
	if len(g.CUDAIPC) > 0 {
		n++
	}
	return n
}

// checkShm accepts a bare file name (no slash, not "." or "..") or an absolute path in
// clean form, so the daemon never resolves a relative or dot-dot path it was handed.
func checkShm(s string) string {
	switch {
	case strings.ContainsRune(s, 0):
		return "shm contains NUL"
	case len(s) > 4096:
		return "shm path too long"
	case strings.HasPrefix(s, "/"):
		if filepath.Clean(s) != s {
			return fmt.Sprintf("shm path %q is not clean", s)
		}
	case strings.ContainsRune(s, '/') || s == "." || s == "..":
		return fmt.Sprintf("shm %q is neither a bare name nor an absolute path", s)
	}
	return ""
}

// field decodes one register_memory field into m.
func (m *MemoryRegistration) field(r *reader, key string) error {
	switch key {
	case "kind":
		s, err := r.readStr()
		m.Kind = BufferKind(s)
		return err
	case "component":
		v, err := r.readInt()
		if err == nil && (v < math.MinInt32 || v > math.MaxInt32) {
			return wireError("component out of range")
		}
		m.Component = int(v)
		return err
	case "state_type":
		if r.isNil() {
			return nil
		}
		s, err := r.readStr()
		m.StateType = s
		return err
	case "buffers":
		n, err := r.readArrayHeader()
		if err != nil {
			return err
		}
		if n > maxBatch {
			return wireError("too many buffers")
		}
		m.Buffers = make([]Region, n)
		for i := range m.Buffers {
			if err := m.Buffers[i].decode(r); err != nil {
				return fmt.Errorf("buffers[%d]: %w", i, err)
			}
		}
	}
	return nil
}

func (g *Region) decode(r *reader) error {
	n, err := r.readMapHeader()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		key, err := r.strBytes()
		if err != nil {
			return err
		}
		switch string(key) {
		case "shm":
			g.Shm, err = r.readStr()
		case "memfd":
			g.Memfd, err = r.readInt()
		case "offset":
			g.Offset, err = r.readUint()
		case "length":
			g.Length, err = r.readUint()
		case "item_len":
			g.ItemLen, err = r.readUint()
		case "mem":
			var s []byte
			if s, err = r.strBytes(); err == nil {
				g.Mem, err = parseMemKind(string(s))
			}
		case "dev":
			g.Dev, err = r.readUint()
		case "cuda_ipc":
			if !r.isNil() {
				var b []byte
				b, err = r.readBin()
				g.CUDAIPC = append([]byte(nil), b...)
			}
		default:
			err = r.skip()
		}
		if err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
	}
	return nil
}

func parseMemKind(s string) (nixl.MemKind, error) {
	switch s {
	case "DRAM":
		return nixl.DRAM, nil
	case "VRAM":
		return nixl.VRAM, nil
	}
	return 0, wireError(fmt.Sprintf("mem %q is not DRAM or VRAM", s))
}

// appendMemory encodes m as register_memory fields (without the map header): 4 entries.
func appendMemory(b []byte, m *MemoryRegistration) []byte {
	b = appendStr(appendStr(b, "kind"), string(m.Kind))
	b = appendInt(appendStr(b, "component"), int64(m.Component))
	b = appendStr(appendStr(b, "state_type"), m.StateType)
	b = appendArrayHeader(appendStr(b, "buffers"), len(m.Buffers))
	for _, g := range m.Buffers {
		b = appendMapHeader(b, 8)
		b = appendStr(appendStr(b, "shm"), g.Shm)
		b = appendInt(appendStr(b, "memfd"), g.Memfd)
		b = appendUint(appendStr(b, "offset"), g.Offset)
		b = appendUint(appendStr(b, "length"), g.Length)
		b = appendUint(appendStr(b, "item_len"), g.ItemLen)
		b = appendStr(appendStr(b, "mem"), g.Mem.String())
		b = appendUint(appendStr(b, "dev"), g.Dev)
		b = appendStr(b, "cuda_ipc")
		if len(g.CUDAIPC) == 0 {
			b = appendNil(b)
		} else {
			b = appendBin(b, g.CUDAIPC)
		}
	}
	return b
}
