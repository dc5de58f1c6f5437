"""The shared-memory control path: a submission ring and a status table.

kvxferd maps one region per client (op shm_attach; docs/control-api.md,
"Shared-memory path"). The client writes fixed 32-byte records (open, init,
send, abort, clear) into a single-producer ring and publishes a tail index;
kvxferd consumes them in order. Nothing is answered: a record a room cannot
take shows as that room's status (Failed, invalid_request). Each room the
client opens gets a slot in the status table, which its room actor in kvxferd
writes whenever the room's status changes (a seqlock: a torn read is seen and
retried). poll is a memory read; a batched poll is a numpy gather.

Memory ordering. On x86-64 (TSO) stores become visible in program order and
loads are not reordered with loads, so the plain numpy/struct stores of a
record followed by the store of tail publish it, and the three gathers of a
table read (seq, row, seq) read in order. The one store->load pair that needs
a fence (store tail, then load kvxferd's "sleeping" flag; kvxferd does the
mirror image) is fenced by acquiring and releasing a threading.Lock, a locked
read-modify-write instruction on x86-64. On aarch64 a plain store can pass an
earlier one and loads can be reordered, which needs dmb barriers that Python
cannot issue: ShmSession refuses to run there (KVXFER_SHM_UNSAFE_ORDERING=1
overrides it, for experiments only) and ControlClient stays on request/reply.
"""

import ctypes
import mmap
import os
import platform
import struct
import threading
import time

import numpy as np

RECORD_SIZE = 32
SLOT_SIZE = 32
OP_OPEN, OP_INIT, OP_SEND, OP_ABORT, OP_CLEAR = 1, 2, 3, 4, 5
HDR_TAIL, HDR_IDX_TAIL, HDR_HEAD, HDR_IDX_HEAD = 64 // 8, 72 // 8, 128 // 8, 136 // 8
HDR_SLEEPING = 192 // 4  # uint32 index
HDR_DROPPED = 256 // 4
HDR_FULL_WAITS = 320 // 8  # client-reported: waits for room in a full ring or index area
MAGIC = 0x31474E4952585642
BOOTSTRAPPING = 1
WRITTEN = 1 << 48
_GEN_WRITTEN = np.uint64(0xFFFFFFFF | WRITTEN)
CLIENT_LOST = 13  # room.ReasonClientLost; the attach reply's reason_names is authoritative

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAKE = 1
_libc = ctypes.CDLL(None, use_errno=True)
_rec = struct.Struct("<BBHIQqq")
MAX_TRACEPARENT = 256  # bytes; control.MaxTraceparent


class RingFull(Exception):
    """The ring stayed full longer than the session's full_wait: nothing was submitted."""


class Dropped(ConnectionError):
    """kvxferd dropped this session (1: a bad record, 2: detached, 3: process exit)."""


def supported():
    """Whether this host's memory ordering is covered (see the module doc)."""
    return platform.machine() in ("x86_64", "AMD64") or os.environ.get("KVXFER_SHM_UNSAFE_ORDERING") == "1"


