#!/usr/bin/env python3
"""Per-call cost of the scheduler's sender calls, side by side in one run
(docs/benchmarks.md, "Control path"): kvxfer over request/reply,
kvxfer over the shared-memory ring and status table, and SGLang's own
in-process NixlKVSender. A benchmark, not a test.

    /opt/kvxfer-sglang/0.5.18/bin/python python/tests/bench_calls.py --kvxferd bin/kvxferd [--rooms 2000]

Starts its own kvxferd (no decode: rooms stay Bootstrapping, which is what
open/init/send/abort/clear cost regardless of status). SGLang's manager is
built as SGLang's prefill scheduler builds it (prefill-mode NixlKVManager over
SGLang's own bootstrap server, real NIXL); with no decode, send takes
NixlKVSender's no-transfer-info path (the dummy-rank early return), its
cheapest. Prints one JSON object: per call median/p99 in µs, and a poll of
1,000 rooms.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats(ns):
    a = np.sort(np.asarray(ns, dtype=np.float64)) / 1000.0
    return {"p50_us": round(float(a[len(a) // 2]), 2), "p99_us": round(float(a[min(len(a) - 1, len(a) * 99 // 100)]), 2)}


def bench_senders(new_sender, rooms, pages):
    """open (construction), init, send, abort, clear per room; ns per call."""
    t = {k: [] for k in ("open", "init", "send", "abort", "clear")}
    pc = time.perf_counter_ns
    for r in rooms:
        t0 = pc()
        s = new_sender(r)
        t1 = pc()
        s.init(len(pages), 0)
        t2 = pc()
        s.send(pages)
        t3 = pc()
        s.abort()
        t4 = pc()
        s.clear()
        t5 = pc()
        t["open"].append(t1 - t0)
        t["init"].append(t2 - t1)
        t["send"].append(t3 - t2)
        t["abort"].append(t4 - t3)
        t["clear"].append(t5 - t4)
    return {k: stats(v) for k, v in t.items()}


def bench_poll(fn, n=300):
    pc = time.perf_counter_ns
    ns = []
    for _ in range(n):
        t0 = pc()
        fn()
        ns.append(pc() - t0)
    return stats(ns)


def kvxfer_side(endpoint, rooms, pages, shm_on):
    os.environ["KVXFER_SHM"] = "1" if shm_on else "0"
    from kvxfer import KvxferManager, KvxferSender

    mgr = KvxferManager(endpoint, rank=0)
    assert bool(mgr.shm) == shm_on, "shared-memory path not available"
    out = bench_senders(lambda r: KvxferSender(mgr, "127.0.0.1:1", r), rooms, pages)
    senders = [KvxferSender(mgr, "127.0.0.1:1", 1_000_000 + i + (0 if shm_on else 500_000)) for i in range(1000)]
    out["poll_1000_poll_all"] = bench_poll(lambda: mgr.poll_all(senders))
    if shm_on:
        sess = mgr.client.shm
        slots = sess.slots_for([s.bootstrap_room for s in senders])
        out["poll_1000_table_gather"] = bench_poll(lambda: sess.read_status(slots))
    for s in senders:
        s.abort()
        s.clear()
    mgr.close()
    return out


def sglang_side(rooms, pages, work):
    sys.path.insert(0, os.path.join(ROOT, "tests", "sglang", "stubs"))
    os.environ.setdefault("UCX_TLS", "tcp,self,sm")
    os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")
    import kvx_sglang_shim

    kvx_sglang_shim.install()
    import mmap

    from sglang.srt.disaggregation.base.conn import KVArgs
    from sglang.srt.disaggregation.nixl.conn import NixlKVBootstrapServer, NixlKVManager, NixlKVSender
    from sglang.srt.disaggregation.utils import DisaggregationMode

    port = free_port()
    bs = NixlKVBootstrapServer(host="127.0.0.1", port=port)  # noqa: F841 (serves in its thread)
    sa = type("SA", (), {})()
    for k, v in vars(kvx_sglang_shim.server_args()).items():
        setattr(sa, k, v)
    sa.disaggregation_mode = "prefill"
    sa.disaggregation_bootstrap_port = port
    bufs = []

    def buf(name, size):
        fd = os.open(os.path.join(work, name), os.O_CREAT | os.O_RDWR, 0o600)
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size)
        os.close(fd)
        a = np.frombuffer(mm, dtype=np.uint8)
        bufs.append((mm, a))
        return a.ctypes.data, size

    kv = [buf(f"kv{i}", 1024 * 256) for i in range(4)]
    aux = [buf(f"aux{i}", 512 * 64) for i in range(7)]
    args = KVArgs()
    for k, v in dict(engine_rank=0, kv_data_ptrs=[p for p, _ in kv], kv_data_lens=[n for _, n in kv],
                     kv_item_lens=[256] * 4, aux_data_ptrs=[p for p, _ in aux], aux_data_lens=[n for _, n in aux],
                     aux_item_lens=[64] * 7, kv_data_mem_kinds=["DRAM"] * 4, ib_device=None, gpu_id=0, pp_rank=0,
                     system_dp_rank=0, page_size=1, kv_head_num=1, total_kv_head_num=1, prefill_start_layer=0,
                     state_types=[], state_data_ptrs=[], state_data_lens=[], state_item_lens=[],
                     kv_cache_dtype_str="auto").items():
        setattr(args, k, v)
    mgr = NixlKVManager(args, DisaggregationMode.PREFILL, sa, False)
    kw = {}
    if "dest_tp_ranks" in NixlKVSender.__init__.__code__.co_varnames:
        kw = dict(dest_tp_ranks=[0], pp_rank=0)
    addr = f"127.0.0.1:{port}"
    new = lambda r: NixlKVSender(mgr, addr, r, **kw)  # noqa: E731
    out = bench_senders(new, rooms, pages)
    senders = [new(2_000_000 + i) for i in range(1000)]
    out["poll_1000_poll_all"] = bench_poll(lambda: [s.poll() for s in senders])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvxferd", required=True)
    ap.add_argument("--rooms", type=int, default=2000)
    ap.add_argument("--no-sglang", action="store_true")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kvxbench")
    ep = "ipc://" + os.path.join(work, "ctl.sock")
    d = subprocess.Popen([a.kvxferd, "-nixl-backend", "loopback", "-control", ep, "-disaggregation-bootstrap-port", str(free_port()), "-debug-addr", ""],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(500):
            if os.path.exists(ep[len("ipc://"):]):
                break
            time.sleep(0.01)
        pages = np.arange(8, dtype=np.int32)
        res = {"load_avg": os.getloadavg(), "rooms": a.rooms}
        res["kvxfer_reqrep"] = kvxfer_side(ep, range(10_000, 10_000 + a.rooms), pages, False)
        res["kvxfer_shm"] = kvxfer_side(ep, range(20_000, 20_000 + a.rooms), pages, True)
        if not a.no_sglang:
            res["sglang_inprocess"] = sglang_side(range(30_000, 30_000 + a.rooms), pages, work)
        res["load_avg_end"] = os.getloadavg()
        print(json.dumps(res))
    finally:
        d.terminate()
        d.wait()
    os._exit(0)  # SGLang's manager threads do not stop on their own


if __name__ == "__main__":
    main()
