"""kvxfer's prefill-side manager and sender for SGLang (NIXL backend).

Loaded only inside SGLang (by kvxfer.sglang_plugin). The manager is one
prefill rank: it resolves the KVArgs buffers to shared mappings, starts (or
attaches to) that rank's kvxferd and registers the memory; each sender is one
room, forwarded to kvxferd's control API. If kvxferd dies, every room it held
answers Failed (transfer_process_lost) and the next new room restarts it;
the restarted kvxferd is told which rooms were lost, and tells their decodes.
"""

import logging
import os
import time

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVSender, KVPoll

try:
    from sglang.srt.disaggregation.base.conn import KVTransferMetric
except ImportError:  # pragma: no cover
    KVTransferMetric = None
try:
    from sglang.srt.disaggregation.common.conn import KVTransferError
except ImportError:  # pragma: no cover
    from .sender import KVTransferError

from . import memmap, sglang_trace, sharedmem, vram
from .control import ControlError
from . import process
from .process import Kvxferd, default_endpoint, find_binary, state_dir

log = logging.getLogger("kvxfer")

LOST = "transfer_process_lost"
MAX_LOST = 1 << 16  # the control API's cap on one lost request
_ERRORS = (ConnectionError, TimeoutError)
try:  # the shared-memory path (numpy): a ring kvxferd stopped consuming is a lost kvxferd
    from .shm import RingFull

    _ERRORS += (RingFull,)
except ImportError:  # pragma: no cover
    pass


def _attr(obj, name, default=None):
    v = getattr(obj, name, default)
    return default if v is None else v


def _buffers(kind, ptrs, lens, item_lens, mem_kinds=None):
    out = []
    for i, (p, n, it) in enumerate(zip(ptrs, lens, item_lens)):
        mem = (mem_kinds[i] if mem_kinds and i < len(mem_kinds) else "DRAM") or "DRAM"
        # GPU buffers (SGLang's KV pool) go by CUDA IPC handle (kvxfer.vram, docs/vram.md).
        if str(mem).upper() in ("VRAM", "GPU", "CUDA") or (kind != "aux" and vram.is_device_pointer(int(p))):
            out.append(vram.EXPORTER.export_pointer(int(p), int(n), int(it), what=f"kvxfer: {kind} buffer {i}"))
            continue
        if str(mem).upper() not in ("DRAM", "CPU", "HOST"):
            raise memmap.UnsupportedMemory(f"kvxfer: {kind} buffer {i} is {mem} memory; {memmap.NEEDS}")
        shared = sharedmem.REGISTRY.lookup(int(p), int(n))
        if shared is not None:
            # Allocated by the plug-in's hooks (kvxfer.sharedmem): kvxferd inherits the memfd.
            fd, off = shared
            out.append({"memfd": fd, "offset": off, "length": int(n), "item_len": int(it), "mem": "DRAM", "dev": 0})
            continue
        path, off, length = memmap.resolve(int(p), int(n), f"kvxfer: {kind} buffer {i}")
        out.append({"shm": path, "offset": off, "length": length, "item_len": int(it), "mem": "DRAM", "dev": 0})
    return out