class ShmSession:
    """One shared-memory session. Not thread safe: the scheduler thread is the
    ring's single producer. Room ids map to slots here; open assigns one,
    clear frees it (a slot's generation counter makes a reused slot never
    show the previous room's status)."""

    def __init__(self, client, ring_entries=0, slots=0, index_words=0, full_wait=1.0, spin_max_us=None):
        """spin_max_us: the most kvxferd's consumer keeps spinning on an empty
        ring while this client submits faster than that (None: kvxferd's
        default, 1,000; 0..50: it sleeps after 50 us always; at most 100,000).
        Spinning spends a core of kvxferd's so that a record never waits for
        its thread to be woken (docs/control-api.md 6.5)."""
        if not supported():
            raise RuntimeError("kvxfer: the shared-memory path needs x86-64 ordering (see kvxfer.shm)")
        fields = {"pid": os.getpid()}
        for k, v in (("ring_entries", ring_entries), ("slots", slots), ("index_words", index_words)):
            if v:
                fields[k] = v
        if spin_max_us is not None:
            fields["spin_max_us"] = int(spin_max_us)
        info = client.call("shm_attach", **fields)
        self.spin_max_us = info.get("spin_max_us")
        self.client = client
        self.session = info["session"]
        self.full_wait = full_wait
        fd = os.open(info["path"], os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, info["size"])
        finally:
            os.close(fd)
        os.unlink(info["path"])  # both sides have it mapped
        mm = self._mm
        if struct.unpack_from("<Q", mm, 0)[0] != MAGIC:
            raise RuntimeError("kvxfer: not a kvxfer shm region")
        self.entries, self.nslots, self.words = info["ring_entries"], info["slots"], info["index_words"]
        self._ring_off, self._index_off, self._table_off = info["ring_off"], info["index_off"], info["table_off"]
        self._hdr = np.frombuffer(mm, dtype=np.uint64, count=512)
        self._hdr32 = np.frombuffer(mm, dtype=np.uint32, count=1024)
        self._idx = np.frombuffer(mm, dtype=np.int32, count=self.words, offset=self._index_off)
        self.table = np.frombuffer(mm, dtype=np.uint64, count=self.nslots * 4, offset=self._table_off).reshape(self.nslots, 4)
        self._seq = self.table[:, 0]
        self._sleep_word = ctypes.c_uint32.from_buffer(mm, HDR_SLEEPING * 4)
        self._sleep_addr = ctypes.addressof(self._sleep_word)
        self._fence = threading.Lock()
        self.reason_names = {int(c): n for c, n in info["reason_names"]}
        self.reason_messages = {int(c): m for c, m in info["reason_messages"]}
        self._names = [self.reason_names.get(c, f"reason({c})") for c in range(256)]
        self._tail = self._head = 0
        self._idx_tail = self._idx_head = 0
        self.gens = np.zeros(self.nslots, dtype=np.uint64)
        self.expect = np.zeros(self.nslots, dtype=np.uint64)  # gen | WRITTEN: the slot word of this open, written
        self.slot_room = np.zeros(self.nslots, dtype=np.uint64)
        self._free = list(range(self.nslots - 1, -1, -1))
        self.slot_of = {}
        self._mask = self.entries - 1

    # -- the ring ----------------------------------------------------------

    def dropped(self):
        return int(self._hdr32[HDR_DROPPED])

    def _wait(self, ok, full=True):
        """Bounded wait for room in the ring: spin, then 1 ms sleeps, then RingFull."""
        start = time.monotonic()
        counted = not full
        while True:
            if self._hdr32[HDR_DROPPED]:
                raise Dropped(f"kvxferd dropped shm session {self.session} (code {self.dropped()})")
            self._head = int(self._hdr[HDR_HEAD])
            self._idx_head = int(self._hdr[HDR_IDX_HEAD])
            if ok():
                return
            if not counted:  # full indeed, not only a stale head: one wait (kvxferd's FullWaits)
                self._hdr[HDR_FULL_WAITS] += 1
                counted = True
            el = time.monotonic() - start
            if el > self.full_wait:
                raise RingFull(f"kvxfer: shm ring full for {self.full_wait} s")
            if el > 0.0001:
                time.sleep(0.001)

    def _put(self, op, slot, room, a, b, flags=0):
        if self._tail - self._head >= self.entries:
            self._wait(lambda: self._tail - self._head < self.entries)
        _rec.pack_into(self._mm, self._ring_off + (self._tail & self._mask) * RECORD_SIZE, op, flags, 0, slot, room, a, b)
        self._tail += 1
        self._hdr[HDR_TAIL] = self._tail
        f = self._fence  # a full fence between the store of tail and the load of sleeping
        f.acquire()
        f.release()
        if self._hdr32[HDR_SLEEPING]:
            self._hdr32[HDR_SLEEPING] = 0
            _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self._sleep_addr), _FUTEX_WAKE, 1, None, None, 0)

    def _reserve(self, words):
        """Waits for a free record and `words` free index words; returns their position."""
        w = self.words
        pos = self._idx_tail
        if pos % w + words > w:
            pos = (pos // w + 1) * w  # the blob does not fit before the end: it starts at the wrap
        if words > w:
            raise ValueError(f"kvxfer: {words} index words do not fit an area of {w}")
        if pos + words - self._idx_head > w or self._tail - self._head >= self.entries:
            self._wait(lambda: pos + words - self._idx_head <= w and self._tail - self._head < self.entries)
        return pos

    def open(self, room, traceparent=None):
        """Opens room in a free slot. A traceparent travels in the index area
        ([byte length, bytes packed four to an int32]); kvxferd ignores one that
        is not a valid W3C traceparent, as over request/reply. Returns whether a
        traceparent was carried."""
        raw = traceparent.encode() if traceparent else b""
        if len(raw) > MAX_TRACEPARENT:
            raise ValueError(f"kvxfer: a traceparent of {len(raw)} bytes is longer than {MAX_TRACEPARENT}")
        if room in self.slot_of:
            raise ValueError(f"kvxfer: room {room} is open in this session already")
        if not self._free:
            raise RingFull(f"kvxfer: all {self.nslots} status slots are in use")
        if self._hdr32[HDR_DROPPED]:
            raise Dropped(f"kvxferd dropped shm session {self.session} (code {self.dropped()})")
        slot = self._free[-1]
        gen = (int(self.gens[slot]) + 1) & 0xFFFFFFFF
        flags = pos = 0
        if raw:
            flags = 1 + (len(raw) + 3) // 4
            pos = self._reserve(flags)
            p = pos % self.words
            self._idx[p] = len(raw)
            self._idx[p + 1:p + flags] = np.frombuffer(raw.ljust(4 * (flags - 1), b"\0"), dtype="<i4")
            self._idx_tail = pos + flags
            self._hdr[HDR_IDX_TAIL] = self._idx_tail
        self._put(OP_OPEN, slot, room, gen, pos, flags)
        self._free.pop()
        self.gens[slot] = gen
        self.expect[slot] = gen | WRITTEN
        self.slot_room[slot] = room
        self.slot_of[room] = slot
        return bool(raw)

    def init(self, room, num_pages, aux_index):
        self._put(OP_INIT, 0, room, num_pages, aux_index)

    def send(self, room, pages, state=None):
        """pages: a list or numpy int array; state: None or a list of (None | indices)."""
        n = len(pages)
        words = 2 + n
        if state is not None:
            for s in state:
                words += 1 + (0 if s is None else len(s))
        pos = self._reserve(words)
        iv, p = self._idx, pos % self.words
        iv[p] = n
        if n:
            iv[p + 1:p + 1 + n] = pages
        p += 1 + n
        if state is None:
            iv[p] = -1
        else:
            iv[p] = len(state)
            p += 1
            for s in state:
                if s is None:
                    iv[p] = -1
                    p += 1
                else:
                    iv[p] = len(s)
                    iv[p + 1:p + 1 + len(s)] = s
                    p += 1 + len(s)
        self._idx_tail = pos + words
        self._hdr[HDR_IDX_TAIL] = self._idx_tail
        self._put(OP_SEND, 0, room, pos, words)

    def abort(self, *rooms):
        for r in rooms:
            self._put(OP_ABORT, 0, r, 0, 0)

    def clear(self, *rooms):
        for r in rooms:
            slot = self.slot_of.get(r)
            if slot is None:
                continue  # not open here (cleared already): nothing to clear
            self._put(OP_CLEAR, slot, r, 0, 0)
            del self.slot_of[r]
            self._free.append(slot)

    # -- the table ---------------------------------------------------------

    def _rows(self, slots):
        """The slots' rows, whole: a seqlock read (seq, rows, seq, three
        gathers in order; rows whose seq moved or was odd are read again)."""
        tab, seq = self.table, self._seq
        s1 = seq[slots]
        rows = tab[slots]
        s2 = seq[slots]
        if (s1 ^ s2).any() or (s1 & 1).any():
            bad = (s1 != s2) | ((s1 & 1) != 0)
            while bad.any():
                i = np.nonzero(bad)[0]
                t1 = seq[slots[i]]
                rows[i] = tab[slots[i]]
                t2 = seq[slots[i]]
                bad[:] = False
                bad[i[(t1 != t2) | ((t1 & 1) != 0)]] = True
        return rows

    def read_status(self, slots):
        """KVPoll values (uint8 array) for a numpy array of slots: a slot that
        does not hold this open of its room (generation and room id), or that
        kvxferd has not written since the open, answers Bootstrapping."""
        rows = self._rows(slots)
        mine = ((rows[:, 2] & _GEN_WRITTEN) == self.expect[slots]) & (rows[:, 1] == self.slot_room[slots])
        return np.where(mine, rows.view(np.uint8)[:, 20], BOOTSTRAPPING)

    def read_slots(self, slots):
        """(status, reason code, prefix_len) arrays for a numpy array of slots,
        as read_status."""
        rows = self._rows(slots)
        w = rows[:, 2]
        mine = ((w & _GEN_WRITTEN) == self.expect[slots]) & (rows[:, 1] == self.slot_room[slots])
        status = np.where(mine, (w >> 32) & 0xFF, BOOTSTRAPPING)
        reason = np.where(mine, (w >> 40) & 0xFF, 0)
        prefix = np.where(mine, rows[:, 3].astype(np.int64), 0)
        return status, reason, prefix

    def slots_for(self, rooms):
        return np.fromiter(map(self.slot_of.__getitem__, rooms), dtype=np.intp, count=len(rooms))

    def _slots(self, rooms):
        """The rooms' slots, or None if a room is not open in this session (it
        was cleared, or opened before the session): such rooms are asked of
        kvxferd over request/reply, which answers from the room or its
        tombstone."""
        try:
            return self.slots_for(rooms)
        except KeyError:
            return None

    def poll(self, rooms):
        """(statuses, reason names, prefix_lens) lists, as ControlClient.poll."""
        slots = self._slots(rooms)
        if slots is None:
            r = self.client.call("poll", rooms=list(rooms))
            return r["status"], r["reason"], r["prefix_len"]
        st, why, pl = self.read_slots(slots)
        names = self._names
        return st.tolist(), [names[c] for c in why.tolist()], pl.tolist()

    def barrier(self):
        """Waits (bounded, as a full ring) until kvxferd has consumed every
        record submitted so far: they have reached the engine, so a
        request/reply call made now is ordered after them."""
        if int(self._hdr[HDR_HEAD]) < self._tail:
            self._wait(lambda: self._head >= self._tail, full=False)

    def failure(self, rooms, clear=True):
        """(status, reason, message) per room, as ControlClient.failure. A room
        the table does not show terminal yet (an abort just submitted) is
        answered by kvxferd after a barrier, as request/reply would."""
        slots = self._slots(rooms)
        if slots is not None:
            st = self.read_status(slots)
            if ((st != 0) & (st != 4)).any():
                self.barrier()
                rooms = list(rooms)
                r = self.client.call("failure", rooms=rooms, clear=False)
                if clear:
                    self.clear(*rooms)
                return list(zip(r["status"], r["reason"], r["message"]))
        if slots is None:
            r = self.client.call("failure", rooms=list(rooms), clear=False)
            if clear:
                self.clear(*rooms)
            return list(zip(r["status"], r["reason"], r["message"]))
        st, why, _ = self.read_slots(slots)
        out = []
        for s, c in zip(st.tolist(), why.tolist()):
            msg = self.reason_messages.get(c, "KVSender failed.") if s == 0 else ""
            out.append((s, self._names[c], msg))
        if clear:
            self.clear(*rooms)
        return out

    def pop_decode_prefix_len(self, rooms):
        slots = self._slots(rooms)
        if slots is None:
            return self.client.call("pop_decode_prefix_len", rooms=list(rooms))["prefix_len"]
        return self.read_slots(slots)[2].tolist()

    def close(self, detach=True):
        if detach and not self.dropped():
            try:
                self.client.call("shm_detach", session=self.session)
            except Exception:  # noqa: BLE001 - closing: kvxferd may be gone
                pass
        del self._sleep_word
        self._hdr = self._hdr32 = self._idx = self.table = self._seq = None
        try:
            self._mm.close()
        except BufferError:
            pass  # a caller still holds a view of the table
