#!/usr/bin/env python3
"""The fourth benchmark engine: SGLang's own Python prefill
against kvxfer, on the same workload plans and the same decode side.

    /opt/kvxfer-sglang/0.5.18/bin/python tests/sglang/prefill_bench.py \
        --kvxferd bin/kvxferd --engine both --reps 3 --out bench/results/sglang

--engine sglang: SGLang's NixlKVManager in PREFILL mode plus one NixlKVSender
per room, unmodified, over real NIXL (UCX, DRAM), driven through their public
methods in prefill.py's order (sender created at admission, poll, init when
WaitingForInput, one send per chunk per iteration, poll until terminal,
clear). --engine kvxfer: the same script with kvxfer's plug-in loaded through
SGLang's own plug-in loader, so the manager and sender are kvxfer's
(KvxferPrefillManager + kvxferd -nixl-backend nixl). The decode side is one
decode_peer.py: SGLang's real NixlKVReceiver. --engine both runs each engine
in its own process, alternating, --reps times (kvxfer once per --kvxfer-spin
window, KVXFER_SHM_SPIN_MAX_US), and writes results.json and report.md.

Every run: rooms/s; CPU s per 1k rooms of the scheduler process
(getrusage RUSAGE_SELF: the driver plus, for SGLang, its bootstrap and
transfer threads) plus kvxferd (/proc/PID/stat) for kvxfer, and of the decode
process both share; cores busy (all three processes' CPU over wall time:
near the core count, the run was CPU-bound, spinning threads included); with an abort
share, the abort storm's rooms that never reached a terminal poll on prefill
(pinned), room entries left in the manager's dicts after every room was
cleared (leaked), abort-to-terminal (abort issued to the first terminal poll),
and rooms whose two sides disagree (prefill Success but decode failed, or the
reverse; a room decode itself aborted that prefill completed first, whose ABORT
lost the race, is counted apart as prefill-only success). Timeouts are short (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT and
WAITING_TIMEOUT), so the seeds' races show as pins held until a timeout.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "stubs"))
os.environ.setdefault("UCX_TLS", "tcp,self,sm")
os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")

LAYERS, SLOTS, ITEM, AUX_SLOTS = 2, 4096, 256, 512
AUX_ITEMS = [64, 64, 64, 64, 512, 512, 64, 128, 128, 64]
PHASES = ["before-sender", "before-init", "in-chunk", "after-success"]
SOURCES = ["decode", "client"]


def plans(n, seed, abort_share):
    """The workload: per room, chunks and pages per chunk (1-4 each) and, for
    abort_share of the rooms, an abort phase and source. Deterministic."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        chunks = int(rng.integers(1, 5))
        pages = [int(rng.integers(1, 5)) for _ in range(chunks)]
        p = {"room": 10_000 + i, "pages": pages, "aux": int(rng.integers(AUX_SLOTS)), "abort": None}
        if rng.random() < abort_share:
            ph, src = PHASES[int(rng.integers(len(PHASES)))], SOURCES[int(rng.integers(len(SOURCES)))]
            if ph == "in-chunk" and chunks < 2:
                p["pages"].append(1)
            p["abort"] = {"phase": ph, "source": src}
        out.append(p)
    return out


