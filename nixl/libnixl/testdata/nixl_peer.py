"""A NIXL peer written against NIXL's own Python API, driven by the Go tests.

Modes (one JSON object per line on stdout; requests on stdin):

  decode     SGLang's decode side: register a DRAM buffer, print
             {"name", "md", "addr", "len"}, read {"expect": {notif: [[off, len, seed], ...]}},
             (plus "room_at": [off, room]: the aux bootstrap_room check),
             then drain notifications like SGLang's decode (no own progress loop besides
             get_new_notifs) and, as each one arrives, check that the bytes it promises are
             already there. Prints {"notifs": [[peer, msg], ...], "bad": [...], "done": bool}.
  target     benchmark target: register a buffer, print its metadata, wait for "bench_end"
             (draining notifications every 1 ms; --no-progress-thread: no NIXL progress thread).
  initiator  benchmark initiator: read a target's {"md", "addr"} from stdin, then per
             {"iters": n} WRITE the reversed-index pattern the Go benchmark uses n times
             and print {"gbps", "seconds", "post", "wait", "cpu"}; any other line ends it.

Byte pattern of a checked range: (seed + 131*(i // 4096) + 7*i) & 0xff for i in range(len).
"""

import argparse
import base64
import json
import sys
import time

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


def pattern(n, seed):
    i = np.arange(n, dtype=np.int64)
    return ((seed + 131 * (i // 4096) + 7 * i) & 0xFF).astype(np.uint8)


def new_agent(name, size, prog_thread=True):
    agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=prog_thread, backends=["UCX"]))
    buf = np.zeros(size, dtype=np.uint8)
    addr = buf.ctypes.data
    agent.register_memory([(addr, size, 0, "")], "DRAM")
    return agent, buf, addr


def hello(agent, addr, size):
    md = agent.get_agent_metadata()
    say({"name": agent.name, "md": base64.b64encode(md).decode(), "addr": addr, "len": size})


def decode(args):
    agent, buf, addr = new_agent(args.name, args.size)
    hello(agent, addr, args.size)
    req = json.loads(sys.stdin.readline())
    expect = req["expect"]
    got, bad = [], []
    deadline = time.time() + args.timeout
    while len(got) < len(expect) and time.time() < deadline:
        for peer, msgs in agent.get_new_notifs().items():
            for m in msgs:
                msg = m.decode("ascii")
                got.append([peer, msg])
                for off, n, seed in expect.get(msg) or []:
                    if not np.array_equal(buf[off : off + n], pattern(n, seed)):
                        bad.append([msg, off, n])
                if msg.split("_")[1:2] == ["aux"] and "room_at" in req:
                    # decode's metadata gate: aux slot 0 of the last buffer is bootstrap_room
                    off, room = req["room_at"]
                    if int.from_bytes(buf[off : off + 8].tobytes(), "little") != room:
                        bad.append([msg, off, 8])
        time.sleep(0.0005)
    say({"notifs": got, "bad": bad, "done": is_done([m for _, m in got])})
    sys.stdin.readline()  # stay alive until the Go side is finished with us


def is_done(msgs):
    """SGLang decode's TransferStatus.is_done for one room (§5.3 of the protocol spec)."""
    received_aux, expected, received = False, {}, {}
    for msg in msgs:
        c = msg.split("_", 8)
        tag = c[1]
        if tag == "kv":
            chunk, last = int(c[2]), c[3] == "1"
            sender = int(c[4]) if len(c) > 4 else 0
            received.setdefault(sender, set()).add(chunk)
            if last:
                expected[sender] = chunk + 1
        elif tag == "aux":
            received_aux = True
            if len(c) > 2 and c[2] == "nokv":
                expected[int(c[3]) if len(c) > 3 else 0] = 0
    if not received_aux or len(expected) < 1:
        return False
    return all(len(received.get(s, ())) == n for s, n in expected.items())


def target(args):
    agent, buf, addr = new_agent(args.name, args.size, not args.no_progress_thread)
    hello(agent, addr, args.size)
    deadline = time.time() + args.timeout
    while time.time() < deadline:
        notifs = agent.get_new_notifs()
        if any(b"bench_end" in msgs for msgs in notifs.values()):
            break
        time.sleep(0.001)
    say({"end": True})


def initiator(args):
    agent, buf, addr = new_agent(args.name, args.size)
    buf[:] = pattern(args.size, 3)
    peer = json.loads(sys.stdin.readline())
    remote = agent.add_remote_agent(base64.b64decode(peer["md"]))
    n = args.size // args.desc
    local_descs = [(addr + i * args.desc, args.desc, 0) for i in range(n)]
    remote_descs = [(peer["addr"] + i * args.desc, args.desc, 0) for i in range(n)]
    lh = agent.prep_xfer_dlist("", agent.get_xfer_descs(local_descs, "DRAM"))
    rh = agent.prep_xfer_dlist(remote, agent.get_xfer_descs(remote_descs, "DRAM"))
    # Reversed remote indices keep NIXL from merging neighbours into one descriptor.
    h = agent.make_prepped_xfer("WRITE", lh, list(range(n)), rh, list(reversed(range(n))), b"bench")

    post_s = wait_s = 0.0

    def once():
        nonlocal post_s, wait_s
        t0 = time.perf_counter()
        if agent.transfer(h) == "ERR":
            raise RuntimeError("transfer failed")
        t1 = time.perf_counter()
        while True:
            s = agent.check_xfer_state(h)
            if s == "DONE":
                break
            if s == "ERR":
                raise RuntimeError("transfer failed")
        post_s += t1 - t0
        wait_s += time.perf_counter() - t1

    once()  # wire-up
    # Rounds on request, so the Go side can interleave them with its own and
    # both see the same machine load: {"iters": n} -> {"gbps", "seconds",
    # "post", "wait", "cpu"} (seconds in transfer(), in the check_xfer_state
    # loop, and of CPU used by the whole process over the round).
    for line in sys.stdin:
        req = json.loads(line)
        if "iters" not in req:
            break
        post_s = wait_s = 0.0
        cpu = time.process_time()  # every thread of this process, NIXL's included
        start = time.perf_counter()
        for _ in range(req["iters"]):
            once()
        el = time.perf_counter() - start
        cpu = time.process_time() - cpu
        say({"gbps": req["iters"] * args.size / el / 1e9, "seconds": el, "post": post_s, "wait": wait_s, "cpu": cpu})
    agent.send_notif(remote, b"bench_end")
    say({"end": True})
    time.sleep(0.2)  # let the notification leave before the agent goes away


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["decode", "target", "initiator"])
    p.add_argument("--name", default="py-peer")
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--desc", type=int, default=1 << 16)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--no-progress-thread", action="store_true",
                   help="target: NIXL progress thread off (it spins otherwise: pthrDelay 0)")
    args = p.parse_args()
    {"decode": decode, "target": target, "initiator": initiator}[args.mode](args)


if __name__ == "__main__":
    main()
