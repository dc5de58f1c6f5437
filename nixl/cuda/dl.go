package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "kc.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"unsafe"
)

// DefaultLibrary is the driver library Open loads when given "" and
// $KVXFER_LIBCUDA is unset: the soname the NVIDIA driver installs.
const DefaultLibrary = "libcuda.so.1"

var (
	openOnce sync.Once
	openErr  error
	theDrv   *driver
)

// Open loads the CUDA driver library (path, else $KVXFER_LIBCUDA, else
// libcuda.so.1) and initializes it. A process holds one driver: later calls
// return the first call's outcome. Every failure wraps ErrNoGPU.
func Open(path string) (Driver, error) {
	openOnce.Do(func() {
		if path == "" {
			path = os.Getenv("KVXFER_LIBCUDA")
		}
		if path == "" {
			path = DefaultLibrary
		}
		cp := C.CString(path)
		defer C.free(unsafe.Pointer(cp))
		if msg := C.kc_open(cp); msg != nil {
			openErr = fmt.Errorf("%w: loading the CUDA driver %s: %s", ErrNoGPU, path, C.GoString(msg))
			return
		}
		if st := C.kc_init(); st != 0 {
			openErr = fmt.Errorf("%w: %v", ErrNoGPU, cerr("cuInit", st))
			return
		}
		theDrv = &driver{ctx: map[int]C.kc_ctx{}}
	})
	if openErr != nil {
		return nil, openErr
	}
	return theDrv, nil
}

// driver is the real Driver over libcuda.
type driver struct {
	mu  sync.Mutex
	ctx map[int]C.kc_ctx // retained primary contexts, kept for the process lifetime
}

func cerr(op string, st C.int) error {
	if st == 0 {
		return nil
	}
	name := ""
	if s := C.kc_error_name(st); s != nil {
		name = C.GoString(s)
	}
	return NewError(op, int(st), name)
}

