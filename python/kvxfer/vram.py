"""Export GPU (VRAM) KV buffers to kvxferd through CUDA IPC.

kvxferd is another process: it reaches the scheduler's GPU buffers by CUDA IPC
handle. A handle names one device allocation (its base); each buffer is sent
as (handle, offset from that base, length, device) in register_memory:

    {"cuda_ipc": <64 bytes>, "offset": off, "length": n, "item_len": it,
     "mem": "VRAM", "dev": device}

Two ways to get the handle:

* export_tensor(t): through PyTorch (torch.cuda storage sharing,
  ``untyped_storage()._share_cuda_()``), which gives the caching allocator's
  block and the storage's offset in it;
* export_pointer(ptr, n): through the CUDA driver API (ctypes on
  libcuda.so.1): cuPointerGetAttribute for the device, cuMemGetAddressRange
  for the allocation, cuIpcGetMemHandle on its base. This is what the SGLang
  plug-in uses: KVArgs carries pointers, not tensors. It needs neither torch
  nor the CUDA toolkit, only the driver.

Keeping memory alive: kvxferd keeps the handles open until it exits. An
Exporter keeps a reference to every tensor it exported (so the caching
allocator cannot free or reuse the block); for a raw pointer the caller must
keep the memory allocated (SGLang's KV pool lives as long as the scheduler).
Memory from PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True) or from cuMemCreate cannot be exported with legacy
CUDA IPC; export refuses it with UnsupportedMemory.
"""

import ctypes
import threading

HANDLE_SIZE = 64


try:
    from .memmap import UnsupportedMemory  # one error type for every buffer kvxferd cannot reach
except ImportError:  # loaded by path, outside the package (tests on a box without pyzmq)
    class UnsupportedMemory(RuntimeError):
        """A buffer kvxferd cannot import (not device memory, no driver, not exportable)."""


# CUDA driver API constants (cuda.h).
_CU_POINTER_ATTRIBUTE_CONTEXT = 1
_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
_CU_MEMORYTYPE_DEVICE = 2


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_SIZE)]


class Driver:
    """The few CUDA driver entry points the exporter needs, through ctypes."""

    def __init__(self, path="libcuda.so.1"):
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise UnsupportedMemory(f"no CUDA driver ({path}: {e}): this process has no GPU access") from e
        L = self.lib
        self._init = L.cuInit
        self._attr = L.cuPointerGetAttribute
        self._attr.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
        self._range = getattr(L, "cuMemGetAddressRange_v2", None) or L.cuMemGetAddressRange
        self._range.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        self._get = L.cuIpcGetMemHandle
        self._get.argtypes = [ctypes.POINTER(_Handle), ctypes.c_uint64]
        self._open = getattr(L, "cuIpcOpenMemHandle_v2", None) or L.cuIpcOpenMemHandle
        self._open.argtypes = [ctypes.POINTER(ctypes.c_uint64), _Handle, ctypes.c_uint]
        self._close = L.cuIpcCloseMemHandle
        self._close.argtypes = [ctypes.c_uint64]
        self._retain = L.cuDevicePrimaryCtxRetain
        self._retain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        self._push = getattr(L, "cuCtxPushCurrent_v2", None) or L.cuCtxPushCurrent
        self._push.argtypes = [ctypes.c_void_p]
        self._pop = getattr(L, "cuCtxPopCurrent_v2", None) or L.cuCtxPopCurrent
        self._pop.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self._dtoh = getattr(L, "cuMemcpyDtoH_v2", None) or L.cuMemcpyDtoH
        self._dtoh.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        self._errname = L.cuGetErrorName
        self._errname.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._check("cuInit", self._init(0))

    def _check(self, op, st):
        if st != 0:
            s = ctypes.c_char_p()
            name = s.value.decode() if self._errname(st, ctypes.byref(s)) == 0 and s.value else "CUDA_ERROR"
            raise UnsupportedMemory(f"{op}: {name} ({st})")

    def device_of(self, ptr):
        """The device ordinal holding ptr, or None when ptr is not device memory."""
        mt = ctypes.c_uint(0)
        if self._attr(ctypes.byref(mt), _CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) != 0 or mt.value != _CU_MEMORYTYPE_DEVICE:
            return None
        dev = ctypes.c_int(-1)
        self._check("cuPointerGetAttribute", self._attr(ctypes.byref(dev), _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr))
        return dev.value

    def _in_context(self, dev, fn):
        ctx = ctypes.c_void_p()
        self._check("cuDevicePrimaryCtxRetain", self._retain(ctypes.byref(ctx), dev))
        self._check("cuCtxPushCurrent", self._push(ctx))
        try:
            return fn()
        finally:
            self._pop(ctypes.byref(ctypes.c_void_p()))

    def export(self, ptr, dev):
        """(handle bytes, offset from the allocation base, allocation size)."""
        def go():
            base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
            self._check("cuMemGetAddressRange", self._range(ctypes.byref(base), ctypes.byref(size), ptr))
            h = _Handle()
            st = self._get(ctypes.byref(h), base.value)
            if st != 0:
                try:
                    self._check("cuIpcGetMemHandle", st)
                except UnsupportedMemory as e:
                    raise UnsupportedMemory(
                        f"{e}: this allocation cannot be exported with CUDA IPC (memory from PyTorch's "
                        "expandable segments or cuMemCreate has no legacy IPC handle; unset "
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)") from None
            return bytes(h.reserved), ptr - base.value, size.value
        return self._in_context(dev, go)

    def open(self, handle, dev):
        """Open an exported handle in this process (for checks; kvxferd does this in Go)."""
        def go():
            p = ctypes.c_uint64(0)
            self._check("cuIpcOpenMemHandle", self._open(ctypes.byref(p), _Handle(handle), 1))
            return p.value
        return self._in_context(dev, go)

    def close(self, ptr, dev):
        return self._in_context(dev, lambda: self._check("cuIpcCloseMemHandle", self._close(ptr)))

    def read(self, ptr, n, dev):
        buf = ctypes.create_string_buffer(n)
        self._in_context(dev, lambda: self._check("cuMemcpyDtoH", self._dtoh(buf, ptr, n)))
        return buf.raw


