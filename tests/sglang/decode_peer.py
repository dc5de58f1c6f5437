#!/usr/bin/env python3
"""One SGLang decode rank built from SGLang's own, unmodified transfer classes.

Run with a venv made by scripts/install-sglang.sh:

    /opt/kvxfer-sglang/0.5.23/bin/python tests/sglang/decode_peer.py --bootstrap 127.0.0.1:8998

It builds what SGLang's decode scheduler builds for the NIXL backend
(disaggregation/decode.py): KVArgs over DRAM KV buffers and metadata (aux)
buffers shaped like SGLang's MetadataBuffers, the decode-mode NixlKVManager,
and one NixlKVReceiver per room, and drives them the way the scheduler does:

* open:      receiver(mgr, bootstrap_addr, room) -> try_ensure_parallel_info
             -> init(prefill_dp_rank=0) -> WaitingForInput -> send_metadata
* the loop:  receiver.poll() for every live room, SGLang's metadata gate
             (Success with aux bootstrap_room still 0 stays Transferring; a
             wrong room is a corruption failure), and on Failed the failure
             path of pop_transferred: failure_exception(), then (0.5.21+, env
             on) ensure_abort_notified(force_arm=True) and the deferred page
             release until is_abort_release_safe(room, len(bootstrap_infos))
             or the release timeout (resolve_deferred_releases)
* abort:     receiver.abort() (what Scheduler.abort_request calls)

Everything runs on one "scheduler" thread, as in SGLang; stdin commands are
queued to it. Protocol: one JSON object per line on stdin, one per line on
stdout. Every command has "op" and optionally "id" (echoed). Events without
"id" are {"event": ...}. See tests/sglang/README.md for the command list.
"""

from __future__ import annotations

import argparse
import base64
import faulthandler
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "stubs"))

os.environ.setdefault("UCX_TLS", "tcp,self,sm")

import kvx_sglang_shim  # noqa: E402

kvx_sglang_shim.install()

import numpy as np  # noqa: E402

from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll  # noqa: E402
from sglang.srt.disaggregation.common.conn import CommonKVReceiver  # noqa: E402
from sglang.srt.disaggregation.nixl.conn import NixlKVManager, NixlKVReceiver  # noqa: E402
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402

try:
    from importlib.metadata import version as _pkg_version

    SGLANG_VERSION = _pkg_version("sglang")
except Exception:  # noqa: BLE001
    SGLANG_VERSION = "unknown"

log = logging.getLogger("kvx.decode_peer")

# ---------------------------------------------------------------------------
# Log capture: every WARNING+ record of SGLang's loggers is kept for "warnings".


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []
        self.mu = threading.Lock()  # not self.lock: Handler.handle() holds that one around emit()

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001
            msg = str(record.msg)
        with self.mu:
            self.records.append({"t": record.created, "level": record.levelname, "logger": record.name, "msg": msg})


CAPTURE = _Capture()


def _setup_logging(level):
    root = logging.getLogger()
    root.setLevel(level)
    err = logging.StreamHandler(sys.stderr)
    err.setFormatter(logging.Formatter("[decode_peer %(asctime)s %(levelname)s %(name)s] %(message)s"))
    root.addHandler(err)
    logging.getLogger("sglang").addHandler(CAPTURE)
    logging.getLogger("sglang").setLevel(min(level, logging.WARNING))


# ---------------------------------------------------------------------------
# Memory: DRAM KV buffers and SGLang-shaped metadata buffers.