func (d *driver) DeviceCount() (int, error) {
	var n C.int
	if err := cerr("cuDeviceGetCount", C.kc_device_count(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// context retains dev's primary context once.
func (d *driver) context(dev int) (C.kc_ctx, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.ctx[dev]; ok {
		return c, nil
	}
	n, err := d.DeviceCount()
	if err != nil {
		return nil, err
	}
	if dev < 0 || dev >= n {
		return nil, NewError("cuDeviceGet", ErrInvalidDevice, "")
	}
	var c C.kc_ctx
	if err := cerr("cuDevicePrimaryCtxRetain", C.kc_ctx_retain(C.int(dev), &c)); err != nil {
		return nil, err
	}
	d.ctx[dev] = c
	return c, nil
}

func (d *driver) IpcOpen(dev int, h Handle) (uint64, error) {
	c, err := d.context(dev)
	if err != nil {
		return 0, err
	}
	var p C.uint64_t
	if err := cerr("cuIpcOpenMemHandle", C.kc_ipc_open(c, unsafe.Pointer(&h[0]), &p)); err != nil {
		return 0, err
	}
	return uint64(p), nil
}

func (d *driver) IpcClose(dev int, ptr uint64) error {
	c, err := d.context(dev)
	if err != nil {
		return err
	}
	return cerr("cuIpcCloseMemHandle", C.kc_ipc_close(c, C.uint64_t(ptr)))
}

func (d *driver) IpcGet(dev int, ptr uint64) (Handle, error) {
	var h Handle
	c, err := d.context(dev)
	if err != nil {
		return h, err
	}
	err = cerr("cuIpcGetMemHandle", C.kc_ipc_get(c, C.uint64_t(ptr), unsafe.Pointer(&h[0])))
	return h, err
}

func (d *driver) AddressRange(dev int, ptr uint64) (uint64, uint64, error) {
	c, err := d.context(dev)
	if err != nil {
		return 0, 0, err
	}
	var b, n C.uint64_t
	if err := cerr("cuMemGetAddressRange", C.kc_addr_range(c, C.uint64_t(ptr), &b, &n)); err != nil {
		return 0, 0, err
	}
	return uint64(b), uint64(n), nil
}

func (d *driver) PointerDevice(dev int, ptr uint64) (int, error) {
	c, err := d.context(dev)
	if err != nil {
		return 0, err
	}
	var o C.int
	if err := cerr("cuPointerGetAttribute", C.kc_ptr_device(c, C.uint64_t(ptr), &o)); err != nil {
		return 0, err
	}
	return int(o), nil
}

func (d *driver) CopyDtoD(dev int, dst, src, n uint64) error {
	c, err := d.context(dev)
	if err != nil {
		return err
	}
	return cerr("cuMemcpyDtoD", C.kc_copy_dtod(c, C.uint64_t(dst), C.uint64_t(src), C.uint64_t(n)))
}

func (d *driver) CopyPeer(dstDev int, dst uint64, srcDev int, src uint64, n uint64) error {
	dc, err := d.context(dstDev)
	if err != nil {
		return err
	}
	sc, err := d.context(srcDev)
	if err != nil {
		return err
	}
	return cerr("cuMemcpyPeer", C.kc_copy_peer(dc, C.uint64_t(dst), sc, C.uint64_t(src), C.uint64_t(n)))
}

func (d *driver) CopyDtoH(dev int, dst []byte, src uint64) error {
	if len(dst) == 0 {
		return nil
	}
	c, err := d.context(dev)
	if err != nil {
		return err
	}
	return cerr("cuMemcpyDtoH", C.kc_copy_dtoh(c, unsafe.Pointer(&dst[0]), C.uint64_t(src), C.uint64_t(len(dst))))
}

func (d *driver) CopyHtoD(dev int, dst uint64, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	c, err := d.context(dev)
	if err != nil {
		return err
	}
	return cerr("cuMemcpyHtoD", C.kc_copy_htod(c, C.uint64_t(dst), unsafe.Pointer(&src[0]), C.uint64_t(len(src))))
}

func (d *driver) Alloc(dev int, n uint64) (uint64, error) {
	c, err := d.context(dev)
	if err != nil {
		return 0, err
	}
	var p C.uint64_t
	if err := cerr("cuMemAlloc", C.kc_alloc(c, C.uint64_t(n), &p)); err != nil {
		return 0, err
	}
	return uint64(p), nil
}

func (d *driver) Free(dev int, ptr uint64) error {
	c, err := d.context(dev)
	if err != nil {
		return err
	}
	return cerr("cuMemFree", C.kc_free(c, C.uint64_t(ptr)))
}

func (d *driver) Memset(dev int, ptr uint64, v byte, n uint64) error {
	c, err := d.context(dev)
	if err != nil {
		return err
	}
	return cerr("cuMemsetD8", C.kc_memset(c, C.uint64_t(ptr), C.uchar(v), C.uint64_t(n)))
}

// Lazy is a Driver that loads the real one (Open(path)) on its first call,
// so that a process that never sees GPU memory never loads libcuda. Without
// a GPU every method returns Open's error (it wraps ErrNoGPU).
func Lazy(path string) Driver { return &lazy{path: path} }

type lazy struct {
	path string
}

func (l *lazy) d() (Driver, error) { return Open(l.path) }

func (l *lazy) DeviceCount() (int, error) {
	d, err := l.d()
	if err != nil {
		return 0, err
	}
	return d.DeviceCount()
}

func (l *lazy) IpcOpen(dev int, h Handle) (uint64, error) {
	d, err := l.d()
	if err != nil {
		return 0, err
	}
	return d.IpcOpen(dev, h)
}

func (l *lazy) IpcClose(dev int, ptr uint64) error {
	d, err := l.d()
	if err != nil {
		return err
	}
	return d.IpcClose(dev, ptr)
}

func (l *lazy) IpcGet(dev int, ptr uint64) (Handle, error) {
	d, err := l.d()
	if err != nil {
		return Handle{}, err
	}
	return d.IpcGet(dev, ptr)
}

func (l *lazy) AddressRange(dev int, ptr uint64) (uint64, uint64, error) {
	d, err := l.d()
	if err != nil {
		return 0, 0, err
	}
	return d.AddressRange(dev, ptr)
}

func (l *lazy) PointerDevice(dev int, ptr uint64) (int, error) {
	d, err := l.d()
	if err != nil {
		return 0, err
	}
	return d.PointerDevice(dev, ptr)
}

func (l *lazy) CopyDtoD(dev int, dst, src, n uint64) error {
	d, err := l.d()
	if err != nil {
		return err
	}
	return d.CopyDtoD(dev, dst, src, n)
}

func (l *lazy) CopyPeer(dstDev int, dst uint64, srcDev int, src uint64, n uint64) error {
	d, err := l.d()
	if err != nil {
		return err
	}
	return d.CopyPeer(dstDev, dst, srcDev, src, n)
}

func (l *lazy) CopyDtoH(dev int, dst []byte, src uint64) error {
	d, err := l.d()
	if err != nil {
		return err
	}
	return d.CopyDtoH(dev, dst, src)
}

func (l *lazy) CopyHtoD(dev int, dst uint64, src []byte) error {
	d, err := l.d()
	if err != nil {
		return err
	}
	return d.CopyHtoD(dev, dst, src)
}

func (l *lazy) Alloc(dev int, n uint64) (uint64, error) {
	d, err := l.d()
	if err != nil {
		return 0, err
	}
	return d.Alloc(dev, n)
}

func (l *lazy) Free(dev int, ptr uint64) error {
	d, err := l.d()
	if err != nil {
		return err
	}
	return d.Free(dev, ptr)
}

func (l *lazy) Memset(dev int, ptr uint64, v byte, n uint64) error {
	d, err := l.d()
	if err != nil {
		return err
	}
	return d.Memset(dev, ptr, v, n)
}