def proc_cpu(pid):
    """utime + stime of a process, seconds (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def self_cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def pct(v, q):
    if not v:
        return None
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_one(a):
    """One engine, one repetition, in this process."""
    import plugin_check
    from plugin_check import Peer, free_port, install_plugin
    # decode_peer.py's geometry comes from plugin_check's constants: match ours.
    plugin_check.LAYERS, plugin_check.SLOTS, plugin_check.ITEM, plugin_check.AUX_SLOTS = LAYERS, SLOTS, ITEM, AUX_SLOTS
    work = tempfile.mkdtemp(prefix="kvx-sglbench-", dir="/dev/shm")
    try:
        return _run(a, work, Peer, free_port, install_plugin)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(a, work, Peer, free_port, install_plugin):
    import plugin_check  # the prefill rank's server args and KVArgs, as the plug-in check builds them
    os.environ["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] = str(a.bootstrap_timeout)
    if a.engine == "kvxfer":
        os.environ["KVXFER_BIN"] = os.path.abspath(a.kvxferd)
        install_plugin(os.path.join(work, "site"))
    import kvx_sglang_shim
    kvx_sglang_shim.install()
    import numpy as np
    from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
    from sglang.srt.disaggregation.utils import DisaggregationMode, KVClassType, TransferBackend, get_kv_class
    from importlib.metadata import version
    if a.engine == "kvxfer":
        from sglang.srt.plugins import load_plugins
        load_plugins()
    import sglang.srt.disaggregation.nixl.conn as conn
    M = get_kv_class(TransferBackend.NIXL, KVClassType.MANAGER)
    S = get_kv_class(TransferBackend.NIXL, KVClassType.SENDER)
    B = get_kv_class(TransferBackend.NIXL, KVClassType.BOOTSTRAP_SERVER)
    port = free_port()
    B(host="127.0.0.1", port=port)
    sa = plugin_check.prefill_server_args(kvx_sglang_shim, port)
    args, kv, aux = plugin_check.prefill_kv_args(KVArgs, work)
    mgr = M(args, DisaggregationMode.PREFILL, sa, False)
    kvxferd_pid = getattr(getattr(mgr, "daemon", None), "pid", None)
    os.environ["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] = str(a.waiting_timeout)
    if a.decode_progress_delay_us >= 0:
        os.environ["KVX_DECODE_PROGRESS_DELAY_US"] = str(a.decode_progress_delay_us)
    peer = Peer(f"127.0.0.1:{port}")

    def new_sender(room):
        kw = dict(mgr=mgr, bootstrap_addr=f"127.0.0.1:{port}", bootstrap_room=room,
                  req_has_disagg_prefill_dp_rank=False)
        orig = getattr(S, "kvxfer_original", S)
        if "dest_tp_ranks" in orig.__init__.__code__.co_varnames:
            kw.update(dest_tp_ranks=[0], pp_rank=0)
        return S(**kw)

    ps = plans(a.rooms, a.seed, a.abort_share)
    free = list(range(SLOTS))
    free_aux = list(range(1, AUX_SLOTS))
    rng = np.random.default_rng(a.seed + 1)
    TERM = (KVPoll.Success, KVPoll.Failed)

    class R:
        pass

    live, pending_sender = [], []
    nxt, done = 0, 0
    checked_at, checked_t = 0, 0.0  # done and time at the last release check
    results = []
    # Warm-up: one room (wire-up of UCX, the bootstrap query, kvxferd's start)
    # is not timed; it uses room 1.
    s0 = new_sender(1)
    peer.call("open", rooms=[{"room": 1, "pages": [0], "aux": 0}])
    t = time.monotonic()
    while s0.poll() != KVPoll.WaitingForInput and time.monotonic() - t < 20:
        time.sleep(0.001)
    s0.init(1, 0)
    s0.send(np.asarray([0], dtype=np.int32), None)
    while s0.poll() not in TERM and time.monotonic() - t < 20:
        time.sleep(0.001)
    if hasattr(s0, "clear"):
        s0.clear()
    peer.call("wait", rooms=[1], until="terminal", timeout=20)
    peer.call("forget", rooms=[1])

    if a.idle > 0:
        # Idle: memory registered, a decode peer loaded, one room done, then
        # nothing for a.idle seconds: what does each process burn?
        c0, k0, w0 = self_cpu(), proc_cpu(kvxferd_pid) if kvxferd_pid else 0.0, time.monotonic()
        time.sleep(a.idle)
        w = time.monotonic() - w0
        out = {"engine": a.engine, "idle_s": w, "idle_cores_sched": (self_cpu() - c0) / w,
               "idle_cores_kvxferd": ((proc_cpu(kvxferd_pid) - k0) / w) if kvxferd_pid else None, "loadavg": loadavg()}
        peer.close()
        return out
    cpu0, kcpu0, t0 = self_cpu(), proc_cpu(kvxferd_pid) if kvxferd_pid else 0.0, time.monotonic()
    dcpu0 = proc_cpu(peer.p.pid)  # the decode process both engines share
    load0 = loadavg()
    deadline = t0 + a.max_seconds
    while done < len(ps) and time.monotonic() < deadline:
        # Admit: decode opens its receivers (one call for the batch); the
        # scheduler creates the senders (prefill.py: at admission), except a
        # room whose decode ABORT must come before the sender.
        batch = []
        while len(live) + len(pending_sender) < a.concurrency and nxt < len(ps) and len(free) >= 16 and free_aux:
            p = ps[nxt]
            nxt += 1
            r = R()
            r.p, r.room = p, p["room"]
            r.dst = [free.pop() for _ in range(sum(p["pages"]))]
            # A private aux slot (the same index on both sides) holding the room
            # id in its bootstrap_room field, as the model runner writes it:
            # decode's metadata gate and corruption check read it.
            r.aux = free_aux.pop()
            p = dict(p, aux=r.aux)
            r.p = p
            aux[-1].arr[r.aux * 64:r.aux * 64 + 8] = np.frombuffer(np.uint64(r.room).tobytes(), np.uint8)
            r.sent, r.inited, r.term, r.t_abort, r.t_term, r.status = 0, False, None, None, None, None
            r.t_open = time.monotonic()
            batch.append({"room": r.room, "pages": r.dst, "aux": p["aux"]})
            ab = p["abort"]
            if ab and ab["phase"] == "before-sender":
                r.aborted = ab["source"]
                if ab["source"] == "client":
                    r.s = new_sender(r.room)
                    r.s.abort()
                    r.t_abort = time.monotonic()
                    live.append(r)
                else:
                    pending_sender.append(r)
            else:
                r.aborted = None
                r.s = new_sender(r.room)
                live.append(r)
        if batch:
            peer.call("open", rooms=batch)
        for r in pending_sender:  # the decode ABORT reached prefill first
            peer.call("abort", rooms=[r.room])
            r.t_abort = time.monotonic()
            r.s = new_sender(r.room)
            live.append(r)
        pending_sender = []
        still = []
        for r in live:
            st = r.s.poll()
            now = time.monotonic()
            if st in TERM:
                r.term, r.t_term = int(st), now
                ab = r.p["abort"]
                if ab and ab["phase"] == "after-success" and r.t_abort is None:
                    r.aborted = ab["source"]  # not timed: the room was already terminal
                    (r.s.abort() if ab["source"] == "client" else peer.call("abort", rooms=[r.room]))
                if hasattr(r.s, "clear"):
                    r.s.clear()
                results.append(r)
                done += 1
                continue
            ab = r.p["abort"]
            if st == KVPoll.WaitingForInput and not r.inited:
                if ab and ab["phase"] == "before-init" and r.t_abort is None:
                    r.aborted = ab["source"]
                    (r.s.abort() if ab["source"] == "client" else peer.call("abort", rooms=[r.room]))
                    r.t_abort = now
                elif r.t_abort is None or r.aborted == "decode":
                    if hasattr(r.s, "pop_decode_prefix_len"):
                        r.s.pop_decode_prefix_len()
                    r.s.init(sum(r.p["pages"]), r.p["aux"])
                    r.inited = True
            if r.inited and r.sent < len(r.p["pages"]) and not (r.aborted == "client"):
                n = r.p["pages"][r.sent]
                src = rng.integers(0, SLOTS, n).astype(np.int32)
                r.s.send(src, None)
                r.sent += 1
                if ab and ab["phase"] == "in-chunk" and r.sent == 1 and r.t_abort is None:
                    r.aborted = ab["source"]
                    (r.s.abort() if ab["source"] == "client" else peer.call("abort", rooms=[r.room]))
                    r.t_abort = time.monotonic()
            still.append(r)
        live = still
        # Give decode's pages back once both sides ended (decode releases
        # them): every 32 rooms done, and whenever admission is starved of
        # pages or aux slots (at most every 2 ms), else a run longer than
        # the pages last would stall until --max-seconds.
        starved = len(free) < 16 or not free_aux
        now = time.monotonic()
        if done - checked_at >= 32 or (starved and now - checked_t >= 0.002):
            checked_at, checked_t = done, now
            fin = [r for r in results if not getattr(r, "freed", False)]
            if fin:
                v = peer.call("status", rooms=[r.room for r in fin])["rooms"]
                by = {x["room"]: x for x in v}
                gone = []
                for r in fin:
                    x = by.get(r.room)
                    if x and x["phase"] in ("success", "failed") and (x.get("release") or x["phase"] == "success"):
                        r.decode_phase, r.freed = x["phase"], True
                        free.extend(r.dst)
                        free_aux.append(r.aux)
                        gone.append(r.room)
                if gone:
                    peer.call("forget", rooms=gone)
    wall = time.monotonic() - t0
    cpu = self_cpu() - cpu0
    kcpu = (proc_cpu(kvxferd_pid) - kcpu0) if kvxferd_pid else 0.0
    dcpu = proc_cpu(peer.p.pid) - dcpu0
    load1 = loadavg()
    pinned = len(live) + len(pending_sender) + (len(ps) - nxt)
    # Decode's view of every room (waits for the ones still going).
    rest = [r for r in results if not getattr(r, "freed", False)]
    if rest:
        w = peer.call("wait", rooms=[r.room for r in rest], until="terminal", timeout=a.waiting_timeout + 5)
        by = {x["room"]: x for x in w["rooms"]}
        for r in rest:
            r.decode_phase = (by.get(r.room) or {}).get("phase")
        if os.environ.get("KVX_BENCH_DEBUG"):
            print("decode views:", json.dumps(w)[:1500], file=sys.stderr)
    # Rooms whose two sides ended differently (an abort issued after prefill's
    # Success is not a disagreement: decode was told to drop it).
    split = [r for r in results if (r.term == int(KVPoll.Success)) != (getattr(r, "decode_phase", None) == "success")
             and not (r.p["abort"] and r.p["abort"]["phase"] == "after-success")]
    # Of those, a room decode itself aborted that prefill completed first is
    # the protocol's race, not a disagreement: decode's ABORT arrived after
    # the room succeeded, which SGLang's prefill ignores too (kvxfer-demo's
    # prefill_only_success). Counted apart, so that a rise stays visible.
    raced = [r for r in split if r.term == int(KVPoll.Success) and r.aborted == "decode"
             and getattr(r, "decode_phase", None) == "failed"]
    split = [r for r in split if r not in raced]
    disagree = len(split)
    a2t = [r.t_term - r.t_abort for r in results if r.t_abort is not None and r.t_term is not None and r.t_term >= r.t_abort]
    a2t_never = sum(1 for r in live if r.t_abort is not None)
    # Room entries left in the manager's dicts (every room was cleared).
    ids = {p["room"] for p in ps}
    leaked, by_map = 0, {}
    for k, v in vars(mgr).items():
        if isinstance(v, dict):
            n = sum(1 for key in list(v) if key in ids or (isinstance(key, str) and key.isdigit() and int(key) in ids))
            if n:
                by_map[k] = n
                leaked += n
    out = {
        "engine": a.engine, "sglang": version("sglang"), "rooms": len(ps), "concurrency": a.concurrency,
        "abort_share": a.abort_share, "seed": a.seed, "terminal": len(results), "wall_s": wall,
        "rooms_per_s": len(results) / wall if wall > 0 else 0,
        "cpu_s_per_1k": 1000 * (cpu + kcpu) / max(1, len(results)),
        "cpu_sched_s_per_1k": 1000 * cpu / max(1, len(results)), "cpu_kvxferd_s_per_1k": 1000 * kcpu / max(1, len(results)),
        "cpu_decode_s_per_1k": 1000 * dcpu / max(1, len(results)),
        # Cores busy over the run, all three processes: near the machine's
        # count, the run was CPU-bound and no engine can go much faster there.
        "cores_busy": (cpu + kcpu + dcpu) / wall if wall > 0 else None, "cpus": os.cpu_count(),
        "pinned": pinned, "leaked": leaked, "leaked_by_map": by_map, "disagree": disagree,
        "disagree_rooms": [{"room": r.room, "prefill": r.term, "decode": getattr(r, "decode_phase", None),
                            "abort": r.p["abort"], "chunks": len(r.p["pages"]), "sent": r.sent} for r in split[:20]],
        "prefill_only_success": len(raced), "prefill_only_success_rooms": [r.room for r in raced[:20]],
        "succeeded": sum(1 for r in results if r.term == int(KVPoll.Success)),
        "aborted": sum(1 for r in results if r.t_abort is not None) + a2t_never,
        "a2t_p50_ms": (pct(a2t, 0.5) or 0) * 1e3 if a2t else None, "a2t_p99_ms": (pct(a2t, 0.99) or 0) * 1e3 if a2t else None,
        "a2t_never": a2t_never, "loadavg": [load0, load1], "decode_progress_delay_us": a.decode_progress_delay_us,
    }
    peer.close()
    if hasattr(mgr, "shutdown"):
        try:
            mgr.shutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


def both(a):
    """Each engine in its own process, alternating, reps times; kvxfer once
    per --kvxfer-spin window (KVXFER_SHM_SPIN_MAX_US), labelled with it."""
    rows = []
    spins = [int(x) for x in a.kvxfer_spin.split(",") if x.strip()] or [None]
    kvx = [("kvxfer", sp) for sp in spins]
    for rep in range(a.reps):
        order = [("sglang", None)] + kvx if rep % 2 == 0 else kvx[::-1] + [("sglang", None)]
        for eng, spin in order:
            for scen, share in (("throughput", 0.0), ("abort storm 50%", 0.5)):
                cmd = [sys.executable, os.path.abspath(__file__), "--engine", eng, "--kvxferd", a.kvxferd,
                       "--rooms", str(a.rooms), "--concurrency", str(a.concurrency), "--seed", str(a.seed),
                       "--abort-share", str(share), "--bootstrap-timeout", str(a.bootstrap_timeout),
                       "--waiting-timeout", str(a.waiting_timeout), "--max-seconds", str(a.max_seconds),
                       "--decode-progress-delay-us", str(a.decode_progress_delay_us)]
                env = dict(os.environ)
                if spin is not None:
                    env["KVXFER_SHM_SPIN_MAX_US"] = str(spin)
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.max_seconds + 120, env=env)
                row = None
                for line in p.stdout.splitlines():
                    if line.startswith("{") and '"engine"' in line:
                        row = json.loads(line)
                if row is None:
                    row = {"engine": eng, "error": (p.stderr or p.stdout)[-2000:]}
                row.update(scenario=scen, rep=rep, label=label(eng, spin), spin_max_us=spin)
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def label(eng, spin):
    return eng if spin is None else f"{eng} (spin {spin} µs)"


def med(v):
    v = sorted(x for x in v if x is not None)
    return v[len(v) // 2] if v else None


def report(rows, a):
    lines = ["# SGLang's own Python prefill against kvxfer (the fourth engine)", "",
             f"`tests/sglang/prefill_bench.py --engine both` ({a.reps} repetitions, engines alternating, "
             f"{a.rooms} rooms, {a.concurrency} concurrent, seed {a.seed}; SGLang {rows[0].get('sglang', '?')}; "
             f"one decode_peer.py: SGLang's real NixlKVReceiver, its NIXL progress thread "
             f"{'as SGLang ships it (spinning)' if a.decode_progress_delay_us < 0 else f'waiting up to {a.decode_progress_delay_us} µs for a UCX event'}; "
             f"NIXL UCX over DRAM, UCX_TLS={os.environ.get('UCX_TLS')}; "
             f"bootstrap timeout {a.bootstrap_timeout} s, decode waiting timeout {a.waiting_timeout} s). "
             "Medians over repetitions; load average (1, 5, 15 min) per run in results.json.", "",
             "| scenario | engine | rooms/s | kvxfer ÷ sglang rooms/s (median of per-rep ratios) | CPU s per 1k rooms (scheduler + kvxferd) | decode CPU s per 1k rooms | cores busy (all three processes, of "
             f"{os.cpu_count()}) | pinned (all reps) | leaked dict entries (max) | A2T p50 | A2T p99 | disagreements (all reps) | prefill-only success: decode's abort raced the completion (all reps) | load 1m |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    labels = list(dict.fromkeys(r.get("label", r.get("engine")) for r in rows))
    labels = ["sglang"] + [x for x in labels if x != "sglang"]
    for scen in ("throughput", "abort storm 50%"):
        by = {e: [r for r in rows if r.get("scenario") == scen and r.get("label", r.get("engine")) == e and "error" not in r] for e in labels}
        for e in labels:
            rs = by[e]
            if not rs:
                lines.append(f"| {scen} | {e} | error | | | | | | | | | | | |")
                continue
            ratios = []
            for rep in range(a.reps):
                sg = [r for r in by["sglang"] if r["rep"] == rep]
                k = [r for r in rs if r["rep"] == rep]
                if e != "sglang" and sg and k and sg[0]["rooms_per_s"] > 0:
                    ratios.append(k[0]["rooms_per_s"] / sg[0]["rooms_per_s"])
            ratio = f"{med(ratios):.2f}× [{min(ratios):.2f}–{max(ratios):.2f}]" if ratios else "—"
            cpu = med([r["cpu_s_per_1k"] for r in rs])
            sched = med([r["cpu_sched_s_per_1k"] for r in rs])
            kd = med([r["cpu_kvxferd_s_per_1k"] for r in rs])
            p50, p99 = med([r["a2t_p50_ms"] for r in rs]), med([r["a2t_p99_ms"] for r in rs])
            dec, busy = med([r.get("cpu_decode_s_per_1k") for r in rs]), med([r.get("cores_busy") for r in rs])
            lines.append(f"| {scen} | {e} | {med([r['rooms_per_s'] for r in rs]):.0f} | {ratio} | {cpu:.2f} ({sched:.2f} + {kd:.2f}) | "
                         f"{'—' if dec is None else f'{dec:.2f}'} | {'—' if busy is None else f'{busy:.2f}'} | "
                         f"{sum(r['pinned'] for r in rs)} | {max(r['leaked'] for r in rs)} | "
                         f"{'—' if p50 is None else f'{p50:.1f} ms'} | {'—' if p99 is None else f'{p99:.1f} ms'} | "
                         f"{sum(r['disagree'] for r in rs)} | {sum(r.get('prefill_only_success', 0) for r in rs)} | {rs[-1]['loadavg'][1].split()[0]} |")
    lines.append("")
    errs = [r for r in rows if "error" in r]
    if errs:
        lines.append(f"{len(errs)} runs failed; see results.json.")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["sglang", "kvxfer", "both"], default="both")
    ap.add_argument("--kvxferd", default=os.path.join(ROOT, "bin", "kvxferd"))
    ap.add_argument("--rooms", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--abort-share", type=float, default=0.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bootstrap-timeout", type=float, default=5)
    ap.add_argument("--waiting-timeout", type=float, default=5)
    ap.add_argument("--max-seconds", type=float, default=90)
    ap.add_argument("--kvxfer-spin", default="1000,50",
                    help="--engine both: run kvxfer once per value of KVXFER_SHM_SPIN_MAX_US (comma-separated; '' for kvxferd's default only)")
    ap.add_argument("--decode-progress-delay-us", type=int, default=1000,
                    help="the decode's NIXL progress thread waits up to this long for a UCX event (decode_peer.py "
                         "--progress-delay-us); -1: SGLang's agent as it ships, a thread that spins on one of this "
                         "host's cores, which a deployment's decode runs on hosts of its own")
    ap.add_argument("--out", default="")
    ap.add_argument("--idle", type=float, default=0, help="measure idle CPU for this many seconds after one room, instead of the workload")
    a = ap.parse_args()
    if a.engine != "both":
        print(json.dumps(run_one(a)), flush=True)
        os._exit(0)  # NIXL/UCX threads may not join
    rows = both(a)
    md = report(rows, a)
    print(md)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "sglang-results.json"), "w") as f:
            json.dump(rows, f, indent=1)
        with open(os.path.join(a.out, "sglang-report.md"), "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