# MetadataBuffers(size, hidden_size, hidden_states_dtype, max_sampling_mask_tokens,
# max_top_logprobs_num=128) without sampling mask, DSA indices or checksum:
# (name, columns, numpy dtype). The order is get_buf_infos()'s; bootstrap_room last.
def aux_layout(hidden_size, hidden_dtype):
    return [
        ("output_ids", 16, np.int32),
        ("cached_tokens", 16, np.int32),
        ("output_token_logprobs_val", 16, np.float32),
        ("output_token_logprobs_idx", 16, np.int32),
        ("output_top_logprobs_val", 128, np.float32),
        ("output_top_logprobs_idx", 128, np.int32),
        ("output_topk_p", 16, np.float32),
        ("output_topk_index", 16, np.int64),
        ("output_hidden_states", hidden_size, hidden_dtype),
        ("bootstrap_room", 8, np.uint64),
    ]


class Memory:
    def __init__(self, layers, slots, item, aux_slots, hidden_size, mla=False):
        self.layers, self.slots, self.item, self.aux_slots = layers, slots, item, aux_slots
        # K of every layer, then V (MHA), like MHATokenToKVPool.get_contiguous_buf_infos;
        # one buffer per layer for MLA (MLATokenToKVPool).
        nbuf = layers if mla else 2 * layers
        self.kv = [np.zeros(slots * item, dtype=np.uint8) for _ in range(nbuf)]
        self.aux_names = []
        self.aux = []
        for name, cols, dt in aux_layout(hidden_size, np.float16):
            self.aux_names.append(name)
            self.aux.append(np.zeros((aux_slots, cols), dtype=dt))

    def kv_infos(self):
        return [b.ctypes.data for b in self.kv], [b.nbytes for b in self.kv], [self.item] * len(self.kv)

    def aux_infos(self):
        return [b.ctypes.data for b in self.aux], [b.nbytes for b in self.aux], [b[0].nbytes for b in self.aux]

    def aux_item_lens(self):
        return [int(b[0].nbytes) for b in self.aux]

    def room_slot(self, idx):
        return int(self.aux[-1][idx, 0])

    def read(self, pages, aux):
        out = {"kv": [], "aux": []}
        for b in self.kv:
            v = b.reshape(self.slots, self.item)
            out["kv"].append(base64.b64encode(v[np.asarray(pages, dtype=np.int64)].tobytes()).decode())
        if aux is not None:
            for b in self.aux:
                out["aux"].append(base64.b64encode(b[aux].tobytes()).decode())
        return out

    def zero(self, pages, aux):
        for b in self.kv:
            b.reshape(self.slots, self.item)[np.asarray(pages, dtype=np.int64)] = 0
        if aux is not None:
            for b in self.aux:
                b[aux] = 0

    def is_zero(self, pages, aux):
        for b in self.kv:
            if b.reshape(self.slots, self.item)[np.asarray(pages, dtype=np.int64)].any():
                return False
        if aux is not None:
            for b in self.aux:
                if b[aux].any():
                    return False
        return True


def build_kv_args(mem, args):
    a = KVArgs()
    # decode.py: engine_rank = tp_rank % attn_tp_size; pp_rank from the PP group.
    a.engine_rank = args.tp_rank % args.tp_size
    a.pp_rank = args.pp_rank
    a.system_dp_rank = 0
    a.kv_cache_dtype_str = "auto"
    a.kv_data_ptrs, a.kv_data_lens, a.kv_item_lens = mem.kv_infos()
    # kv_layer_ids: what a pool that reports them (HybridLinearKVPool) sends:
    # the model layer of every buffer (K ids then V ids for MHA). Plain pools
    # send none.
    a.kv_layer_ids = []
    if args.kv_layer_ids:
        ids = list(range(args.start_layer, args.start_layer + mem.layers))
        a.kv_layer_ids = ids if args.mla else ids * 2
    a.kv_data_mem_kinds = ["DRAM"] * len(a.kv_data_ptrs)
    a.kv_layout = None
    a.page_size = 1
    a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = mem.aux_infos()
    # setup_state_kv_args for a dense model: no state.
    a.state_types = []
    a.state_data_ptrs = []
    a.state_data_lens = []
    a.state_item_lens = []
    a.state_layer_ids = []
    a.state_dim_per_tensor = []
    a.state_slice_outer_counts = []
    a.state_conv_shard_groups = []
    a.is_hybrid_mla_backend = False
    a.swa_kv_cache_layout = None
    a.ib_device = None
    a.ib_traffic_class = None
    a.gpu_id = 0
    a.kv_head_num = args.heads
    a.total_kv_head_num = args.total_heads or args.heads * args.tp_size
    a.rust_http_port = None
    a.prefill_start_layer = args.start_layer
    a.prefill_end_layer = None
    a.mla_compression_ratios = None
    a.kv_buf_groups = 1
    a.total_kv_layers = mem.layers
    a.host_kv_data_ptrs = None
    a.host_kv_data_lens = None
    a.host_kv_item_lens = None
    a.host_state_data_ptrs = None
    a.host_state_data_lens = None
    a.host_state_item_lens = None
    return a


