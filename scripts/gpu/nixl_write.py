#!/usr/bin/env python3
"""NIXL's own Python doing the GPU check's transfer (the baseline for kvxferd).

Two processes, as in the check: a target (the decode) registers its GPU KV
with a NIXL agent; an initiator (the prefill side) registers its GPU KV and
WRITEs each room's pages into the target with one prepared request per room
(per-page descriptors, SGLang's way: prep_xfer_dlist + make_prepped_xfer with
indices, a notification per room), timing transfer() -> DONE. The target then
checks every byte (device-to-host). The geometry is the Go check's
(KVXFER_GPU_LAYERS, _ITEM, _PAGES, _ROOMS; same defaults), and the byte
pattern is nixl/kvmem.Pattern.

Needs torch with CUDA and the NIXL wheel (nixl_cu13 or nixl_cu12 importable).
Usage: nixl_write.py [--out FILE]   (starts the target itself)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def shape():
    g = lambda k, d: int(os.environ.get(k, d))  # noqa: E731
    return g("KVXFER_GPU_LAYERS", 16), g("KVXFER_GPU_ITEM", 64 << 10), g("KVXFER_GPU_PAGES", 64), g("KVXFER_GPU_ROOMS", 16)


def nixl_api():
    for mod in ("nixl_cu13", "nixl_cu12", "nixl"):
        try:
            m = __import__(mod + "._api", fromlist=["nixl_agent", "nixl_agent_config"])
            return m.nixl_agent, m.nixl_agent_config, mod
        except ImportError:
            continue
    raise SystemExit("NIXL's Python package is not installed (nixl_cu13 / nixl_cu12)")


def read_json(proc):
    """The next KVXJSON line of the target (NIXL may log to stdout too)."""
    for line in proc.stdout:
        if line.startswith("KVXJSON "):
            return json.loads(line[len("KVXJSON "):])
        sys.stderr.write("[target] " + line)
    raise SystemExit("the target exited early")


def room_id(r):
    return 7000 + r


class Mem:
    """GPU memory through torch (the check), or host memory through numpy
    (--dram: a CPU smoke run of this script against NIXL over UCX)."""

    def __init__(self, dram):
        self.dram = dram
        self.kind = "DRAM" if dram else "VRAM"
        if dram:
            import numpy
            self.np = numpy
        else:
            import torch
            self.torch = torch

    def zeros(self, n):
        if self.dram:
            return self.np.zeros(n, dtype=self.np.uint8)
        return self.torch.zeros(n, dtype=self.torch.uint8, device="cuda:0")

    def ptr(self, a):
        return a.ctypes.data if self.dram else a.data_ptr()

    def pattern(self, room, b, pages, item):
        """kvmem.Pattern(room, b, j, k) for j < pages, k < item, as uint8."""
        if self.dram:
            j = self.np.arange(pages, dtype=self.np.int64).reshape(-1, 1)
            k = self.np.arange(item, dtype=self.np.int64).reshape(1, -1)
            return (((room % 251) * 7 + b * 37 + j * 11 + k * 3 + 1) & 0xFF).astype(self.np.uint8)
        t = self.torch
        j = t.arange(pages, device="cuda:0", dtype=t.int64).view(-1, 1)
        k = t.arange(item, device="cuda:0", dtype=t.int64).view(1, -1)
        return (((room % 251) * 7 + b * 37 + j * 11 + k * 3 + 1) & 0xFF).to(t.uint8)

    def sync(self):
        if not self.dram:
            self.torch.cuda.synchronize()

    def mismatches(self, a, b):
        return int((a != b).sum()) if self.dram else int((a != b).sum().item())

    def to_host(self, a):
        return a.copy() if self.dram else a.cpu()


def descs(base, nbufs, buf_len, slots, item, dev):
    return [(base + b * buf_len + s * item, item, dev) for b in range(nbufs) for s in range(slots)]


def target(workdir, dram):
    mem = Mem(dram)
    nixl_agent, nixl_agent_config, _ = nixl_api()
    layers, item, pages, rooms = shape()
    nbufs, slots = 2 * layers, pages * rooms
    kv = mem.zeros(nbufs * slots * item)
    agent = nixl_agent("nixl-py-target", nixl_agent_config(backends=["UCX"]))
    agent.register_memory([(mem.ptr(kv), kv.size if dram else kv.numel(), 0, "")], mem.kind)
    with open(os.path.join(workdir, "target.md.tmp"), "wb") as f:
        f.write(agent.get_agent_metadata())
    os.rename(os.path.join(workdir, "target.md.tmp"), os.path.join(workdir, "target.md"))
    print("KVXJSON " + json.dumps({"target_base": mem.ptr(kv)}), flush=True)
    done, deadline = set(), time.monotonic() + 240
    while len(done) < rooms:
        for _, msgs in agent.get_new_notifs().items():
            for m in msgs:
                done.add(int(m))
        if time.monotonic() > deadline:
            raise SystemExit(f"target: only {len(done)} of {rooms} notifications")
    mem.sync()
    host = mem.to_host(kv)  # device-to-host: every byte is checked on the host copy
    hmem = Mem(True)
    view = host.numpy().reshape(nbufs, slots, item) if not dram else host.reshape(nbufs, slots, item)
    mism = 0
    for r in range(rooms):
        for b in range(nbufs):
            mism += hmem.mismatches(view[b, r * pages:(r + 1) * pages], hmem.pattern(room_id(r), b, pages, item))
    print("KVXJSON " + json.dumps({"verified_bytes": int(view.size), "mismatches": mism}), flush=True)


def initiator(out, dram):
    mem = Mem(dram)
    nixl_agent, nixl_agent_config, mod = nixl_api()
    layers, item, pages, rooms = shape()
    nbufs, slots = 2 * layers, pages * rooms
    work = tempfile.mkdtemp(prefix="nixlpy")
    tgt = subprocess.Popen([sys.executable, __file__, "--target", work] + (["--dram"] if dram else []),
                           stdout=subprocess.PIPE, text=True)
    tbase = read_json(tgt)["target_base"]
    md_path = os.path.join(work, "target.md")
    while not os.path.exists(md_path):
        time.sleep(0.01)
    src = mem.zeros(nbufs * pages * item)
    agent = nixl_agent("nixl-py-initiator", nixl_agent_config(backends=["UCX"]))
    agent.register_memory([(mem.ptr(src), nbufs * pages * item, 0, "")], mem.kind)
    with open(md_path, "rb") as f:
        peer = agent.add_remote_agent(f.read())
    local = agent.prep_xfer_dlist("", descs(mem.ptr(src), nbufs, pages * item, pages, item, 0), mem.kind)
    remote = agent.prep_xfer_dlist(peer, descs(tbase, nbufs, slots * item, slots, item, 0), mem.kind)
    sv = src.reshape(nbufs, pages, item) if dram else src.view(nbufs, pages, item)
    times = []
    for r in range(rooms):
        for b in range(nbufs):
            sv[b][:] = mem.pattern(room_id(r), b, pages, item)
        mem.sync()
        li = [b * pages + j for b in range(nbufs) for j in range(pages)]
        ri = [b * slots + r * pages + j for b in range(nbufs) for j in range(pages)]
        t0 = time.perf_counter()
        h = agent.make_prepped_xfer("WRITE", local, li, remote, ri, str(room_id(r)).encode())
        st = agent.transfer(h)
        while st != "DONE":
            if st == "ERR":
                raise SystemExit(f"room {room_id(r)}: transfer failed")
            st = agent.check_xfer_state(h)
        times.append((time.perf_counter() - t0) * 1e3)
        agent.release_xfer_handle(h)
    res = read_json(tgt)
    tgt.wait(timeout=60)
    room_bytes = nbufs * pages * item
    med = statistics.median(times)
    line = (f"NIXL {mod} Python (UCX, {mem.kind}), same transfer: {layers} layers (K+V), {item}-byte pages, {pages} pages/room, "
            f"{rooms} rooms; {res['verified_bytes']} bytes verified on the target (read back to the host), {res['mismatches']} mismatches; "
            f"per room (make_prepped_xfer -> DONE, {room_bytes / (1 << 20):.1f} MiB): median {med:.3f} ms = "
            f"{room_bytes / (med / 1e3) / 1e9:.2f} GB/s, min {min(times):.3f} ms, max {max(times):.3f} ms")
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
    if res["mismatches"]:
        raise SystemExit(1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--target")
    ap.add_argument("--out")
    ap.add_argument("--dram", action="store_true", help="host memory (numpy): a CPU smoke run of the script")
    a = ap.parse_args()
    if a.target:
        target(a.target, a.dram)
    else:
        initiator(a.out, a.dram)
