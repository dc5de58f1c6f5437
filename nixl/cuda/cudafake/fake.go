// Package cudafake is a small in-memory fake of the CUDA driver entry points
// kvxfer uses (cuda.Driver), for tests of IPC handle bookkeeping, error paths
// and registration messages on machines without a GPU. It is never what
// proves the GPU path works: that is scripts/gpu-check.sh on an NVIDIA box.
//
// A GPU is one host's devices; each Process is one process's view of them
// (its own address space, its own opened handles), so exporter and importer
// can be two "processes" of one test. What the fake models, as the CUDA
// documentation describes it: a handle names an allocation base; opening it
// in the exporting process fails (CUDA_ERROR_INVALID_CONTEXT); opening the
// same handle twice in one process returns the same base and counts
// references; a freed allocation's handle no longer opens; memory on another
// device opens only with peer access; every copy is bounds-checked.
package cudafake

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/nixl/cuda"
)

// GPU is the devices of one host.
type GPU struct {
	mu      sync.Mutex
	devices int
	noPeer  bool
	next    uint64
	allocID uint64
	handles map[cuda.Handle]*alloc
}

type alloc struct {
	id    uint64
	dev   int
	data  []byte
	owner *Process
	freed bool
	h     cuda.Handle
}

// view is an allocation mapped into one process: its own or an opened handle.
type view struct {
	base uint64
	a    *alloc
	ipc  bool
	refs int
}

// Process is one process's view of the GPU; it implements cuda.Driver.
type Process struct {
	g      *GPU
	noGPU  bool
	views  []*view
	fail   map[string]int
	counts map[string]int
}

var _ cuda.Driver = (*Process)(nil)

// New returns a host with n devices, peer access between all of them.
func New(devices int) *GPU {
	return &GPU{devices: devices, next: 0x7f0000000000, handles: map[cuda.Handle]*alloc{}}
}

// NoPeerAccess makes handles of one device fail to open on another.
func (g *GPU) NoPeerAccess() { g.mu.Lock(); g.noPeer = true; g.mu.Unlock() }

// Process returns a new process on this host.
func (g *GPU) Process() *Process {
	return &Process{g: g, fail: map[string]int{}, counts: map[string]int{}}
}

// NoGPUProcess returns a process without GPU access (as if libcuda were absent).
func (g *GPU) NoGPUProcess() *Process {
	p := g.Process()
	p.noGPU = true
	return p
}

// FailNext makes the next call of op (a driver entry point name such as
// "cuMemcpyDtoD") fail with code.
func (p *Process) FailNext(op string, code int) {
	p.g.mu.Lock()
	p.fail[op] = code
	p.g.mu.Unlock()
}

// Calls is how many times op was called in this process.
func (p *Process) Calls(op string) int {
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	return p.counts[op]
}

// OpenHandles is the number of distinct handles open in this process.
func (p *Process) OpenHandles() int {
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	n := 0
	for _, v := range p.views {
		if v.ipc {
			n++
		}
	}
	return n
}

// enter counts the call and reports an injected or no-GPU failure (g.mu held).
func (p *Process) enter(op string) error {
	p.counts[op]++
	if p.noGPU {
		return fmt.Errorf("%w: loading the CUDA driver libcuda.so.1: cannot open shared object file (fake)", cuda.ErrNoGPU)
	}
	if c, ok := p.fail[op]; ok {
		delete(p.fail, op)
		return cuda.NewError(op, c, "")
	}
	return nil
}

func (p *Process) dev(op string, dev int) error {
	if dev < 0 || dev >= p.g.devices {
		return cuda.NewError(op, cuda.ErrInvalidDevice, "")
	}
	return nil
}

func (p *Process) find(ptr uint64) *view {
	for _, v := range p.views {
		if ptr >= v.base && ptr < v.base+uint64(len(v.a.data)) {
			return v
		}
	}
	return nil
}

// bytes is the memory [ptr, ptr+n) of this process.
func (p *Process) bytes(op string, ptr, n uint64) ([]byte, *alloc, error) {
	v := p.find(ptr)
	if v == nil || ptr+n < ptr || ptr+n > v.base+uint64(len(v.a.data)) {
		return nil, nil, cuda.NewError(op, cuda.ErrInvalidValue, "")
	}
	off := ptr - v.base
	return v.a.data[off : off+n], v.a, nil
}

func (g *GPU) reserve(n uint64) uint64 {
	b := g.next
	g.next += (n + 1<<21 - 1) &^ (1<<21 - 1)
	g.next += 1 << 21 // a gap, so that neighbouring allocations never touch
	return b
}

// DeviceCount implements cuda.Driver.
func (p *Process) DeviceCount() (int, error) {
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter("cuDeviceGetCount"); err != nil {
		return 0, err
	}
	return p.g.devices, nil
}

// IpcOpen implements cuda.Driver.
func (p *Process) IpcOpen(dev int, h cuda.Handle) (uint64, error) {
	const op = "cuIpcOpenMemHandle"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return 0, err
	}
	if err := p.dev(op, dev); err != nil {
		return 0, err
	}
	a := p.g.handles[h]
	switch {
	case a == nil || a.freed:
		return 0, cuda.NewError(op, cuda.ErrInvalidValue, "")
	case a.owner == p:
		return 0, cuda.NewError(op, cuda.ErrInvalidContext, "")
	case a.dev != dev && p.g.noPeer:
		return 0, cuda.NewError(op, cuda.ErrPeerUnsupported, "")
	}
	for _, v := range p.views {
		if v.ipc && v.a == a {
			v.refs++
			return v.base, nil
		}
	}
	v := &view{base: p.g.reserve(uint64(len(a.data))), a: a, ipc: true, refs: 1}
	p.views = append(p.views, v)
	return v.base, nil
}