# ---------------------------------------------------------------------------
# Rooms and the scheduler loop.

TERMINAL = ("success", "failed")


class Room:
    def __init__(self, room, pages, aux):
        self.room, self.pages, self.aux = room, pages, aux
        self.receiver = None
        self.phase = "bootstrapping"  # bootstrapping, waiting, transferring, success, failed
        self.t_open = time.time()
        self.t_metadata = None
        self.t_terminal = None
        self.reason = None
        self.aborted = False  # decode-side abort() was called
        self.t_abort = None
        self.release = None  # None (held or live), "immediate", "acks", "timeout"
        self.t_release = None
        self.hold_deadline = None
        self.required_acks = 0
        self.generation = None
        self.acks = []
        self.prefill_ranks = []
        self.prefill_dp_rank = None
        self.error = None

    def view(self):
        return {
            "room": self.room, "phase": self.phase, "t_open": self.t_open, "t_metadata": self.t_metadata,
            "t_terminal": self.t_terminal, "reason": self.reason, "aborted": self.aborted, "t_abort": self.t_abort,
            "release": self.release, "t_release": self.t_release, "held": self.hold_deadline is not None and self.release is None,
            "required_acks": self.required_acks, "generation": self.generation, "acks": self.acks,
            "prefill_ranks": self.prefill_ranks, "error": self.error, "prefill_dp_rank": self.prefill_dp_rank,
            "targets": self._targets(),
        }

    def _targets(self):
        """The prefill ranks this receiver pulls from, as _setup_bootstrap_infos
        resolved them: [rank_port, is_dummy] per bootstrap info."""
        out = []
        for bi in (getattr(self.receiver, "bootstrap_infos", None) or []) if self.receiver else []:
            out.append([int(bi.get("rank_port", 0)), bool(bi.get("is_dummy", False))])
        return out


def progress_delay(delay_us):
    """Makes the NIXL agent SGLang's manager creates wait up to delay_us for a
    UCX event between its progress thread's rounds (nixlAgentConfig.pthrDelay),
    for the one construction; returns the function that undoes it. NIXL's
    Python API fixes that wait at 0: a thread that spins, which on a host of
    two cores takes one from the prefill under test (a deployment's decode
    runs on hosts of its own). None: SGLang's agent as it ships. The large-room
    benchmark's decode stand-in does the same (bench/large/peer.py)."""
    if delay_us is None:
        return lambda: None
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "large"))
    from peer import event_driven
    return event_driven(delay_us)