def _memfds(memory):
    """The memfds the registrations name: passed to kvxferd at exec."""
    return sorted({b["memfd"] for _, _, _, bufs in memory for b in bufs if "memfd" in b})


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class KvxferPrefillManager(BaseKVManager):
    """SGLang's prefill-side KV manager, backed by one kvxferd per rank."""

    supports_deferred_decode_kv_release = True  # kvxferd sends ABORT_ACK
    supports_role_switch = False
    reports_transfer_latency = False
    kv_status_msg_carries_reason = True

    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False, **kwargs):
        self.kv_args = args
        self.disaggregation_mode = disaggregation_mode
        self.server_args = server_args
        self.is_mla_backend = bool(is_mla_backend)
        self.enable_all_cp_ranks_for_transfer = False
        self.is_dummy_cp_rank = False
        self._poll_cache = {}
        self._poll_time = 0.0
        self._rooms = {}
        self._orphans = set()  # rooms of a lost kvxferd, left _rooms before its successor started
        self._next_restart = 0.0

        sa = server_args
        dp_attn = bool(_attr(sa, "enable_dp_attention", False))
        tp_size = int(_attr(sa, "tp_size", 1))
        dp_size = int(_attr(sa, "dp_size", 1)) if dp_attn else 1
        self.tp_size = tp_size // dp_size if dp_attn else tp_size
        self.tp_rank = int(args.engine_rank) % self.tp_size
        self.pp_size = int(_attr(sa, "pp_size", 1))
        self.pp_rank = int(_attr(args, "pp_rank", 0))
        self.dp_size = dp_size
        self.dp_rank = int(_attr(args, "system_dp_rank", 0)) if dp_attn else 0
        # SGLang's sender registers bootstrap_room -> dp rank when there is more
        # than one DP rank (attention DP groups or replicas: ServerArgs.dp_size).
        self.num_dp_ranks = int(_attr(sa, "dp_size", 1))
        self.load_balance_method = str(_attr(sa, "load_balance_method", "round_robin"))

        # Memory first: a buffer kvxferd cannot map is a start-up error.
        self._memory = [("kv", 0, None, _buffers("kv", args.kv_data_ptrs, args.kv_data_lens, args.kv_item_lens,
                                                 getattr(args, "kv_data_mem_kinds", None)))]
        types = list(_attr(args, "state_types", []) or [])
        for i, st in enumerate(types):
            self._memory.append(("state", i, str(getattr(st, "value", st)), _buffers(
                "state", args.state_data_ptrs[i], args.state_data_lens[i], args.state_item_lens[i])))
        self._memory.append(("aux", 0, None, _buffers("aux", args.aux_data_ptrs, args.aux_data_lens,
                                                      args.aux_item_lens)))

        self.bootstrap_host, self.bootstrap_port = self._bootstrap(sa)
        # SGLang tracing on: senders open their rooms under the request's trace.
        self.traced = sglang_trace.tracing_on(sa) and sglang_trace.install()
        hello = {"rank": self.tp_rank, "pp_rank": self.pp_rank, "dp_rank": self.dp_rank}
        attach = os.environ.get("KVXFER_CONTROL")
        if attach:
            if _memfds(self._memory):
                raise memmap.UnsupportedMemory(
                    "kvxfer: KVXFER_CONTROL attaches to a kvxferd started elsewhere, which cannot inherit "
                    "the pools kvxfer allocated in memfds; unset KVXFER_CONTROL (the plug-in starts "
                    "kvxferd itself) or allocate the pools in named shared files")
            self.daemon = Kvxferd(attach, hello=hello)
        else:
            tag = f"tp{self.tp_rank}-pp{self.pp_rank}-dp{self.dp_rank}"
            endpoint = default_endpoint(tag)
            # Decode registrations outlive a kvxferd restart (SGLang's decode registers once).
            self.state_dir = state_dir(tag, f"{self.bootstrap_host}:{self.bootstrap_port}")
            fds = _memfds(self._memory)
            argv = self._argv(endpoint, len(types))
            if fds:
                argv += ["-memfd", ",".join(str(f) for f in fds)]
            self.daemon = Kvxferd(endpoint, argv=argv, env=self._env(sa), pass_fds=fds,
                                  hello=hello, start_timeout=float(os.environ.get("KVXFER_START_TIMEOUT", "60")))
            process.remove_at_exit(self.daemon, endpoint, self.state_dir)
        self._start()

    # -- kvxferd ------------------------------------------------------------

    @staticmethod
    def _bootstrap(sa):
        host = _attr(sa, "host", "127.0.0.1")
        dist = _attr(sa, "dist_init_addr", None)
        if dist and int(_attr(sa, "nnodes", 1)) > 1:
            host = dist.rsplit(":", 1)[0].strip("[]")
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return host, int(_attr(sa, "disaggregation_bootstrap_port", 8998))

    def _argv(self, endpoint, state_components):
        sa = self.server_args
        host = os.environ.get("SGLANG_HOST_IP") or os.environ.get("HOST_IP")
        if not host:
            try:
                from sglang.srt.utils.network import get_local_ip_auto
                host = get_local_ip_auto()
            except Exception:  # noqa: BLE001
                host = "127.0.0.1"
        bh = f"[{self.bootstrap_host}]" if ":" in self.bootstrap_host else self.bootstrap_host
        argv = [find_binary(),
                "-nixl-backend", os.environ.get("KVXFER_NIXL_BACKEND", "nixl"),
                "-host", host,
                "-tp-size", str(self.tp_size), "-tp-rank", str(self.tp_rank),
                "-pp-size", str(self.pp_size), "-pp-rank", str(self.pp_rank),
                "-dp-size", str(self.dp_size), "-dp-rank", str(self.dp_rank),
                "-page-size", str(int(_attr(self.kv_args, "page_size", _attr(sa, "page_size", 1)))),
                "-kv-cache-dtype", str(_attr(sa, "kv_cache_dtype", "auto")),
                "-serve-bootstrap=false",
                "-disaggregation-bootstrap-port", str(self.bootstrap_port),
                "-bootstrap-url", f"http://{bh}:{self.bootstrap_port}",
                "-control", endpoint,
                # The same PULL port for every incarnation: decodes cache the rank's address.
                "-zmq-port", str(_free_port()),
                "-parent-pid", str(os.getpid()),
                "-state-components", str(state_components)]
        if getattr(self, "state_dir", None):
            argv += ["-state-dir", self.state_dir]
        if self.num_dp_ranks > 1:
            # Decodes read follow_bootstrap_room off the topology: say what SGLang's ranks say.
            argv += ["-load-balance-method", self.load_balance_method]
        if self.is_mla_backend:
            argv.append("-mla")
        argv += topology_args(self.kv_args, self.is_mla_backend)
        extra = os.environ.get("KVXFER_ARGS", "").split()
        return argv + extra

    @staticmethod
    def _env(sa=None):
        # SGLANG_DISAGGREGATION_*, UCX_*, NIXL, OTEL_* and kvxfer settings pass through with the rest;
        # SGLang's --otlp-traces-endpoint becomes kvxferd's when no OTLP endpoint is set.
        env = sglang_trace.otel_env(sa, dict(os.environ))
        if not env.get("KVXFER_LIBNIXL") and not env.get("KVXFER_NIXL_PYTHON"):
            import sys

            env["KVXFER_NIXL_PYTHON"] = sys.executable  # SGLang's python has the nixl wheel
        return env

    def _start(self):
        info = self.daemon.start()
        c = self.daemon.client
        c.enable_shm()  # room ops through the ring and status table where possible
        pid = (info or {}).get("pid")
        if pid is not None and pid == getattr(self, "_registered_pid", None):
            # Reconnected to the same process (an attached kvxferd that outlived
            # a lost connection): its memory is ours already and it is live.
            return
        for kind, comp, st, bufs in self._memory:
            if kind == "state":
                c.register_memory(kind, bufs, component=comp, state_type=st)
            else:
                c.register_memory(kind, bufs)
        self._registered_pid = pid

    def ensure_live(self):
        """The client of a live kvxferd, restarting it after a loss; None while it cannot be."""
        d = self.daemon
        if d.check() and d.client is not None:
            return d.client
        now = time.monotonic()
        if now < self._next_restart:
            return None
        self._next_restart = now + 1.0
        try:
            self._start()
            log.warning("kvxfer: kvxferd %s for rank tp%d pp%d dp%d in %.3f s (generation %d)",
                        "restarted" if d.argv is not None else "reconnected (attached; not ours to restart)",
                        self.tp_rank, self.pp_rank, self.dp_rank, d.start_seconds, d.generation)
        except Exception as e:  # noqa: BLE001
            log.error("kvxfer: restarting kvxferd failed: %s", e)
            d.lost(f"restart failed: {e}")
            return None
        self._announce_lost()
        return d.client

    def orphan(self, room, generation):
        """A room of a lost kvxferd that leaves _rooms before a successor started:
        that successor names it with the others (_announce_lost)."""
        if generation == self.daemon.generation and len(self._orphans) < MAX_LOST:
            self._orphans.add(room)

    def _announce_lost(self):
        """Tells the new kvxferd which rooms its predecessor held. It fails them and
        sends each decode it knows KV_STATUS Failed (0.5.20+ decodes fail the request
        at once; without this a decode waits out SGLANG_DISAGGREGATION_WAITING_TIMEOUT)."""
        gen = self.daemon.generation
        rooms = set(self._orphans)
        for r, g in list(self._rooms.items()):
            if g != gen:
                rooms.add(r)
                del self._rooms[r]  # named once; its sender's failure_exception is local
        self._orphans = set()
        if not rooms:
            return
        rooms = sorted(rooms)[:MAX_LOST]
        try:
            told = self.call(lambda c: c.lost(rooms))
        except ControlError as e:
            log.error("kvxfer: kvxferd did not take the %d rooms of its predecessor: %s", len(rooms), e)
            return
        if told is not None:
            log.warning("kvxfer: %d rooms of the lost kvxferd failed (%s); %d decode endpoints told",
                        len(rooms), LOST, told)

    def call(self, fn):
        """fn(client) against the live kvxferd; a lost process marks it lost and returns None."""
        d = self.daemon
        if not d.check() or d.client is None:
            return None
        try:
            return fn(d.client)
        except _ERRORS as e:
            d.lost(str(e))
            return None

    def poll_room(self, room):
        """One room's status from a batched poll of every room of this rank."""
        c = self.daemon.client
        if c is not None and c.shm is not None:
            # The status table: a memory read, no batching needed.
            res = self.call(lambda c: c.poll([room]))
            return None if res is None else res[0][0]
        now = time.monotonic()
        if room in self._poll_cache and now - self._poll_time < 0.002:
            return self._poll_cache.pop(room)
        rooms = [r for r, g in self._rooms.items() if g == self.daemon.generation]
        if room not in rooms:
            rooms.append(room)
        res = self.call(lambda c: c.poll(rooms))
        if res is None:
            return None
        self._poll_cache = dict(zip(rooms, res[0]))
        self._poll_time = now
        return self._poll_cache.pop(room)

    # -- what prefill.py calls ----------------------------------------------

    def register_buffer_to_engine(self):
        pass  # registered with kvxferd at start-up

    def deregister_buffer_to_engine(self):
        pass

    def register_to_bootstrap(self):
        pass  # kvxferd registers its rank with SGLang's bootstrap server

    def shutdown(self):
        self.daemon.stop()
        if getattr(self, "state_dir", None):
            # A clean exit: the next deployment starts with no registrations.
            import shutil

            shutil.rmtree(self.state_dir, ignore_errors=True)


