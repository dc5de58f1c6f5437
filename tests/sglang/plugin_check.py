#!/usr/bin/env python3
"""kvxfer's SGLang plug-in, loaded by SGLang's own plug-in loader, driving a
prefill rank in prefill.py's order against SGLang's real decode receiver
(decode_peer.py) over real NIXL. Run by a release's venv:

    /opt/kvxfer-sglang/0.5.23/bin/python tests/sglang/plugin_check.py --kvxferd bin/kvxferd

kvxfer is "installed" into a temporary site directory (its package plus a
dist-info with the sglang.srt.plugins entry point, what pip writes), so the
shared venv is left untouched. Prints one JSON line per scenario; exits 1 on
any failure. The "exit" scenario checks that kvxferd dies with its parent.
"""

import argparse
import base64
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "stubs"))
os.environ.setdefault("UCX_TLS", "tcp,self,sm")
os.environ.setdefault("SGLANG_HOST_IP", "127.0.0.1")

LAYERS, SLOTS, ITEM, AUX_SLOTS = 2, 1024, 256, 512
AUX_ITEMS = [64, 64, 64, 64, 512, 512, 64, 128, 128, 64]


def install_plugin(site):
    """What `pip install --no-deps kvxfer` leaves in site-packages."""
    src = os.path.join(ROOT, "python", "kvxfer")
    shutil.copytree(src, os.path.join(site, "kvxfer"), ignore=shutil.ignore_patterns("__pycache__", "bin"))
    di = os.path.join(site, "kvxfer-0.1.0.dist-info")
    os.makedirs(di)
    with open(os.path.join(di, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: kvxfer\nVersion: 0.1.0\n")
    with open(os.path.join(di, "entry_points.txt"), "w") as f:
        f.write("[sglang.srt.plugins]\nkvxfer = kvxfer.sglang_plugin:register\n")
    sys.path.insert(0, site)


class ShmBuf:
    def __init__(self, path, size):
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
        os.ftruncate(fd, size)
        self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED)
        os.close(fd)
        import numpy as np
        self.arr = np.frombuffer(self.mm, dtype=np.uint8)
        self.ptr = self.arr.ctypes.data
        self.size = size


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def prefill_server_args(shim, port):
    """SGLang's server args for a prefill rank whose bootstrap server is on port
    (a plain copy, so a test may set attributes the shim does not have)."""
    sa = type("SA", (), {})()
    for k, v in vars(shim.server_args()).items():
        setattr(sa, k, v)
    sa.disaggregation_mode = "prefill"
    sa.disaggregation_bootstrap_port = port
    return sa


def prefill_kv_args(KVArgs, work, layers=None):
    """The prefill rank's KVArgs over fresh shared-memory files in work: K and V
    buffers of SLOTS items per layer and SGLang's 10 aux buffers (the module's
    constants as they are at call time: prefill_bench.py sets its own). The
    ShmBufs are returned too; they must outlive the manager."""
    layers = LAYERS if layers is None else layers
    kv = [ShmBuf(os.path.join(work, f"kv{i}"), SLOTS * ITEM) for i in range(2 * layers)]
    aux = [ShmBuf(os.path.join(work, f"aux{i}"), AUX_SLOTS * n) for i, n in enumerate(AUX_ITEMS)]
    args = KVArgs()
    for k, v in dict(engine_rank=0, kv_data_ptrs=[b.ptr for b in kv], kv_data_lens=[b.size for b in kv],
                     kv_item_lens=[ITEM] * len(kv), aux_data_ptrs=[b.ptr for b in aux],
                     aux_data_lens=[b.size for b in aux], aux_item_lens=AUX_ITEMS, kv_data_mem_kinds=["DRAM"] * len(kv),
                     ib_device=None, gpu_id=0, pp_rank=0, system_dp_rank=0, page_size=1, kv_head_num=1,
                     total_kv_head_num=1, prefill_start_layer=0, state_types=[], state_data_ptrs=[],
                     state_data_lens=[], state_item_lens=[], kv_cache_dtype_str="auto", kv_layer_ids=[]).items():
        setattr(args, k, v)
    return args, kv, aux



class Peer:
    def __init__(self, bootstrap):
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   SGLANG_DISAGGREGATION_WAITING_TIMEOUT="8",
                   SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT="4")
        self.p = subprocess.Popen([sys.executable, os.path.join(HERE, "decode_peer.py"), "--bootstrap", bootstrap,
                                   "--layers", str(LAYERS), "--slots", str(SLOTS), "--item", str(ITEM),
                                   "--aux-slots", str(AUX_SLOTS)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        self.ids = 0
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("decode peer exited before ready")
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # NIXL/UCX chatter on stdout
            if isinstance(ev, dict) and ev.get("event") == "ready":
                self.info = ev
                break

    def call(self, op, **kw):
        self.ids += 1
        kw.update(op=op, id=self.ids)
        self.p.stdin.write(json.dumps(kw) + "\n")
        self.p.stdin.flush()
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("decode peer exited")
            try:
                m = json.loads(line)
            except ValueError:
                continue
            if isinstance(m, dict) and m.get("id") == self.ids:
                if not m.get("ok", True):
                    raise RuntimeError(f"decode {op}: {m.get('error')}")
                return m

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=10)
        except Exception:  # noqa: BLE001
            self.p.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvxferd", required=True)
    ap.add_argument("--scenario", default="all")
    a = ap.parse_args()
    os.environ["KVXFER_BIN"] = os.path.abspath(a.kvxferd)
    work = tempfile.mkdtemp(prefix="kvx-plugin-", dir="/dev/shm")
    try:
        sys.exit(run(a, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(a, work):
    install_plugin(os.path.join(work, "site"))
    import kvx_sglang_shim
    kvx_sglang_shim.install()
    import numpy as np
    from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
    from sglang.srt.disaggregation.utils import DisaggregationMode, KVClassType, TransferBackend, get_kv_class
    from sglang.srt.plugins import load_plugins
    from importlib.metadata import version

    results = []
    failed = False

    def report(name, ok, **kw):
        nonlocal failed
        failed |= not ok
        kw.update(release=version("sglang"), scenario=name, result="PASS" if ok else "FAIL")
        results.append(kw)
        print(json.dumps(kw), flush=True)

    if a.scenario == "exit":
        return scenario_exit(a, work)

    # 1. SGLang's loader puts kvxfer's classes behind get_kv_class.
    load_plugins()
    import sglang.srt.disaggregation.nixl.conn as conn
    M = get_kv_class(TransferBackend.NIXL, KVClassType.MANAGER)
    S = get_kv_class(TransferBackend.NIXL, KVClassType.SENDER)
    R = get_kv_class(TransferBackend.NIXL, KVClassType.RECEIVER)
    B = get_kv_class(TransferBackend.NIXL, KVClassType.BOOTSTRAP_SERVER)
    ok = (M.__module__ == "kvxfer.sglang_plugin" and S.__module__ == "kvxfer.sglang_plugin"
          and R.__module__ == conn.__name__ and B.__module__ == conn.__name__
          and conn.NixlKVManager is M and M.kvxfer_original.__module__ == conn.__name__)
    report("loader", ok, manager=f"{M.__module__}.{M.__name__}", sender=f"{S.__module__}.{S.__name__}",
           receiver=f"{R.__module__}.{R.__name__}", bootstrap=f"{B.__module__}.{B.__name__}")

    # Decode mode: SGLang's own manager, built unchanged.
    dkv = KVArgs()
    dbuf = np.zeros(4096, dtype=np.uint8)
    daux = np.zeros(4096, dtype=np.uint8)
    for k, v in dict(engine_rank=0, kv_data_ptrs=[dbuf.ctypes.data], kv_data_lens=[4096], kv_item_lens=[256],
                     aux_data_ptrs=[daux.ctypes.data], aux_data_lens=[4096], aux_item_lens=[64],
                     kv_data_mem_kinds=["DRAM"], ib_device=None, gpu_id=0, pp_rank=0, system_dp_rank=0,
                     page_size=1, kv_head_num=1, total_kv_head_num=1, prefill_start_layer=0,
                     state_types=[], state_data_ptrs=[], state_data_lens=[], state_item_lens=[],
                     kv_cache_dtype_str="auto", kv_layer_ids=[0]).items():
        setattr(dkv, k, v)
    try:
        dm = M(dkv, DisaggregationMode.DECODE, kvx_sglang_shim.server_args(), False)
        report("decode-mode manager is SGLang's", type(dm) is M.kvxfer_original, got=type(dm).__name__)
    except Exception as e:  # noqa: BLE001
        report("decode-mode manager is SGLang's", False, error=repr(e))

    # SGLang's own bootstrap server (the main process's), one prefill rank.
    port = free_port()
    bs = B(host="127.0.0.1", port=port)
    sa = prefill_server_args(kvx_sglang_shim, port)
    args, kv, aux = prefill_kv_args(KVArgs, work)

    # Private anonymous memory: a clear start-up error.
    bad = KVArgs()
    for k in vars(args):
        setattr(bad, k, getattr(args, k))
    priv = np.zeros(SLOTS * ITEM, dtype=np.uint8)
    bad.kv_data_ptrs = [priv.ctypes.data] + list(args.kv_data_ptrs[1:])
    try:
        M(bad, DisaggregationMode.PREFILL, sa, False)
        report("private memory refused", False)
    except Exception as e:  # noqa: BLE001
        report("private memory refused", "private anonymous memory" in str(e) and "shared" in str(e), error=str(e))

    t0 = time.monotonic()
    mgr = M(args, DisaggregationMode.PREFILL, sa, False)
    report("manager starts kvxferd", type(mgr).__name__ == "KvxferPrefillManager",
           start_s=round(time.monotonic() - t0, 3), child_start_s=round(mgr.daemon.start_seconds, 3),
           pid=mgr.daemon.pid)
    peer = Peer(f"127.0.0.1:{port}")
    rng = np.random.default_rng(7)
    room_seq = [1000]

    def new_sender(room):
        kw = dict(mgr=mgr, bootstrap_addr=f"127.0.0.1:{port}", bootstrap_room=room,
                  req_has_disagg_prefill_dp_rank=False)
        if "dest_tp_ranks" in conn.NixlKVSender.kvxfer_original.__init__.__code__.co_varnames:
            kw.update(dest_tp_ranks=[0], pp_rank=0)
        return S(**kw)

    def poll_until(s, want, timeout=15):
        t = time.monotonic()
        while time.monotonic() - t < timeout:
            st = s.poll()
            if st in want:
                return st
            time.sleep(0.002)
        return s.poll()

    def transfer(chunks=3, npages=12, abort_mid=False):
        room_seq[0] += 1
        room = room_seq[0]
        src = rng.choice(SLOTS, npages, replace=False).astype(np.int32)
        dst = rng.choice(SLOTS, npages, replace=False).astype(np.int32)
        aux_p, aux_d = int(rng.integers(AUX_SLOTS)), int(rng.integers(AUX_SLOTS))
        for b in kv:
            for p in src:
                b.arr[p * ITEM:(p + 1) * ITEM] = rng.integers(0, 256, ITEM, dtype=np.uint8)
        for b, n in zip(aux, AUX_ITEMS):
            b.arr[aux_p * n:(aux_p + 1) * n] = rng.integers(0, 256, n, dtype=np.uint8)
        aux[-1].arr[aux_p * 64:aux_p * 64 + 8] = np.frombuffer(np.uint64(room).tobytes(), np.uint8)
        s = new_sender(room)
        peer.call("open", rooms=[{"room": room, "pages": dst.tolist(), "aux": aux_d}])
        st = poll_until(s, (KVPoll.WaitingForInput, KVPoll.Failed))
        if st != KVPoll.WaitingForInput:
            return s, room, f"poll {st} before init", None
        s.pop_decode_prefix_len()
        s.init(npages, aux_p)
        parts = np.array_split(src, chunks)
        for i, part in enumerate(parts):
            s.send(part, None) if i < len(parts) - 1 or not abort_mid else None
            if abort_mid and i == len(parts) - 2:
                s.abort()
                break
        return s, room, None, (src, dst, aux_p, aux_d)

    def verify(layout):
        src, dst, aux_p, aux_d = layout
        got = peer.call("read", pages=dst.tolist(), aux=aux_d)
        for b, g in zip(kv, got["kv"]):
            want = b"".join(bytes(b.arr[p * ITEM:(p + 1) * ITEM]) for p in src)
            if base64.b64decode(g) != want:
                return False
        for b, n, g in zip(aux, AUX_ITEMS, got["aux"]):
            if base64.b64decode(g) != bytes(b.arr[aux_p * n:(aux_p + 1) * n]):
                return False
        return True

    # 2. One room, three chunks, bytes verified.
    t = time.monotonic()
    s, room, err, layout = transfer()
    st = poll_until(s, (KVPoll.Success, KVPoll.Failed)) if not err else KVPoll.Failed
    w = peer.call("wait", rooms=[room], until="terminal", timeout=15)
    ok = st == KVPoll.Success and w["rooms"][0]["phase"] == "success" and verify(layout)
    report("three chunks", ok, prefill=int(st), decode=w["rooms"][0]["phase"], ms=round((time.monotonic() - t) * 1e3))
    s.clear()

    # 3. 20 rooms, each verified.
    good = 0
    for _ in range(20):
        s, room, err, layout = transfer(chunks=2, npages=8)
        if not err and poll_until(s, (KVPoll.Success, KVPoll.Failed)) == KVPoll.Success:
            w = peer.call("wait", rooms=[room], until="terminal", timeout=15)
            good += w["rooms"][0]["phase"] == "success" and verify(layout)
        s.clear()
    report("20 rooms", good == 20, success=good)

    # 4. Prefill abort mid-transfer: Failed, failure_exception raises SGLang's KVTransferError, clear.
    s, room, err, _ = transfer(abort_mid=True)
    st = poll_until(s, (KVPoll.Failed,))
    try:
        s.failure_exception()
        msg = None
    except Exception as e:  # noqa: BLE001
        msg = f"{type(e).__module__}.{type(e).__name__}: {e}"
    s.clear()
    w = peer.call("wait", rooms=[room], until="terminal", timeout=15)
    report("abort mid-transfer", st == KVPoll.Failed and msg is not None and "KVTransferError" in msg,
           prefill=int(st), failure=msg, decode=w["rooms"][0]["phase"])

    # 5. SIGKILL kvxferd mid-transfer: polls answer Failed; a new room restarts it.
    s1, room1, err, _ = transfer(chunks=3)
    s2 = new_sender(room_seq[0] + 500)
    # A room the decode holds, waiting for chunks that will never come: the
    # restarted kvxferd is told of it and tells the decode (0.5.20+ read it).
    room_seq[0] += 1
    room3 = room_seq[0]
    s3 = new_sender(room3)
    peer.call("open", rooms=[{"room": room3, "pages": [1, 2], "aux": 1}])
    st3 = poll_until(s3, (KVPoll.WaitingForInput, KVPoll.Failed))
    pid = mgr.daemon.pid
    os.kill(pid, signal.SIGKILL)
    t = time.monotonic()
    sts = [poll_until(x, (KVPoll.Failed,), timeout=10) for x in (s1, s2, s3)]
    dt = time.monotonic() - t
    msgs = []
    for x in (s1, s2, s3):
        try:
            x.failure_exception()
        except Exception as e:  # noqa: BLE001
            msgs.append(str(e))
    report("kvxferd SIGKILL: polls Failed", all(x == KVPoll.Failed for x in sts) and all("transfer_process_lost" in m for m in msgs),
           ms_to_failed=round(dt * 1e3, 1), failure=msgs[:1])
    t = time.monotonic()
    w = peer.call("wait", rooms=[room3], until="released", timeout=20)["rooms"][0]
    reads_status = tuple(int(x) for x in version("sglang").split(".")[:3]) >= (0, 5, 20)
    if reads_status:
        ok = (st3 == KVPoll.WaitingForInput and w["phase"] == "failed" and "transfer_process_lost" in str(w["reason"])
              and w["release"] in ("acks", "immediate"))
    else:  # 0.5.18 reads no status: its room waits for the decode's own timeout
        ok = st3 == KVPoll.WaitingForInput and w["phase"] == "failed"
    report("kvxferd SIGKILL: the decode holding a room is told", ok, reads_status=reads_status, phase=w["phase"],
           reason=str(w["reason"])[:120], pages_released_by=w["release"], s_to_released=round(time.monotonic() - t, 2))
    time.sleep(1.05)  # the restart back-off
    t = time.monotonic()
    room_seq[0] += 1000
    s, room, err, layout = transfer()
    restart = mgr.daemon.start_seconds
    st = poll_until(s, (KVPoll.Success, KVPoll.Failed)) if not err else KVPoll.Failed
    w = peer.call("wait", rooms=[room], until="terminal", timeout=15)
    # SGLang's decode caches the rank's connection and registers its NIXL agent
    # once; the restarted kvxferd replays that registration from its -state-dir,
    # so the SAME decode's next room must succeed, every byte verified.
    ok = (mgr.daemon.pid != pid and st == KVPoll.Success and w["rooms"][0]["phase"] == "success"
          and verify(layout))
    report("restart: same decode's next room succeeds", ok, new_pid=mgr.daemon.pid, restart_s=round(restart or 0, 3),
           prefill=int(st), decode=w["rooms"][0]["phase"], error=err)
    s.clear()
    peer.close()
    peer = Peer(f"127.0.0.1:{port}")  # a decode that registers with the restarted kvxferd
    s, room, err, layout = transfer()
    st = poll_until(s, (KVPoll.Success, KVPoll.Failed)) if not err else KVPoll.Failed
    w = peer.call("wait", rooms=[room], until="terminal", timeout=15)
    ok = st == KVPoll.Success and w["rooms"][0]["phase"] == "success" and verify(layout)
    report("restart: new decode's room succeeds", ok, prefill=int(st), decode=w["rooms"][0]["phase"], error=err)
    s.clear()
    peer.close()
    mgr.shutdown()

    # 6. Attach: KVXFER_CONTROL names a kvxferd started here (the flags the
    # manager would pass, registering with SGLang's bootstrap server); the
    # manager starts no child, moves a room to Success, and neither kills nor
    # restarts the kvxferd it did not start.
    port = free_port()
    bs = B(host="127.0.0.1", port=port)
    sa.disaggregation_bootstrap_port = port
    endpoint = "ipc://" + os.path.join(work, "attach.sock")
    ext = subprocess.Popen([os.environ["KVXFER_BIN"], "-nixl-backend", "nixl", "-host", "127.0.0.1",
                            "-tp-size", "1", "-tp-rank", "0", "-pp-size", "1", "-pp-rank", "0",
                            "-dp-size", "1", "-dp-rank", "0", "-page-size", "1", "-kv-cache-dtype", "auto",
                            "-serve-bootstrap=false", "-disaggregation-bootstrap-port", str(port),
                            "-bootstrap-url", f"http://127.0.0.1:{port}", "-control", endpoint,
                            "-zmq-port", str(free_port()), "-state-components", "0"],
                           env=dict(os.environ, KVXFER_NIXL_PYTHON=sys.executable), stdin=subprocess.DEVNULL)
    try:
        before = children()
        os.environ["KVXFER_CONTROL"] = endpoint
        try:
            mgr = M(args, DisaggregationMode.PREFILL, sa, False)
        finally:
            del os.environ["KVXFER_CONTROL"]
        spawned = children() - before
        hello_pid = mgr.daemon.client.hello().get("pid")
        report("attach: no child started", mgr.daemon.proc is None and not spawned and hello_pid == ext.pid,
               spawned=sorted(spawned), kvxferd_pid=hello_pid, external_pid=ext.pid,
               attach_s=round(mgr.daemon.start_seconds, 3))
        peer = Peer(f"127.0.0.1:{port}")
        s, room, err, layout = transfer()
        st = poll_until(s, (KVPoll.Success, KVPoll.Failed)) if not err else KVPoll.Failed
        w = peer.call("wait", rooms=[room], until="terminal", timeout=15)
        ok = st == KVPoll.Success and w["rooms"][0]["phase"] == "success" and verify(layout)
        report("attach: room succeeds", ok, prefill=int(st), decode=w["rooms"][0]["phase"], error=err)
        s.clear()
        # A lost connection: the manager reconnects to the same kvxferd (no
        # kill, no new process, memory not registered twice) for the next room.
        mgr.daemon.lost("test: connection dropped")
        time.sleep(1.05)  # the restart back-off
        s, room, err, layout = transfer()
        st = poll_until(s, (KVPoll.Success, KVPoll.Failed)) if not err else KVPoll.Failed
        w = peer.call("wait", rooms=[room], until="terminal", timeout=15)
        ok = (ext.poll() is None and mgr.daemon.proc is None and not (children() - before - {peer.p.pid})
              and mgr.daemon.client is not None and mgr.daemon.client.hello().get("pid") == ext.pid
              and st == KVPoll.Success and w["rooms"][0]["phase"] == "success" and verify(layout))
        report("attach: reconnect, not restart", ok, prefill=int(st), decode=w["rooms"][0]["phase"], error=err,
               external_alive=ext.poll() is None, generation=mgr.daemon.generation)
        s.clear()
        peer.close()
        mgr.shutdown()
        time.sleep(0.3)
        report("attach: shutdown leaves the kvxferd it did not start", ext.poll() is None, external_pid=ext.pid)
    finally:
        ext.kill()
        ext.wait()

    # 7. DP ranks: the rank of attention-DP group 1 of 2 (its kvxferd registers
    # dp_size 2 with SGLang's bootstrap server). A request without a prefill dp
    # rank registers room -> 1 (POST /register_dp_rank), read back through
    # SGLang's /query_dp_ranks; one carrying it does not; with
    # follow_bootstrap_room nothing is registered and a room of the other DP
    # rank fails, as in SGLang's sender. (No transfer: the topology would need
    # every DP rank registered, and the stub decode has one.)
    import urllib.request

    def query(rooms):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/query_dp_ranks", method="POST",
                                     data=json.dumps({"bootstrap_rooms": rooms}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    port = free_port()
    bs = B(host="127.0.0.1", port=port)
    sa.disaggregation_bootstrap_port = port
    sa.enable_dp_attention, sa.dp_size, sa.tp_size, sa.load_balance_method = True, 2, 2, "round_robin"
    args.engine_rank, args.system_dp_rank = 1, 1
    mgr = M(args, DisaggregationMode.PREFILL, sa, False)
    try:
        s1 = new_sender(7000)  # no prefill dp rank: registered
        kw = dict(mgr=mgr, bootstrap_addr=f"127.0.0.1:{port}", bootstrap_room=7002, req_has_disagg_prefill_dp_rank=True)
        if "dest_tp_ranks" in conn.NixlKVSender.kvxfer_original.__init__.__code__.co_varnames:
            kw.update(dest_tp_ranks=[0], pp_rank=0)
        s2 = S(**kw)
        got = query([7000, 7002])
        report("dp rank registered with SGLang's bootstrap server", got == {"7000": 1} and mgr.dp_rank == 1,
               query_dp_ranks=got, dp_rank=mgr.dp_rank)
        for x in (s1, s2):
            x.abort()
            x.clear()
        mgr.load_balance_method = "follow_bootstrap_room"
        s3, s4 = new_sender(7101), new_sender(7200)  # 7101 % 2 == 1: ours; 7200: DP rank 0's
        got = query([7101, 7200])
        try:
            s4.failure_exception()
            msg = None
        except Exception as e:  # noqa: BLE001
            msg = str(e)
        ok = got == {} and s4.poll() == KVPoll.Failed and msg and "follow_bootstrap_room conflict" in msg \
            and s3.poll() != KVPoll.Failed
        report("dp rank: follow_bootstrap_room registers nothing, a foreign room fails", bool(ok),
               query_dp_ranks=got, failure=msg, ours=int(s3.poll()))
        s3.abort()
        s3.clear()
    finally:
        mgr.shutdown()
    return 1 if failed else 0


def children():
    """pids whose parent is this process."""
    me, out = os.getpid(), set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(") ", 1)[1].split()[1]) == me:
                        out.add(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def scenario_exit(a, work):
    """A child "SGLang scheduler" starts the manager, then is SIGKILLed: its kvxferd must go too."""
    code = f"""
import os, sys, time
sys.argv = ['x']
sys.path.insert(0, {os.path.join(HERE, 'stubs')!r})
"""
    # Reuse this script in a child that only builds a manager and sleeps.
    env = dict(os.environ, KVXFER_PLUGIN_EXIT_CHILD="1")
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--kvxferd", a.kvxferd, "--scenario", "exit-child"],
                         stdout=subprocess.PIPE, env=env, text=True)
    line = p.stdout.readline()
    info = json.loads(line)
    child = info["pid"]
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    t = time.monotonic()
    gone = False
    while time.monotonic() - t < 10:
        try:
            os.kill(child, 0)
            with open(f"/proc/{child}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    gone = True
                    break
        except (ProcessLookupError, FileNotFoundError):
            gone = True
            break
        time.sleep(0.01)
    ms = round((time.monotonic() - t) * 1e3, 1)
    # SGLang never shuts the manager down: kvxferd removes its own socket and
    # state directory once its scheduler is gone.
    left = [x for x in (info["socket"], info["state_dir"]) if x and os.path.exists(x)]
    ok = gone and not left
    from importlib.metadata import version
    r = dict(release=version("sglang"), scenario="SGLang process exits: no kvxferd, socket or state dir left",
             result="PASS" if ok else "FAIL", ms=ms, kvxferd_pid=child, left=left)
    print(json.dumps(r), flush=True)
    del code
    return 0 if ok else 1


if __name__ == "__main__" and "exit-child" in sys.argv:
    # The "SGLang scheduler" of scenario_exit.
    work = tempfile.mkdtemp(prefix="kvx-exit-", dir="/dev/shm")
    install_plugin(os.path.join(work, "site"))
    os.environ["KVXFER_BIN"] = os.path.abspath(sys.argv[sys.argv.index("--kvxferd") + 1])
    import kvx_sglang_shim
    kvx_sglang_shim.install()
    from sglang.srt.disaggregation.base.conn import KVArgs
    from sglang.srt.disaggregation.utils import DisaggregationMode, KVClassType, TransferBackend, get_kv_class
    from sglang.srt.plugins import load_plugins
    load_plugins()
    M = get_kv_class(TransferBackend.NIXL, KVClassType.MANAGER)
    B = get_kv_class(TransferBackend.NIXL, KVClassType.BOOTSTRAP_SERVER)
    port = free_port()
    B(host="127.0.0.1", port=port)
    sa = prefill_server_args(kvx_sglang_shim, port)
    args, kv, aux = prefill_kv_args(KVArgs, work, layers=1)
    mgr = M(args, DisaggregationMode.PREFILL, sa, False)
    print(json.dumps({"pid": mgr.daemon.pid, "socket": mgr.daemon.endpoint[len("ipc://"):],
                      "state_dir": mgr.state_dir}), flush=True)
    time.sleep(60)
    sys.exit(0)

if __name__ == "__main__":
    main()