class Peer:
    def __init__(self, args):
        self.args = args
        self.bootstrap_addr = args.bootstrap
        self.mem = Memory(args.layers, args.slots, args.item, args.aux_slots, args.hidden_size, mla=args.mla)
        self.kv_args = build_kv_args(self.mem, args)
        self.server_args = kvx_sglang_shim.server_args()
        restore = progress_delay(args.progress_delay_us)
        try:
            self.mgr = NixlKVManager(self.kv_args, DisaggregationMode.DECODE, self.server_args, bool(args.mla))
        finally:
            restore()
        # decode.py's transfer queue reads these two envs (0.5.20+).
        self.deferred_env = _env_bool("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE")
        self.release_timeout = _env_float("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", 30.0)
        self.rooms = {}
        self.cmds = queue.Queue()
        self.waits = []  # (deadline, id, rooms, until)
        self.out_lock = threading.Lock()

    # -- output
    def send(self, obj):
        line = json.dumps(obj, separators=(",", ":"))
        with self.out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    # -- capabilities of the installed release, by API
    def deferral_supported(self):
        return hasattr(self.mgr, "is_abort_release_safe") and hasattr(NixlKVReceiver, "ensure_abort_notified")

    def info(self):
        return {
            "version": SGLANG_VERSION, "agent": self.mgr.agent.name, "ip": self.mgr.local_ip,
            "port": self.mgr.rank_port, "pid": os.getpid(),
            "deferred_release": bool(self.deferral_supported() and self.deferred_env
                                     and getattr(self.mgr, "enable_deferred_decode_kv_release", False)),
            "release_timeout": self.release_timeout,
            "waiting_timeout": float(getattr(self.mgr, "waiting_timeout", 0) or 0),
            "kv_item_lens": [self.mem.item] * len(self.mem.kv), "aux_item_lens": self.mem.aux_item_lens(),
            "slots": self.mem.slots, "aux_slots": self.mem.aux_slots, "layers": self.mem.layers,
            "tp_size": self.mgr.attn_tp_size, "tp_rank": self.kv_args.engine_rank, "pp_size": self.mgr.pp_size,
            "pp_rank": self.mgr.pp_rank, "mla": bool(self.mgr.is_mla_backend), "kv_layer_ids": list(self.kv_args.kv_layer_ids),
        }

    # -- commands (scheduler thread)
    def op_open(self, cmd):
        """Open rooms: [{room, pages, aux}] (or one room inline). metadata=false
        stops after init (the request sits in the prealloc queue)."""
        specs = cmd.get("rooms") or [{"room": cmd["room"], "pages": cmd.get("pages", []), "aux": cmd.get("aux")}]
        send_md = cmd.get("metadata", True)
        res = []
        for s in specs:
            r = Room(int(s["room"]), [int(p) for p in s.get("pages", [])], s.get("aux"))
            if r.room in self.rooms:
                res.append({"room": r.room, "error": "room already open"})
                continue
            self.rooms[r.room] = r
            try:
                self._open(r, send_md)
            except Exception as e:  # noqa: BLE001
                r.error = f"{type(e).__name__}: {e}"
                log.error("open room %s: %s", r.room, traceback.format_exc())
            res.append(r.view())
        return {"rooms": res}

    def _open(self, r, send_md):
        r.receiver = NixlKVReceiver(mgr=self.mgr, bootstrap_addr=self.bootstrap_addr, bootstrap_room=r.room)
        # decode.py _ensure_prefill_info: non-blocking retries of the topology query.
        deadline = time.time() + 10
        while self.bootstrap_addr not in self.mgr.prefill_info_table:
            if self.mgr.try_ensure_parallel_info(self.bootstrap_addr):
                break
            if time.time() > deadline:
                raise RuntimeError(f"could not fetch prefill parallel info from {self.bootstrap_addr}")
            time.sleep(0.05)
        dp = self._prefill_dp_rank(r)
        if dp is None:
            raise RuntimeError(f"room {r.room}: the bootstrap server knows no prefill DP rank for it")
        r.prefill_dp_rank = dp
        r.receiver.init(dp)
        # _update_handshake_waiters: wait for WaitingForInput.
        deadline = time.time() + 10
        while True:
            p = r.receiver.poll()
            if p == KVPoll.WaitingForInput:
                r.phase = "waiting"
                break
            if p == KVPoll.Failed:
                self._fail(r)
                return
            if time.time() > deadline:
                raise RuntimeError(f"room {r.room} stuck in {KVPoll(p).name} after init")
            time.sleep(0.001)
        if send_md:
            self._send_metadata(r)

    def _prefill_dp_rank(self, r):
        """decode.py _resolve_prefill_dp_rank, then (pass 2) the batched
        POST /query_dp_ranks, retried until the prefill registered the room."""
        info = self.mgr.prefill_info_table[self.bootstrap_addr]
        if info.dp_size == 1:
            return 0
        if info.follow_bootstrap_room and not envs.SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK.get():
            return r.room % info.dp_size
        deadline = time.time() + 10
        while time.time() < deadline:
            got = CommonKVReceiver.query_prefill_dp_ranks(self.bootstrap_addr, [r.room])
            if str(r.room) in got:
                return int(got[str(r.room)])
            time.sleep(0.05)
        return None

    def _send_metadata(self, r):
        if r.aux is None:
            raise RuntimeError("send_metadata needs an aux index")
        self.mem.aux[-1][r.aux] = 0  # clear_slot: the next owner sees "not yet written"
        r.receiver.send_metadata(np.asarray(r.pages, dtype=np.int32), int(r.aux), None, decode_prefix_len=0)
        r.t_metadata = time.time()
        if r.receiver.conclude_state == KVPoll.Failed:
            self._fail(r)
        else:
            r.phase = "transferring"

    def op_metadata(self, cmd):
        res = []
        for room in cmd["rooms"]:
            r = self.rooms.get(int(room))
            if r is None or r.phase != "waiting":
                res.append({"room": room, "error": "room not waiting for metadata"})
                continue
            self._send_metadata(r)
            res.append(r.view())
        return {"rooms": res}

    def op_abort(self, cmd):
        res = []
        for room in cmd["rooms"]:
            r = self.rooms.get(int(room))
            if r is None:
                res.append({"room": room, "error": "unknown room"})
                continue
            if r.phase not in TERMINAL:
                r.aborted = True
                r.t_abort = time.time()
                r.receiver.abort()
                self._step(r)
            res.append(r.view())
        return {"rooms": res}

    def op_status(self, cmd):
        rooms = cmd.get("rooms")
        sel = [self.rooms[int(x)] for x in rooms if int(x) in self.rooms] if rooms is not None else list(self.rooms.values())
        return {"rooms": [r.view() for r in sel]}

    def op_read(self, cmd):
        return self.mem.read([int(p) for p in cmd.get("pages", [])], cmd.get("aux"))

    def op_zero(self, cmd):
        self.mem.zero([int(p) for p in cmd.get("pages", [])], cmd.get("aux"))
        return {}

    def op_is_zero(self, cmd):
        return {"zero": self.mem.is_zero([int(p) for p in cmd.get("pages", [])], cmd.get("aux"))}

    def op_warnings(self, cmd):
        with CAPTURE.mu:
            return {"warnings": list(CAPTURE.records)}

    def op_notifs(self, cmd):
        """NIXL notifications nobody read. Only for releases that never read
        them (0.5.23: no update_transfer_status): there every notification a
        prefill posts piles up in the agent. Older releases drain them in
        poll(), so this answers null there rather than steal them."""
        if hasattr(self.mgr, "update_transfer_status"):
            return {"notifs": None}
        got = self.mgr.agent.get_new_notifs()
        msgs = [m.decode("utf-8", "replace") for ms in got.values() for m in ms]
        return {"notifs": msgs}

    def op_info(self, cmd):
        return self.info()

    def op_forget(self, cmd):
        """Drop finished rooms from the table (their receivers are already cleared)."""
        for room in cmd.get("rooms", []):
            r = self.rooms.get(int(room))
            if r is not None and r.phase in TERMINAL and (r.release is not None or r.phase == "success"):
                del self.rooms[int(room)]
        return {}

    def op_wait(self, cmd):
        """Answer once every room is terminal (until=terminal) or terminal and its
        pages released (until=released), or at timeout with what is known."""
        rooms = [int(x) for x in cmd["rooms"]]
        until = cmd.get("until", "terminal")
        self.waits.append((time.time() + float(cmd.get("timeout", 30)), cmd.get("id"), rooms, until))
        return None  # answered by the loop

    # -- the scheduler loop
    def _fail(self, r):
        """pop_transferred's Failed branch."""
        if r.phase in TERMINAL:
            return
        r.phase = "failed"
        r.t_terminal = time.time()
        self._snapshot_ranks(r)
        try:
            r.receiver.failure_exception()
        except Exception as e:  # noqa: BLE001
            r.reason = getattr(e, "failure_reason", None) or str(e)
        deferrable = self.deferral_supported() and self.deferred_env and getattr(
            self.mgr, "enable_deferred_decode_kv_release", False)
        if deferrable and not r.receiver.abort_notified:
            r.receiver.ensure_abort_notified(force_arm=True)
        if deferrable and r.receiver.abort_notified:
            # _defer_release: hold pages until every prefill rank acked or timeout.
            r.required_acks = len(r.receiver.bootstrap_infos or [])
            r.hold_deadline = time.monotonic() + self.release_timeout
            r.generation = getattr(r.receiver, "_abort_generation", None)
            self._resolve(r)
        else:
            self._release(r, "immediate")

    def _resolve(self, r):
        """resolve_deferred_releases for one held room."""
        state = getattr(self.mgr, "_deferred_abort_ack_tracker", {}).get(r.room)
        if state is not None:
            r.acks = sorted(getattr(state, "prefill_ranks", []) or [])
        if self.mgr.is_abort_release_safe(r.room, r.required_acks):
            self._release(r, "acks")
        elif time.monotonic() >= r.hold_deadline:
            log.warning("kvx: deferred KV release for room %s timed out after %ss without a full drain ack",
                        r.room, self.release_timeout)
            self._release(r, "timeout")

    def _release(self, r, how):
        """_do_release: free pages and the metadata slot, clear the receiver."""
        r.release = how
        r.t_release = time.time()
        if hasattr(self.mgr, "clear_deferred_abort_state"):
            self.mgr.clear_deferred_abort_state(r.room)
        r.receiver.clear()

    def _snapshot_ranks(self, r):
        tr = getattr(self.mgr, "prefill_response_tracker", {}).get(r.room)
        if tr:
            r.prefill_ranks = sorted(tr)

    def _step(self, r):
        if r.receiver is None or r.error:
            return
        if r.phase in TERMINAL:
            if r.phase == "failed" and r.release is None and r.hold_deadline is not None:
                self._resolve(r)
            return
        p = r.receiver.poll()
        if p == KVPoll.Success and r.t_metadata is not None:
            # _apply_metadata_gate, then _commit_transfer_to_req's room check.
            actual = self.mem.room_slot(r.aux)
            if actual == 0:
                return  # stays Transferring
            self._snapshot_ranks(r)
            if actual != r.room:
                r.reason = f"bootstrap_room mismatch: aux slot {r.aux} holds {actual}, expected {r.room} (corruption)"
                r.phase = "failed"
                r.t_terminal = time.time()
                self._release(r, "immediate")
                return
            r.phase = "success"
            r.t_terminal = time.time()
            r.receiver.clear()
        elif p == KVPoll.Failed:
            self._fail(r)

    def _answer_waits(self):
        if not self.waits:
            return
        now = time.time()
        keep = []
        for w in self.waits:
            deadline, wid, rooms, until = w
            sel = [self.rooms.get(x) for x in rooms]
            done = all(r is not None and (r.error or (r.phase in TERMINAL and (
                until == "terminal" or r.release is not None or r.phase == "success"))) for r in sel)
            if done or now >= deadline:
                self.send({"id": wid, "ok": True, "timed_out": not done,
                           "rooms": [r.view() if r is not None else {"room": x, "error": "unknown room"}
                                     for x, r in zip(rooms, sel)]})
            else:
                keep.append(w)
        self.waits = keep

    def loop(self):
        while True:
            busy = False
            while True:
                try:
                    cmd = self.cmds.get_nowait()
                except queue.Empty:
                    break
                busy = True
                if cmd is None:
                    return
                self.dispatch(cmd)
            for r in list(self.rooms.values()):
                self._step(r)
            self._answer_waits()
            if not busy:
                try:
                    cmd = self.cmds.get(timeout=0.0005)
                except queue.Empty:
                    continue
                if cmd is None:
                    return
                self.dispatch(cmd)

    def dispatch(self, cmd):
        op = cmd.get("op")
        fn = getattr(self, "op_" + str(op), None)
        if fn is None:
            self.send({"id": cmd.get("id"), "ok": False, "error": f"unknown op {op!r}"})
            return
        try:
            out = fn(cmd)
        except Exception as e:  # noqa: BLE001
            self.send({"id": cmd.get("id"), "ok": False, "error": f"{type(e).__name__}: {e}",
                       "trace": traceback.format_exc()})
            return
        if out is not None:
            out.update({"id": cmd.get("id"), "ok": True})
            self.send(out)


