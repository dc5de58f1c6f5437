"""The NIXL Python side of the large-room benchmark (bench/large), on NIXL's own Python API.

One JSON object per line on stdout; requests on stdin.

  target     stands for a decode node: a slab of --bufs buffers of --size bytes in
             all, each buffer registered as its own region (as SGLang registers its
             KV buffers). Prints {"name", "md", "addr", "len"}. Its NIXL progress
             thread (SGLang's decode has one) waits for UCX events instead of
             spinning (--target-delay-us, see event_driven): the initiator's
             requests complete once the target has progressed, and a decode on
             another host spends none of this host's two cores. Notifications are
             drained every 1 ms;
             {"sum": [[off, len], ...]} -> {"sums": [crc32, ...]} (bytes landed);
             {"zero": true} clears the slab; "end" or EOF ends it.
  initiator  the same slab shape on the prefill side, filled with the pattern
             (seed 3 + 131*(i // 4096) + 7*i) & 0xff; reads the target's
             {"md", "addr", "slots", "item"}, prepares SGLang's lists (every slot of
             every buffer, both sides), then per {"rooms": [{"m": [so, do, n, ...],
             "si": [...], "di": [...]}, ...]} keeps those rooms, and per
             {"iters": k, "mode": "merged"|"sglang"} runs k rounds: one request
             per room (initialize_xfer over the room's merged list, its NIXL
             descriptor lists built per request as Go's Create does, or
             make_prepped_xfer over SGLang's per-page indices), all posted, then
             all waited for (check_xfer_state back to back), then released.
             Prints {"seconds", "cpu"} (process CPU of every thread).
"""

import argparse
import base64
import json
import sys
import time
import zlib

import numpy as np

try:
    from nixl._api import nixl_agent, nixl_agent_config
except ImportError:  # a lone nixl-cu12/cu13 wheel without the meta package
    try:
        from nixl_cu12._api import nixl_agent, nixl_agent_config
    except ImportError:
        from nixl_cu13._api import nixl_agent, nixl_agent_config


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def event_driven(delay_us):
    """Makes the next nixl_agent's progress thread wait up to delay_us for a
    UCX event between rounds of progress. NIXL's Python API fixes that wait
    (nixlAgentConfig.pthrDelay) at 0, a thread that spins on a core; the
    agent config is made inside nixl_agent, so its binding's constructor is
    wrapped for the one call. Returns the function that restores it."""
    api = sys.modules[nixl_agent.__module__]
    make = api.nixlBind.nixlAgent

    def with_delay(name, cfg):
        cfg.pthrDelay = delay_us
        return make(name, cfg)

    api.nixlBind.nixlAgent = with_delay

    def restore():
        api.nixlBind.nixlAgent = make

    return restore


def new_agent(name, size, bufs, prog_thread, delay_us=None):
    restore = event_driven(delay_us) if prog_thread and delay_us else (lambda: None)
    try:
        agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=prog_thread, backends=["UCX"]))
    finally:
        restore()
    # Page-aligned, as the KV pools SGLang registers are (torch aligns tensor
    # storage to at least 64 bytes; numpy's large arrays start 16 bytes into
    # a page). Kernel copies between buffers whose offsets differ within a
    # cache line run at about half speed, so an unaligned stand-in slows every
    # initiator whose source is aligned.
    raw = np.empty(size + 4096, dtype=np.uint8)  # large: numpy asks for huge pages
    skip = -raw.ctypes.data % 4096
    buf = raw[skip : skip + size]
    buf.fill(0)
    addr = buf.ctypes.data
    per = size // bufs
    agent.register_memory([(addr + b * per, per, 0, "") for b in range(bufs)], "DRAM")
    return agent, buf, addr


def target(args):
    agent, buf, addr = new_agent(args.name, args.size, args.bufs, args.target_delay_us > 0, args.target_delay_us)
    say({"name": agent.name, "md": base64.b64encode(agent.get_agent_metadata()).decode(), "addr": addr, "len": args.size})
    import select

    while True:
        agent.get_new_notifs()
        r, _, _ = select.select([sys.stdin], [], [], 0.001)
        if not r:
            continue
        line = sys.stdin.readline()
        if not line:
            return
        req = json.loads(line)
        if "sum" in req:
            say({"sums": [zlib.crc32(buf[o : o + n].tobytes()) for o, n in req["sum"]]})
        elif "zero" in req:
            buf.fill(0)
            say({"zeroed": True})
        else:
            say({"end": True})
            return