def _new_force_rule():
    """0.5.23 registers whenever the force flag is set (0.5.18: only on a conflict)."""
    try:
        from importlib.metadata import version

        return tuple(int(x) for x in version("sglang").split(".")[:3]) >= (0, 5, 23)
    except Exception:  # noqa: BLE001
        return True


def topology_args(kv_args, is_mla):
    """kvxferd flags for the rank's place in the model, from SGLang's KVArgs,
    so that decodes of another parallel layout can pair buffers: the KV head
    counts (decodes of another TP size get per-token head slices), this PP stage's first layer and the pool's layer ids (a
    stage writing a whole-model decode pairs buffers by layer)."""
    out = []
    if not is_mla:
        kvh = int(_attr(kv_args, "kv_head_num", 0) or 0)
        total = int(_attr(kv_args, "total_kv_head_num", 0) or 0)
        if kvh > 0:
            out += ["-kv-head-num", str(kvh)]
        if total > 0:
            out += ["-total-kv-heads", str(total)]
    start = int(_attr(kv_args, "prefill_start_layer", 0) or 0)
    if start > 0:
        out += ["-prefill-start-layer", str(start)]
    ids = list(_attr(kv_args, "kv_layer_ids", None) or [])
    if ids:
        out += ["-kv-layer-ids", ",".join(str(int(i)) for i in ids)]
    return out