def _env_bool(name):
    try:
        return bool(getattr(envs, name).get())
    except AttributeError:
        return False


def _env_float(name, default):
    try:
        return float(getattr(envs, name).get())
    except AttributeError:
        return default


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True, help="prefill bootstrap host:port")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=1024)
    ap.add_argument("--item", type=int, default=256)
    ap.add_argument("--aux-slots", type=int, default=512)
    ap.add_argument("--hidden-size", type=int, default=64)
    # The rank's identity in its decode instance (what SGLang's parallel
    # state and KVArgs would say).
    ap.add_argument("--tp-size", type=int, default=1, help="attn_tp_size")
    ap.add_argument("--tp-rank", type=int, default=0)
    ap.add_argument("--pp-size", type=int, default=1)
    ap.add_argument("--pp-rank", type=int, default=0)
    ap.add_argument("--start-layer", type=int, default=0, help="first model layer of this rank's KV buffers")
    ap.add_argument("--mla", action="store_true", help="MLA pool: one KV buffer per layer")
    ap.add_argument("--kv-layer-ids", action="store_true", help="register kv_layer_ids (as a hybrid pool does)")
    ap.add_argument("--heads", type=int, default=1, help="kv_head_num of this rank")
    ap.add_argument("--total-heads", type=int, default=0, help="total_kv_head_num (0: heads × tp size)")
    ap.add_argument("--log-level", default=os.environ.get("KVX_PEER_LOG", "WARNING"))
    env_delay = os.environ.get("KVX_DECODE_PROGRESS_DELAY_US")
    ap.add_argument("--progress-delay-us", type=int, default=int(env_delay) if env_delay else None,
                    help="NIXL progress thread's wait for a UCX event, µs (default $KVX_DECODE_PROGRESS_DELAY_US, "
                         "else SGLang's agent as it ships: 0, a spinning thread)")
    args = ap.parse_args()
    _setup_logging(getattr(logging, args.log_level.upper(), logging.WARNING))
    kvx_sglang_shim.set_rank(tp_size=args.tp_size, tp_rank=args.tp_rank, pp_size=args.pp_size, pp_rank=args.pp_rank)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the driver's "where are you stuck"
    peer = Peer(args)
    peer.send(dict(event="ready", **peer.info()))

    def reader():
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                peer.cmds.put(json.loads(line))
            except json.JSONDecodeError as e:
                peer.send({"ok": False, "error": f"bad json: {e}"})
        peer.cmds.put(None)

    threading.Thread(target=reader, daemon=True).start()
    peer.loop()
    # stdin closed: exit without waiting for SGLang's daemon threads.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