_driver = None
_driver_err = None
_driver_lock = threading.Lock()


def driver():
    """The process's Driver, loaded on first use (UnsupportedMemory without a
    GPU; the failure is remembered, so host-only processes try once)."""
    global _driver, _driver_err
    with _driver_lock:
        if _driver is None and _driver_err is None:
            try:
                _driver = Driver()
            except UnsupportedMemory as e:
                _driver_err = e
        if _driver_err is not None:
            raise _driver_err
        return _driver


def is_device_pointer(ptr):
    """True when ptr is CUDA device memory; False without a driver or GPU."""
    try:
        return driver().device_of(int(ptr)) is not None
    except UnsupportedMemory:
        return False


def region(handle, offset, length, item_len, dev):
    """The register_memory buffer entry of a VRAM buffer."""
    if len(handle) != HANDLE_SIZE:
        raise UnsupportedMemory(
            f"CUDA IPC handle of {len(handle)} bytes (want {HANDLE_SIZE}): memory from expandable "
            "segments or cuMemCreate cannot be exported with legacy CUDA IPC")
    if length <= 0 or item_len <= 0 or length % item_len:
        raise UnsupportedMemory(f"length {length} is not a whole number of {item_len}-byte items")
    return {"cuda_ipc": bytes(handle), "offset": int(offset), "length": int(length),
            "item_len": int(item_len), "mem": "VRAM", "dev": int(dev)}


class Exporter:
    """Exports buffers and keeps what it exported alive until close()."""

    def __init__(self, drv=None):
        self._drv = drv
        self._keep = []

    def _driver(self):
        if self._drv is None:
            self._drv = driver()
        return self._drv

    def export_tensor(self, t, item_len, length=None, what="buffer"):
        """A CUDA tensor's buffer entry, through torch.cuda storage sharing."""
        if not getattr(t, "is_cuda", False):
            raise UnsupportedMemory(f"{what} is not a CUDA tensor")
        storage = t.untyped_storage()
        shared = storage._share_cuda_()
        dev, handle, block_off = int(shared[0]), shared[1], int(shared[3])
        offset = block_off + (t.data_ptr() - storage.data_ptr())
        n = int(length if length is not None else t.numel() * t.element_size())
        self._keep.append(t)
        return region(handle, offset, n, item_len, dev)

    def export_pointer(self, ptr, length, item_len, expect_dev=None, what="buffer"):
        """A device pointer's buffer entry, through the CUDA driver API."""
        drv = self._driver()
        dev = drv.device_of(int(ptr))
        if dev is None:
            raise UnsupportedMemory(f"{what} at {int(ptr):#x} is not CUDA device memory")
        if expect_dev is not None and dev != int(expect_dev):
            raise UnsupportedMemory(f"{what} at {int(ptr):#x} is on GPU {dev}, expected GPU {expect_dev}")
        handle, offset, size = drv.export(int(ptr), dev)
        if offset + length > size:
            raise UnsupportedMemory(f"{what} at {int(ptr):#x} (+{length}) runs past its allocation ({size} bytes)")
        return region(handle, offset, length, item_len, dev)

    def close(self):
        self._keep.clear()


EXPORTER = Exporter()
