"""Minimal Python client for kvxferd's control API (protocol version 1).

This is the reference for an SGLang adapter (a KVSender that forwards to kvxferd):
pyzmq + msgpack (or msgspec, which SGLang depends on) only, no numpy needed (numpy int32 arrays are accepted as is).
See docs/control-api.md for every op and field.

    c = ControlClient("ipc:///run/user/1000/kvxfer-1000-rank0.sock")
    c.hello(rank=0)
    c.open(room)
    statuses, reasons, prefix_lens = c.poll([room, ...])

Run as a script (python3 kvxfer_control.py ENDPOINT) it plays the scenario that
transport/control's Go interop test checks, and prints the results as JSON.
"""

import itertools
import json
import os
import struct
import sys
import time

import zmq

try:
    import msgpack

    def _pack(obj):
        return msgpack.packb(obj, use_bin_type=True)

    def _unpack(data):
        return msgpack.unpackb(data, raw=False)
except ImportError:  # SGLang's environment has msgspec (its own dependency) instead
    import msgspec.msgpack

    _pack = msgspec.msgpack.encode
    _unpack = msgspec.msgpack.decode

PROTOCOL_VERSION = 1

# KVPoll values; the numbers are the contract (the scheduler all-reduces with MIN).
FAILED, BOOTSTRAPPING, WAITING_FOR_INPUT, TRANSFERRING, SUCCESS = range(5)