def register_dp_rank(bootstrap_addr, room, dp_rank):
    """POST /register_dp_rank to SGLang's bootstrap server, as its prefill
    sender does (5 s timeout; a failure is logged, the room goes on)."""
    import json
    import urllib.request

    req = urllib.request.Request(f"http://{bootstrap_addr}/register_dp_rank", method="POST",
                                 data=json.dumps({"bootstrap_room": int(room), "dp_rank": int(dp_rank)}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            if r.status != 200:
                log.error("kvxfer: failed to register prefill dp_rank: %s", r.status)
    except Exception as e:  # noqa: BLE001
        log.error("kvxfer: failed to register prefill dp_rank: %s", e)


class KvxferPrefillSender(BaseKVSender):
    """One room. Accepts 0.5.18's (dest_tp_ranks, pp_rank) and 0.5.22+'s
    signature, positionally or by keyword."""

    def __init__(self, mgr, bootstrap_addr=None, bootstrap_room=None, *args, **kwargs):
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = int(bootstrap_room)
        self.req_has_disagg_prefill_dp_rank = kwargs.get("req_has_disagg_prefill_dp_rank",
                                                         args[-1] if len(args) in (1, 3) and isinstance(args[-1], bool) else False)
        self.num_kv_indices = None
        self.aux_index = None
        self._sent_pages = 0
        self._lost = None
        self._failed = False
        self._t0 = time.monotonic()
        self._error = None
        self.traceparent = None
        if mgr.num_dp_ranks > 1 and not self.req_has_disagg_prefill_dp_rank and not self._route_dp_rank():
            self.generation = mgr.daemon.generation
            return
        client = mgr.ensure_live()
        self.generation = mgr.daemon.generation
        # The request's W3C trace context (SGLang tracing on, inside create_sender).
        self.traceparent = sglang_trace.current_traceparent(self.bootstrap_room) if getattr(mgr, "traced", False) else None
        if client is None or mgr.call(lambda c: c.open(self.bootstrap_room, self.traceparent)) is None:
            self._lost = mgr.daemon.lost_reason or "kvxferd is not running"
            return
        mgr._rooms[self.bootstrap_room] = self.generation

    def _route_dp_rank(self):
        """What SGLang's CommonKVSender does for a request without a prefill dp
        rank when there are several DP ranks: POST /register_dp_rank (room ->
        this rank's attention DP rank) unless the decode follows the room
        (load_balance_method follow_bootstrap_room), where a room of another DP
        rank fails. SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 registers
        instead: always from 0.5.23, only on that conflict in 0.5.18. False: failed."""
        mgr, n = self.kv_mgr, self.kv_mgr.num_dp_ranks
        force = os.environ.get("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "").lower() in ("1", "true")
        conflict = mgr.dp_rank != self.bootstrap_room % n
        if mgr.load_balance_method != "follow_bootstrap_room" or (force and (conflict or _new_force_rule())):
            register_dp_rank(self.bootstrap_addr, self.bootstrap_room, mgr.dp_rank)
        elif conflict:
            self._error = (f"follow_bootstrap_room conflict: dispatched to dp_rank {mgr.dp_rank} but "
                           f"bootstrap_room {self.bootstrap_room} implies dp_rank {self.bootstrap_room % n}. "
                           f"Set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing.")
            self._failed = True
            return False
        return True

    def _is_lost(self):
        if self._error:
            return True  # never opened in kvxferd
        if self._lost is None and (self.generation != self.kv_mgr.daemon.generation or not self.kv_mgr.daemon.check()):
            self._lost = self.kv_mgr.daemon.lost_reason or "kvxferd restarted"
        return self._lost is not None

    def _do(self, fn):
        if self._is_lost():
            return None
        r = self.kv_mgr.call(fn)
        self._is_lost()
        return r

    def init(self, num_kv_indices, aux_index=None):
        self.num_kv_indices = num_kv_indices
        self.aux_index = aux_index
        self._do(lambda c: c.init(self.bootstrap_room, int(num_kv_indices), -1 if aux_index is None else int(aux_index)))

    def send(self, kv_indices, state_indices=None, num_kv_tokens=None, **kwargs):
        if self._failed:
            return
        self._sent_pages += len(kv_indices)
        self._do(lambda c: c.send(self.bootstrap_room, kv_indices, state_indices))

    def poll(self):
        if self._failed or self._is_lost():
            return KVPoll.Failed
        st = self.kv_mgr.poll_room(self.bootstrap_room)
        if st is None:
            self._is_lost()
            return KVPoll.Failed
        return KVPoll.Failed if st == 0 else st

    def poll_pp_consensus(self):
        return self.poll()

    def mark_prefill_complete(self):
        pass

    def pop_decode_prefix_len(self):
        r = self._do(lambda c: c.pop_decode_prefix_len([self.bootstrap_room]))
        return int(r[0]) if r else 0

    def get_transfer_metric(self):
        if KVTransferMetric is None:
            return None
        try:
            return KVTransferMetric(transfer_latency_s=time.monotonic() - self._t0)
        except TypeError:
            return KVTransferMetric()

    def failure_exception(self):
        self._failed = True
        if self._error:
            raise KVTransferError(self.bootstrap_room, self._error)
        self.kv_mgr._rooms.pop(self.bootstrap_room, None)
        if self._is_lost():
            self.kv_mgr.orphan(self.bootstrap_room, self.generation)
            # The failure is already reported (poll said Failed): bring
            # kvxferd back now (at most once a second), not only when the
            # next request arrives.
            self.kv_mgr.ensure_live()
            raise KVTransferError(self.bootstrap_room, f"{LOST}: kvxferd lost ({self._lost})")
        r = self._do(lambda c: c.failure([self.bootstrap_room], clear=True))
        if r is None:
            raise KVTransferError(self.bootstrap_room, f"{LOST}: kvxferd lost ({self._lost})")
        _, reason, message = r[0]
        raise KVTransferError(self.bootstrap_room, message or reason or "kvxfer: failed")

    def clear(self):
        self.kv_mgr._rooms.pop(self.bootstrap_room, None)
        if self._is_lost():
            if not self._error:
                self.kv_mgr.orphan(self.bootstrap_room, self.generation)
            return
        self._do(lambda c: c.clear(self.bootstrap_room))

    def abort(self):
        self._failed = True
        self._do(lambda c: c.abort(self.bootstrap_room))


__all__ = ["KvxferPrefillManager", "KvxferPrefillSender", "LOST", "ControlError"]