def initiator(args):
    agent, buf, addr = new_agent(args.name, args.size, args.bufs, not args.no_progress_thread)
    # Filled 4 MiB at a time: a whole-slab index array would take 8 bytes a byte.
    for start in range(0, args.size, 4 << 20):
        end = min(args.size, start + (4 << 20))
        i = np.arange(start, end, dtype=np.int64)
        buf[start:end] = ((3 + 131 * (i // 4096) + 7 * i) & 0xFF).astype(np.uint8)
    peer = json.loads(sys.stdin.readline())
    remote = agent.add_remote_agent(base64.b64decode(peer["md"]))
    slots, item = peer["slots"], peer["item"]
    per = args.size // args.bufs

    def slot_descs(base):
        b = np.repeat(np.arange(args.bufs, dtype=np.uint64), slots)
        s = np.tile(np.arange(slots, dtype=np.uint64), args.bufs)
        out = np.zeros((args.bufs * slots, 3), dtype=np.uint64)
        out[:, 0] = base + b * per + s * item
        out[:, 1] = item
        return out

    lh = agent.prep_xfer_dlist("", agent.get_xfer_descs(slot_descs(addr), "DRAM"))
    rh = agent.prep_xfer_dlist(remote, agent.get_xfer_descs(slot_descs(peer["addr"]), "DRAM"))
    say({"ready": True})
    rooms = []
    for line in sys.stdin:
        req = json.loads(line)
        if "rooms" in req:
            rooms = []
            for r in req["rooms"]:
                m = np.array(r["m"], dtype=np.uint64).reshape(-1, 3)
                src = np.zeros((len(m), 3), dtype=np.uint64)
                dst = np.zeros((len(m), 3), dtype=np.uint64)
                src[:, 0], src[:, 1] = addr + m[:, 0], m[:, 2]
                dst[:, 0], dst[:, 1] = peer["addr"] + m[:, 1], m[:, 2]
                # The arrays are built once (as Go builds its []nixl.Desc once); the
                # NIXL descriptor lists per request, inside the timed rounds, as Go's
                # Create builds them per request.
                rooms.append((src, dst, np.array(r["si"], dtype=np.int32), np.array(r["di"], dtype=np.int32)))
            say({"rooms": len(rooms)})
            continue
        if "iters" not in req:
            break
        merged = req["mode"] == "merged"
        cpu = time.process_time()
        start = time.perf_counter()
        for _ in range(req["iters"]):
            hs = []
            for src, dst, si, di in rooms:
                if merged:
                    h = agent.initialize_xfer("WRITE", agent.get_xfer_descs(src, "DRAM"),
                                              agent.get_xfer_descs(dst, "DRAM"), remote, b"r")
                else:
                    h = agent.make_prepped_xfer("WRITE", lh, si, rh, di, b"r")
                if agent.transfer(h) == "ERR":
                    raise RuntimeError("transfer failed")
                hs.append(h)
            for h in hs:
                while True:
                    s = agent.check_xfer_state(h)
                    if s == "DONE":
                        break
                    if s == "ERR":
                        raise RuntimeError("transfer failed")
                agent.release_xfer_handle(h)
        el = time.perf_counter() - start
        say({"seconds": el, "cpu": time.process_time() - cpu})
    agent.release_dlist_handle(lh)
    agent.release_dlist_handle(rh)
    say({"end": True})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["target", "initiator"])
    p.add_argument("--name", default="large-peer")
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--bufs", type=int, required=True)
    p.add_argument("--no-progress-thread", action="store_true", help="initiator: no NIXL progress thread")
    p.add_argument("--target-delay-us", type=int, default=1000,
                   help="target: its progress thread's wait for a UCX event, in µs (0: no progress thread, "
                        "the worker progressed only by the 1 ms notification drain)")
    args = p.parse_args()
    {"target": target, "initiator": initiator}[args.mode](args)


if __name__ == "__main__":
    main()
