"""Host pools in memory kvxferd can map: sealed memfds, allocated where SGLang allocates.

kvxferd is another process, so the prefill's host buffers it writes from (the
aux metadata buffers on every server; the KV and state pools on CPU servers)
must live in memory both processes map. SGLang allocates them with
`torch.zeros(device="cpu")`: private memory. While the plug-in's allocation
hooks run SGLang's own constructors, `SharedAllocation` (a TorchFunctionMode)
answers each host tensor factory call (zeros, empty, ones, full) with a tensor
over a memfd of its own: mapped MAP_SHARED, sealed against shrinking and
growing, zero-filled by the kernel. The tensors are the ones SGLang computes
into; nothing is copied per transfer. kvxferd gets the descriptors at exec
(pass_fds, `-memfd`): no file name is involved, and when the last holder
closes them the memory is gone, so nothing is left behind.
"""

import bisect
import fcntl
import mmap
import os
import threading

MFD_FLAGS = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL

# The factory functions SGLang's pool constructors call; anything else (views,
# copies, results of ops) is not a pool buffer and keeps torch's allocator.
FACTORIES = ("zeros", "empty", "ones", "full")
# Fewer bytes than this stay private: scalars and small index tensors built
# beside the pools are never registered, and each memfd costs a descriptor.
MIN_BYTES = int(os.environ.get("KVXFER_SHARED_MIN_BYTES", "4096"))
# A descriptor budget, so that a constructor allocating in a loop cannot
# exhaust the process's descriptors.
MAX_MEMFDS = int(os.environ.get("KVXFER_MAX_MEMFDS", "4096"))


class Region:
    __slots__ = ("start", "length", "fd", "name", "mm")

    def __init__(self, start, length, fd, name, mm):
        self.start, self.length, self.fd, self.name, self.mm = start, length, fd, name, mm


class Registry:
    """Every shared region this process allocated, by address (one writer at a
    time: SGLang builds its pools on one thread; the lock covers the rest)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._starts = []
        self._regions = []

    def add(self, region):
        with self._lock:
            i = bisect.bisect(self._starts, region.start)
            self._starts.insert(i, region.start)
            self._regions.insert(i, region)

    def lookup(self, ptr, length):
        """(fd, offset) of [ptr, ptr+length) inside one region, else None."""
        with self._lock:
            i = bisect.bisect(self._starts, ptr) - 1
            if i < 0:
                return None
            r = self._regions[i]
            if ptr + length <= r.start + r.length:
                return r.fd, ptr - r.start
            return None

    def fds(self):
        with self._lock:
            return [r.fd for r in self._regions]

    def __len__(self):
        with self._lock:
            return len(self._regions)


REGISTRY = Registry()


def allocate(nbytes, name="kvxfer-pool"):
    """A zero-filled, sealed, MAP_SHARED memfd of nbytes (rounded up to a page):
    (mmap, fd). The mapping and the descriptor live as long as the process."""
    if len(REGISTRY) >= MAX_MEMFDS:
        raise MemoryError(f"kvxfer: more than {MAX_MEMFDS} shared pool buffers (KVXFER_MAX_MEMFDS)")
    size = max(mmap.PAGESIZE, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
    fd = os.memfd_create(name, MFD_FLAGS)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    return mm, fd


def _nbytes(torch, shape, dtype):
    numel = 1
    for d in shape:
        numel *= d
    return numel * torch.empty((), dtype=dtype).element_size()


def shared_tensor(torch, shape, dtype, name="kvxfer-pool"):
    """A zero-filled host tensor over a fresh shared region (registered)."""
    shape = tuple(int(d) for d in shape)
    nbytes = _nbytes(torch, shape, dtype)
    mm, fd = allocate(max(nbytes, 1), name)
    flat = torch.frombuffer(mm, dtype=torch.uint8, count=max(nbytes, 1))[:nbytes]
    t = flat.view(dtype).view(shape)
    REGISTRY.add(Region(flat.data_ptr() if nbytes else 0, len(mm), fd, name, mm))
    return t


def _shape(kind, args, kwargs):
    """The size argument of a factory call (full's second positional is its fill)."""
    size = kwargs.get("size")
    if size is None:
        dims = args[:1] if kind == "full" else args
        size = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    return tuple(int(d) for d in size)


def make_mode(torch):
    """The TorchFunctionMode class (built lazily: torch is SGLang's, imported late)."""
    from torch.overrides import TorchFunctionMode

    targets = {getattr(torch, f): f for f in FACTORIES}

    class SharedAllocation(TorchFunctionMode):
        """Host tensor factories inside this mode allocate in shared memory."""

        def __init__(self, name):
            super().__init__()
            self.name = name
            self.count = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            kind = targets.get(func)
            if kind is None or not self._host(kwargs) or kwargs.get("out") is not None \
                    or kwargs.get("pin_memory") or kwargs.get("requires_grad") \
                    or (kind == "full" and kwargs.get("dtype") is None):  # torch infers it from the fill
                return func(*args, **kwargs)
            shape = _shape(kind, args, kwargs)
            dtype = kwargs.get("dtype") or torch.get_default_dtype()
            if _nbytes(torch, shape, dtype) < MIN_BYTES:
                return func(*args, **kwargs)
            fill = {"ones": 1, "full": args[1] if len(args) > 1 else kwargs.get("fill_value")}.get(kind)
            t = shared_tensor(torch, shape, dtype, self.name)
            if fill is not None:
                t.fill_(fill)
            self.count += 1
            return t

        @staticmethod
        def _host(kwargs):
            dev = kwargs.get("device")
            if dev is None:
                return torch.get_default_device().type == "cpu"
            return torch.device(dev).type == "cpu"

    return SharedAllocation