// IpcClose implements cuda.Driver.
func (p *Process) IpcClose(dev int, ptr uint64) error {
	const op = "cuIpcCloseMemHandle"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return err
	}
	for i, v := range p.views {
		if v.ipc && v.base == ptr {
			if v.refs--; v.refs == 0 {
				p.views = append(p.views[:i], p.views[i+1:]...)
			}
			return nil
		}
	}
	return cuda.NewError(op, cuda.ErrInvalidValue, "")
}

// IpcGet implements cuda.Driver.
func (p *Process) IpcGet(dev int, ptr uint64) (cuda.Handle, error) {
	const op = "cuIpcGetMemHandle"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return cuda.Handle{}, err
	}
	v := p.find(ptr)
	if v == nil || v.ipc || v.base != ptr {
		return cuda.Handle{}, cuda.NewError(op, cuda.ErrInvalidValue, "")
	}
	return v.a.h, nil
}

// AddressRange implements cuda.Driver.
func (p *Process) AddressRange(dev int, ptr uint64) (uint64, uint64, error) {
	const op = "cuMemGetAddressRange"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return 0, 0, err
	}
	v := p.find(ptr)
	if v == nil {
		return 0, 0, cuda.NewError(op, cuda.ErrNotFound, "")
	}
	return v.base, uint64(len(v.a.data)), nil
}

// PointerDevice implements cuda.Driver.
func (p *Process) PointerDevice(dev int, ptr uint64) (int, error) {
	const op = "cuPointerGetAttribute"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return 0, err
	}
	v := p.find(ptr)
	if v == nil {
		return 0, cuda.NewError(op, cuda.ErrInvalidValue, "")
	}
	return v.a.dev, nil
}

// CopyDtoD implements cuda.Driver.
func (p *Process) CopyDtoD(dev int, dst, src, n uint64) error {
	const op = "cuMemcpyDtoD"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return err
	}
	d, _, err := p.bytes(op, dst, n)
	if err != nil {
		return err
	}
	s, _, err := p.bytes(op, src, n)
	if err != nil {
		return err
	}
	copy(d, s)
	return nil
}

// CopyPeer implements cuda.Driver: the memory must be on the devices named.
func (p *Process) CopyPeer(dstDev int, dst uint64, srcDev int, src uint64, n uint64) error {
	const op = "cuMemcpyPeer"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return err
	}
	d, da, err := p.bytes(op, dst, n)
	if err != nil {
		return err
	}
	s, sa, err := p.bytes(op, src, n)
	if err != nil {
		return err
	}
	if da.dev != dstDev || sa.dev != srcDev {
		return cuda.NewError(op, cuda.ErrInvalidValue, "")
	}
	copy(d, s)
	return nil
}

// CopyDtoH implements cuda.Driver.
func (p *Process) CopyDtoH(dev int, dst []byte, src uint64) error {
	const op = "cuMemcpyDtoH"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return err
	}
	s, _, err := p.bytes(op, src, uint64(len(dst)))
	if err != nil {
		return err
	}
	copy(dst, s)
	return nil
}

// CopyHtoD implements cuda.Driver.
func (p *Process) CopyHtoD(dev int, dst uint64, src []byte) error {
	const op = "cuMemcpyHtoD"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return err
	}
	d, _, err := p.bytes(op, dst, uint64(len(src)))
	if err != nil {
		return err
	}
	copy(d, src)
	return nil
}

// Alloc implements cuda.Driver.
func (p *Process) Alloc(dev int, n uint64) (uint64, error) {
	const op = "cuMemAlloc"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return 0, err
	}
	if err := p.dev(op, dev); err != nil {
		return 0, err
	}
	if n == 0 || n > 1<<32 {
		return 0, cuda.NewError(op, cuda.ErrOutOfMemory, "")
	}
	p.g.allocID++
	a := &alloc{id: p.g.allocID, dev: dev, data: make([]byte, n), owner: p}
	copy(a.h[:], "KVXFAKE\x00")
	binary.LittleEndian.PutUint64(a.h[8:], a.id)
	p.g.handles[a.h] = a
	v := &view{base: p.g.reserve(n), a: a, refs: 1}
	p.views = append(p.views, v)
	return v.base, nil
}

// Free implements cuda.Driver. Processes that opened the handle keep their
// mapping; the handle no longer opens.
func (p *Process) Free(dev int, ptr uint64) error {
	const op = "cuMemFree"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return err
	}
	for i, v := range p.views {
		if !v.ipc && v.base == ptr {
			v.a.freed = true
			delete(p.g.handles, v.a.h)
			p.views = append(p.views[:i], p.views[i+1:]...)
			return nil
		}
	}
	return cuda.NewError(op, cuda.ErrInvalidValue, "")
}

// Memset implements cuda.Driver.
func (p *Process) Memset(dev int, ptr uint64, v byte, n uint64) error {
	const op = "cuMemsetD8"
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	if err := p.enter(op); err != nil {
		return err
	}
	d, _, err := p.bytes(op, ptr, n)
	if err != nil {
		return err
	}
	for i := range d {
		d[i] = v
	}
	return nil
}