class ControlError(Exception):
    """An error reply: code is one of the protocol's error codes."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def pack_int32(indices):
    """Page or state indices as packed little-endian int32 (what send expects)."""
    if hasattr(indices, "astype"):  # numpy
        return indices.astype("<i4", copy=False).tobytes()
    return struct.pack(f"<{len(indices)}i", *indices)


class ControlClient:
    """One DEALER socket to one kvxferd. Not thread safe: use it from the scheduler
    thread only. A DEALER (not REQ) so that a timeout leaves the socket usable: a late
    reply is recognised by its id and dropped."""

    def __init__(self, endpoint, timeout_ms=10000, ctx=None, alive=None):
        """alive: optional zero-arg callable checked every 100 ms while a call
        waits; when it returns False the call raises ConnectionError at once
        (the kvxferd child died) instead of waiting out timeout_ms."""
        self._alive = alive
        self._ctx = ctx or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._ids = itertools.count(1)
        self.timeout_ms = timeout_ms
        self.shm = None

    def close(self):
        if self.shm is not None:
            self.shm.close()
            self.shm = None
        self._sock.close(linger=0)

    def enable_shm(self, **sizes):
        """Moves the room ops (open, init, send, abort, clear, poll, failure,
        pop_decode_prefix_len) to a shared-memory session (kvxfer.shm): no
        round trip per call. Returns False, staying on request/reply, where
        numpy is missing, the host's memory ordering is not covered, or kvxferd
        does not offer it. Call it before opening rooms: every op of one room
        must take the same path. KVXFER_SHM=0 turns it off.

        KVXFER_SHM_SPIN_MAX_US (unless sizes names spin_max_us) is the most
        kvxferd's ring consumer keeps spinning while records keep coming
        (kvxferd's default: 1000; 50 or less: it never spins on). On a host
        whose cores are all busy (scheduler, kvxferd and decode on 2 cores)
        the spin takes a core from them; docs/benchmarks.md measures both."""
        if self.shm is not None:
            return True
        if os.environ.get("KVXFER_SHM", "1") == "0":
            return False
        spin = os.environ.get("KVXFER_SHM_SPIN_MAX_US", "")
        if spin and "spin_max_us" not in sizes:
            try:
                us = int(spin)
            except ValueError:
                us = -1
            if not 0 <= us <= 100_000:  # kvxferd's MaxShmSpin; say so rather than fall back quietly
                raise ControlError("bad_request", f"KVXFER_SHM_SPIN_MAX_US={spin!r}: want whole microseconds in [0, 100000]")
            sizes = dict(sizes, spin_max_us=us)
        try:
            from . import shm
        except ImportError:
            return False
        if not shm.supported():
            return False
        try:
            self.shm = shm.ShmSession(self, **sizes)
        except ControlError:
            return False
        return True

    def call(self, op, **fields):
        rid = next(self._ids)
        req = {"id": rid, "op": op}
        req.update(fields)
        self._sock.send_multipart([b"", _pack(req)])
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                raise TimeoutError(f"kvxferd did not answer {op} in {self.timeout_ms} ms")
            if not self._sock.poll(left if self._alive is None else min(left, 100)):
                if self._alive is not None and not self._alive():
                    raise ConnectionError(f"kvxferd exited while answering {op}")
                continue
            rep = _unpack(self._sock.recv_multipart()[-1])
            if rep.get("id") != rid:
                continue  # late reply to an earlier call that timed out
            if not rep["ok"]:
                raise ControlError(rep["code"], rep["error"])
            return rep["result"]

    # Setup.

    def hello(self, rank=None, pp_rank=None, dp_rank=None):
        fields = {"version": PROTOCOL_VERSION}
        for k, v in (("rank", rank), ("pp_rank", pp_rank), ("dp_rank", dp_rank)):
            if v is not None:
                fields[k] = v
        return self.call("hello", **fields)

    def register_memory(self, kind, buffers, component=0, state_type=None):
        """kind: "kv" | "aux" | "state"; buffers: dicts with shm (a /dev/shm name or an
        absolute path), offset, length (data_len), item_len, mem ("DRAM"|"VRAM"), dev,
        and optionally cuda_ipc (bytes)."""
        return self.call("register_memory", kind=kind, buffers=buffers,
                         component=component, state_type=state_type)

    # One room (BaseKVSender).

    def open(self, room, traceparent=None):
        if self.shm is not None:
            return self.shm.open(room, traceparent)
        fields = {"room": room}
        if traceparent:
            fields["traceparent"] = traceparent
        return self.call("open", **fields)["traced"]

    def init(self, room, num_pages, aux_index):
        if self.shm is not None:
            return self.shm.init(room, num_pages, aux_index)
        self.call("init", room=room, num_pages=num_pages, aux_index=aux_index)

    def send(self, room, pages, state=None):
        if self.shm is not None:
            return self.shm.send(room, pages, state)
        fields = {"room": room, "pages": pack_int32(pages)}
        if state is not None:
            fields["state"] = [None if s is None else pack_int32(s) for s in state]
        self.call("send", **fields)

    # Many rooms per call: the scheduler's per-iteration work.

    def poll(self, rooms):
        if self.shm is not None:
            return self.shm.poll(rooms)
        r = self.call("poll", rooms=list(rooms))
        return r["status"], r["reason"], r["prefix_len"]

    def failure(self, rooms, clear=True):
        """(status, reason, message) per room; clear=True also clears, as
        failure_exception does."""
        if self.shm is not None:
            return self.shm.failure(rooms, clear)
        r = self.call("failure", rooms=list(rooms), clear=clear)
        return list(zip(r["status"], r["reason"], r["message"]))

    def pop_decode_prefix_len(self, rooms):
        if self.shm is not None:
            return self.shm.pop_decode_prefix_len(rooms)
        return self.call("pop_decode_prefix_len", rooms=list(rooms))["prefix_len"]

    def abort(self, *rooms):
        if self.shm is not None:
            return self.shm.abort(*rooms)
        self.call("abort", rooms=list(rooms))

    def clear(self, *rooms):
        if self.shm is not None:
            return self.shm.clear(*rooms)
        self.call("clear", rooms=list(rooms))

    def lost(self, rooms):
        """Names rooms a previous kvxferd of this rank held when it was lost: kvxferd
        fails them (transfer_process_lost) and tells the decodes it knows. Returns how
        many decode endpoints it told."""
        return self.call("lost", rooms=list(rooms))["told"]

    def batch(self, reqs):
        """reqs: dicts with op and fields (no id). Returns one reply dict per request,
        each {"ok": True, "result": ...} or {"ok": False, "code": ..., "error": ...}."""
        return self.call("batch", reqs=reqs)["replies"]


def _scenario(endpoint):
    c = ControlClient(endpoint)
    out = {}
    out["hello"] = c.hello(rank=3, dp_rank=1)
    try:
        c.hello(rank=4)
    except ControlError as e:
        out["wrong_rank"] = e.code
    out["register"] = c.register_memory("kv", [
        {"shm": "psm_abc", "offset": 0, "length": 1 << 20, "item_len": 4096, "mem": "DRAM", "dev": 0},
        {"shm": "/dev/shm/v0", "offset": 4096, "length": 1 << 20, "item_len": 4096, "mem": "DRAM", "dev": 0},
    ])
    big = (1 << 63) - 5  # rooms are 63-bit; ids of 2^63 and above are refused
    out["traced"] = c.open(big, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    c.init(big, 3, 7)
    c.send(big, [1, 2, -3], state=[[4, 5], None])
    c.send(big, [])
    out["poll"] = c.poll([big, 1, 2])
    out["failure"] = c.failure([1], clear=True)
    out["prefix"] = c.pop_decode_prefix_len([big])
    c.abort(1, 2)
    out["batch"] = c.batch([{"op": "clear", "rooms": [big]}, {"op": "bogus"}])
    try:
        c.call("send", room=1, pages=b"\x01\x02\x03")
    except ControlError as e:
        out["bad_pages"] = e.code
    rooms = list(range(1000, 2000))
    t0 = time.perf_counter()
    n = 200
    for _ in range(n):
        c.poll(rooms)
    out["poll1000_us"] = (time.perf_counter() - t0) / n * 1e6
    c.close()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    _scenario(sys.argv[1])
