"""An SGLang-shaped prefill KVSender over kvxferd.

SGLang's prefill scheduler drives one sender per request through
BaseKVSender's methods (disaggregation/base/conn.py): init, send, poll,
failure_exception, clear, abort, pop_decode_prefix_len. KvxferSender keeps
those names and meanings and forwards each call to kvxferd's control API;
KvxferManager is the per-rank part (one control connection, the memory
registration of KVArgs, and a batched poll so that one scheduler iteration
costs one round trip however many requests are queued).

The rules that make a room terminal, the deadlines and the decode protocol
live in kvxferd; this module only translates. It needs pyzmq and msgpack.
"""

from dataclasses import dataclass
from enum import IntEnum

from .control import ControlClient, ControlError


class KVPoll(IntEnum):
    """SGLang's KVPoll. The numbers are the contract: the scheduler all-reduces
    polls with MIN, so Failed must stay 0."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


_KVPOLL = list(KVPoll)  # by value: KVPoll(s) without the enum lookup


class KVTransferError(Exception):
    """What failure_exception raises, as SGLang's KVTransferError does."""

    def __init__(self, bootstrap_room, failure_reason):
        super().__init__(failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason

    def __str__(self):
        return f"KVTransferError(bootstrap_room={self.bootstrap_room}): {self.failure_reason}"


@dataclass
class Buffer:
    """One KVArgs buffer kvxferd can map: a shared-memory file (a name under
    /dev/shm or an absolute path), the buffer's offset and length in it, and
    the bytes of one slot (item_len: one page of one layer for KV)."""

    shm: str
    offset: int
    length: int
    item_len: int
    mem: str = "DRAM"
    dev: int = 0

    def wire(self):
        return {"shm": self.shm, "offset": self.offset, "length": self.length,
                "item_len": self.item_len, "mem": self.mem, "dev": self.dev}


@dataclass
class VRAMBuffer:
    """One KVArgs buffer in GPU memory, reached by kvxferd through CUDA IPC:
    the 64-byte handle of the device allocation that holds it, the buffer's
    offset from the allocation base, its length, the bytes of one slot and the
    GPU (docs/vram.md). Build it with from_tensor or from_pointer: the
    exporter keeps exported tensors alive for as long as the process runs."""

    cuda_ipc: bytes
    offset: int
    length: int
    item_len: int
    dev: int = 0

    def wire(self):
        return {"cuda_ipc": bytes(self.cuda_ipc), "offset": self.offset, "length": self.length,
                "item_len": self.item_len, "mem": "VRAM", "dev": self.dev}

    @classmethod
    def _of(cls, r):
        return cls(r["cuda_ipc"], r["offset"], r["length"], r["item_len"], r["dev"])

    @classmethod
    def from_tensor(cls, t, item_len, exporter=None):
        """Through torch.cuda storage sharing."""
        from . import vram
        return cls._of((exporter or vram.EXPORTER).export_tensor(t, item_len))

    @classmethod
    def from_pointer(cls, ptr, length, item_len, exporter=None):
        """Through the CUDA driver API (ctypes); the caller keeps the memory allocated."""
        from . import vram
        return cls._of((exporter or vram.EXPORTER).export_pointer(ptr, length, item_len))


class KvxferManager:
    """One prefill rank's connection to its kvxferd."""

    def __init__(self, endpoint, rank, pp_rank=None, dp_rank=None, timeout_ms=10000):
        self.client = ControlClient(endpoint, timeout_ms=timeout_ms)
        self.info = self.client.hello(rank=rank, pp_rank=pp_rank, dp_rank=dp_rank)
        # Room ops through the shared-memory ring and status table where
        # possible (numpy, x86-64, a kvxferd that offers it; KVXFER_SHM=0: never).
        self.shm = self.client.enable_shm()
        self._polled = {}

    def register_kv_args(self, kv, aux, state=()):
        """kv: Buffers (or VRAMBuffers, for GPU memory) in SGLang order (K of
        every layer, then V; MLA one per layer); aux: the metadata buffers in
        order (host memory); state: one list of Buffers per hybrid-state
        component. kvxferd goes live after the last one."""
        self.client.register_memory("kv", [b.wire() for b in kv])
        for i, comp in enumerate(state):
            self.client.register_memory("state", [b.wire() for b in comp], component=i)
        self.client.register_memory("aux", [b.wire() for b in aux])

    def poll_all(self, senders):
        """Every sender's status in one read of the status table (one round
        trip on request/reply); each sender's next poll() returns the answer
        from this batch."""
        rooms = [s.bootstrap_room for s in senders]
        if not rooms:
            return []
        shm = self.client.shm
        slots = None if shm is None else shm._slots(rooms)
        if slots is not None:
            statuses = shm.read_status(slots).tolist()
        else:
            statuses, _, _ = self.client.poll(rooms)
        self._polled = dict(zip(rooms, statuses))
        return [_KVPOLL[s] for s in statuses]

    def close(self):
        self.client.close()


class KvxferSender:
    """BaseKVSender over kvxferd. Construction is SGLang's sender __init__:
    the room is opened (Bootstrapping) at once."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks=None, pp_rank=None,
                 traceparent=None):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = bootstrap_room
        self._c = mgr.client
        self._c.open(bootstrap_room, traceparent)
        self._failed = False

    def init(self, num_kv_indices, aux_index=None):
        self._c.init(self.bootstrap_room, num_kv_indices, -1 if aux_index is None else aux_index)

    def send(self, kv_indices, state_indices=None):
        if self._failed:
            return  # as NixlKVSender.send: a failed sender sends nothing
        self._c.send(self.bootstrap_room, kv_indices, state_indices)

    def poll(self):
        if self._failed:
            return KVPoll.Failed
        cached = self.kv_mgr._polled.pop(self.bootstrap_room, None)
        if cached is not None:
            return KVPoll(cached)
        statuses, _, _ = self._c.poll([self.bootstrap_room])
        return KVPoll(statuses[0])

    def pop_decode_prefix_len(self):
        return self._c.pop_decode_prefix_len([self.bootstrap_room])[0]

    def failure_exception(self):
        """Raises the room's failure (and clears it), as SGLang's does."""
        self._failed = True
        _, reason, message = self._c.failure([self.bootstrap_room], clear=True)[0]
        raise KVTransferError(self.bootstrap_room, message or reason or "kvxfer: failed")

    def clear(self):
        self._c.clear(self.bootstrap_room)

    def abort(self):
        self._c.abort(self.bootstrap_room)
