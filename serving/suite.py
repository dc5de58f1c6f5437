"""The real-serving suite (`make test-serving`): real SGLang servers carry real
requests through kvxfer's prefill, judged against SGLang's own.

    python serving/suite.py --versions 0.5.23,0.5.18 [--prompts 50 --storm 500] [--smoke]

Per release, with the kvxfer wheel (`make wheel`) pip-installed into the
release's serving venv exactly as the README tells users:
  0. the installed kvxferd names no library outside the manylinux set
     (scripts/check-wheel-libs.sh); kvxfer's shared-pool hooks against the
     installed SGLang (python/tests/test_sharedmem.py);
  1. token identity: monolithic, PD with SGLang's own NIXL prefill
     (KVXFER_DISABLE=1) and PD with kvxfer's prefill; greedy output ids of every
     prompt identical across the three;
  2. a client-abort storm through the router against both PD deployments,
     then: queues empty and every KV slot free on both servers (after a cache
     flush), kvxferd's /debug/rooms empty, both healthy, and further prompts
     identical. SGLang's own prefill's leftovers are findings, reported, not
     failures; kvxfer's fail the suite;
  3. kvxferd SIGKILL under load: in-flight requests end (error or output)
     within KILL_BOUND_S (those whose rooms the restarted kvxferd was named
     and told their decode of: within TOLD_S on 0.5.20+), the child
     restarts, later outputs identical;
  4. the decode server SIGKILLed under load and restarted: prefill requests
     for it end within DECODE_BOUND_S, later outputs identical.
Writes <run-dir>/suite.json and prints the tables. Exit status 1 on a failure.
"""

import argparse
import asyncio
import concurrent.futures
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import cluster  # noqa: E402
import identity  # noqa: E402
import prompts as prompt_set  # noqa: E402
import storm  # noqa: E402

QUIET_DEADLINE_S = 150.0  # > SGLang's 30 s deferred-release hold on the decode
# The decode's own wait for KV (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s by
# default). A restarted kvxferd is told the rooms its predecessor held and fails
# them towards their decodes (KV_STATUS "0"), which 0.5.20+ read: those requests
# end within TOLD_S. A request whose transfer info was on its way to the killed
# process before the prefill had created its sender is known to nobody: it ends
# when its decode gives up, as does every one on a 0.5.18 decode (it reads no
# status). Hence the bound: DECODE_WAIT_S + 15 s.
DECODE_WAIT_S = 45
TOLD_S = 15.0
KILL_BOUND_S = DECODE_WAIT_S + 15.0
LOST_LINE = re.compile(r"(\d+) rooms of the lost kvxferd failed \(transfer_process_lost\); (\d+) decode endpoints told")


def reads_status(version):
    return tuple(int(x) for x in version.split(".")[:3]) >= (0, 5, 20)


def lost_named(dep, offset):
    """What the plug-in named to the restarted kvxferd (its log after offset)."""
    with open(dep.prefill.proc.log_path, errors="replace") as f:
        f.seek(offset)
        hits = [tuple(int(x) for x in m.groups()) for m in LOST_LINE.finditer(f.read())]
    return {"lost_rooms_named": sum(h[0] for h in hits), "decode_endpoints_told": max((h[1] for h in hits), default=0)}
DECODE_BOUND_S = 90.0


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def installed_kvxferd(version):
    hits = glob.glob(os.path.join(cluster.venv_dir(version), "lib", "python*", "site-packages", "kvxfer", "bin", "kvxferd"))
    if not hits:
        raise cluster.ServingError(f"kvxfer is not installed in {cluster.venv_dir(version)}")
    return hits[0]


def preflight(version, wheel):
    """Install the wheel, check its kvxferd's libraries and the hooks."""
    out = {}
    cluster.pip_install_wheel(version, wheel)
    out["wheel"] = os.path.basename(wheel)
    kvxferd = installed_kvxferd(version)
    r = subprocess.run([os.path.join(ROOT, "scripts", "check-wheel-libs.sh"), kvxferd],
                       capture_output=True, text=True, timeout=60)
    out["libs_ok"] = r.returncode == 0
    out["libs"] = r.stdout.strip().splitlines()[-12:]
    if r.returncode != 0:
        out["libs_error"] = r.stdout[-2000:] + r.stderr[-2000:]
    env = cluster.server_env({})
    r = subprocess.run([cluster.venv_python(version), "-m", "unittest", "tests.test_sharedmem"],
                       cwd=os.path.join(ROOT, "python"), capture_output=True, text=True, timeout=300, env=env)
    out["hooks_ok"] = r.returncode == 0
    out["hooks_tail"] = r.stderr.strip().splitlines()[-3:]
    return out


def compare(ref, got):
    same = sum(1 for k in ref if "ids" in ref[k] and "ids" in got.get(k, {}) and ref[k]["ids"] == got[k]["ids"])
    errors = sum(1 for k in ref if "error" in got.get(k, {"error": "missing"}))
    return {"prompts": len(ref), "identical": same, "differ": len(ref) - same - errors, "errors": errors}


def kvxferd_debug(port):
    status, body = cluster.http("GET", f"http://127.0.0.1:{port}/debug/rooms?limit=100", timeout=10)
    if status != 200:
        return None
    return json.loads(body)


def quiesce(dep, debug_port, deadline_s=QUIET_DEADLINE_S):
    """Wait (bounded) until both servers hold no request and no KV slot and
    kvxferd (when there) holds no room; returns what was left at the end."""
    t0 = time.monotonic()
    last = {}
    flushed = False
    calm = 0
    while True:
        p = cluster.server_info(dep.prefill_url, metrics=False)
        d = cluster.server_info(dep.decode_url, metrics=False)
        rooms = None
        if debug_port:
            dbg = kvxferd_debug(debug_port)
            rooms = None if dbg is None else len(dbg.get("rooms") or [])
        queues = {
            "prefill_bootstrap": p.get("prefill_bootstrap_queue") or 0,
            "prefill_inflight": p.get("prefill_inflight_queue") or 0,
            "prefill_running": p.get("running_reqs") or 0, "prefill_waiting": p.get("waiting_reqs") or 0,
            "decode_prealloc": d.get("decode_prealloc_queue") or 0,
            "decode_transfer": d.get("decode_transfer_queue") or 0,
            "decode_running": d.get("running_reqs") or 0, "decode_waiting": d.get("waiting_reqs") or 0,
        }
        busy = sum(queues.values())
        if busy == 0 and not flushed:
            # Cached prefixes hold slots by design: flush, then count.
            cluster.flush_cache(dep.prefill_url)
            cluster.flush_cache(dep.decode_url)
            flushed = True
            continue
        last = {"queues": queues, "prefill_kv_used": p.get("kv_used_tokens"), "decode_kv_used": d.get("kv_used_tokens"),
                "kvxferd_rooms": rooms, "seconds": round(time.monotonic() - t0, 1)}
        if busy == 0 and flushed and not p.get("kv_used_tokens") and not d.get("kv_used_tokens") and not rooms:
            calm += 1
            if calm >= 2:  # twice, 2 s apart: nothing still on its way in
                last["quiet"] = True
                return last
        else:
            calm = 0
        if time.monotonic() - t0 > deadline_s:
            last["quiet"] = False
            return last
        if busy:
            flushed = False
        time.sleep(2)


def load_in_background(url, ps, max_new, concurrency, stop, results):
    """Requests in a loop until stop is set: each records (start, end, outcome)."""
    def one(p):
        t = time.monotonic()
        try:
            ids = cluster.generate(url, input_ids=p["ids"], max_new_tokens=max_new, timeout=120)
            results.append((t, time.monotonic(), "ok", p["name"], ids))
        except Exception as e:  # noqa: BLE001 - recorded
            results.append((t, time.monotonic(), "error", p["name"], str(e)[:200]))
            stop.wait(0.25)  # a refused connection answers at once: do not spin

    def loop(k):
        i = k
        while not stop.is_set():
            one(ps[i % len(ps)])
            i += concurrency

    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(concurrency)]
    for t in threads:
        t.start()
    return threads


def kvxferd_pids(prefill_proc):
    import psutil  # in every SGLang venv; the suite runs in one

    try:
        root = psutil.Process(prefill_proc.pid)
        return [c.pid for c in root.children(recursive=True) if c.name() == "kvxferd"]
    except psutil.NoSuchProcess:
        return []


def fault_under_load(dep, ps, ref, max_new, inject, bound_s, after_s=4.0):
    """Run load, inject a fault, keep the load `after_s` more, then stop it;
    report the requests in flight at the fault and when they ended."""
    stop, results = threading.Event(), []
    threads = load_in_background(dep.url, ps, max_new, 6, stop, results)
    time.sleep(6)
    t_fault = time.monotonic()
    what = inject(stop)
    time.sleep(after_s)
    stop.set()
    for t in threads:
        t.join(timeout=bound_s + 150)
    inflight = [r for r in results if r[0] < t_fault < r[1]]
    ends = [r[1] - t_fault for r in inflight]
    return {"fault": what, "in_flight": len(inflight),
            "in_flight_ok": sum(1 for r in inflight if r[2] == "ok"),
            "in_flight_errors": sum(1 for r in inflight if r[2] == "error"),
            # Greedy: a shorter generation is a prefix of the reference.
            "in_flight_wrong": sum(1 for r in inflight if r[2] == "ok" and r[4] != (ref.get(r[3], {}).get("ids") or [])[:len(r[4])]),
            "max_new_tokens": max_new,
            "max_end_after_fault_s": round(max(ends), 2) if ends else 0.0,
            "within_bound": all(e <= bound_s for e in ends), "bound_s": bound_s,
            "ended_within_told_s": sum(1 for e in ends if e <= TOLD_S),
            "requests": len(results), "hung_threads": sum(1 for t in threads if t.is_alive())}


def kill_kvxferd(dep, stop=None):
    pids = kvxferd_pids(dep.prefill.proc)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return {"kvxferd_killed": pids}


def prefill_busy(dep):
    p = cluster.server_info(dep.prefill_url, metrics=False)
    return sum((p.get(k) or 0) for k in ("prefill_bootstrap_queue", "prefill_inflight_queue", "running_reqs", "waiting_reqs"))


def restart_decode(dep, deadline_s, stop, load_s=3.0):
    """SIGKILL the decode server's group; keep the load on it load_s more, then
    stop the clients (each new request would enter the prefill again) and wait
    (bounded) until the prefill holds no request (its requests for the dead
    decode ended); start the decode again on the same port."""
    t0 = time.monotonic()
    dep.decode.proc._killpg(signal.SIGKILL)
    dep.decode.proc.stop(grace=1)
    time.sleep(load_s)
    stop.set()
    drained = _wait(lambda: prefill_busy(dep) == 0 or None, DECODE_BOUND_S)
    drain_s = time.monotonic() - t0
    t1 = time.monotonic()
    dep.decode.proc.start()
    dep.decode.wait_ready(deadline_s, others=[dep.prefill.proc])
    return {"prefill_drained": bool(drained), "prefill_drained_s": round(drain_s, 1),
            "decode_up_s": round(time.monotonic() - t1, 1)}


def run_pd(version, variant, model, ps, ref, args, run_dir, out):
    debug_port = cluster.free_port() if variant == "kvxfer" else None
    penv, denv = identity.VARIANTS[variant]
    penv, denv = dict(penv), dict(denv, SGLANG_DISAGGREGATION_WAITING_TIMEOUT=str(DECODE_WAIT_S))
    if debug_port:
        penv["KVXFER_ARGS"] = f"-debug-addr 127.0.0.1:{debug_port}"
    dep = cluster.pd(version, run_dir=os.path.join(run_dir, f"pd-{variant}"), model=model, name=f"pd-{variant}",
                     prefill={"extra_env": penv}, decode={"extra_env": denv})
    rec = out.setdefault(variant, {})
    t0 = time.monotonic()
    with dep:
        rec["start"] = dep.timings
        log(f"{version} pd-{variant}: up in {time.monotonic() - t0:.0f} s")
        if variant == "kvxfer":
            logtxt = open(dep.prefill.proc.log_path, errors="replace").read()
            rec["kvxfer_took_prefill"] = "kvxferd started live" in logtxt and "allocated in shared memory" in logtxt
        got = identity.collect(dep.url, ps, args.max_new_tokens, args.concurrency, args.request_timeout)
        rec["identity"] = compare(ref, got)
        log(f"{version} pd-{variant}: identity {rec['identity']}")
        aborts0 = server_aborts(dep)
        summary, _ = asyncio.run(storm.run_storm(dep.url, [p["ids"] for p in ps], n=args.storm,
                                                 concurrency=args.storm_concurrency, cancel_frac=args.cancel_frac,
                                                 max_new=args.max_new_tokens, seed=args.seed, progress=log))
        rec["storm"] = summary
        # What reached the servers as aborts (their "Abort request" log lines).
        summary["server_aborts"] = {k: v - aborts0[k] for k, v in server_aborts(dep).items()}
        log(f"{version} pd-{variant}: storm {summary}")
        rec["after_storm"] = quiesce(dep, debug_port)
        log(f"{version} pd-{variant}: after the storm {rec['after_storm']}")
        after = identity.collect(dep.url, ps[:args.after], args.max_new_tokens, args.concurrency, args.request_timeout)
        rec["identity_after_storm"] = compare({k: ref[k] for k in list(ref)[:args.after]}, after)
        rec["healthy_after_storm"] = dep.alive()
        if variant == "kvxfer":
            # Short generations: most requests in flight are in prefill or transfer.
            offset = os.path.getsize(dep.prefill.proc.log_path)
            rec["kvxferd_kill"] = fault_under_load(dep, ps, ref, 2, lambda stop: kill_kvxferd(dep), KILL_BOUND_S)
            rec["kvxferd_kill"]["restarted"] = bool(_wait(lambda: kvxferd_pids(dep.prefill.proc), 30))
            rec["kvxferd_kill"].update(lost_named(dep, offset), reads_status=reads_status(version))
            rec["identity_after_kill"] = recheck(dep, ps, ref, args)
            log(f"{version} pd-{variant}: kvxferd kill {rec['kvxferd_kill']} then {rec['identity_after_kill']}")
        if variant == "kvxfer" and not args.smoke:
            rec["decode_restart"] = fault_under_load(dep, ps, ref, 4,
                                                     lambda stop: restart_decode(dep, cluster.START_DEADLINE_S, stop), DECODE_BOUND_S)
            rec["identity_after_decode_restart"] = recheck(dep, ps, ref, args)
            rec["after_faults"] = quiesce(dep, debug_port)
            log(f"{version} pd-{variant}: decode restart {rec['decode_restart']} then {rec['identity_after_decode_restart']}")
    return rec


def server_aborts(dep):
    out = {}
    for role, srv in (("prefill", dep.prefill), ("decode", dep.decode)):
        try:
            with open(srv.proc.log_path, errors="replace") as f:
                out[role] = sum(1 for line in f if "Abort request" in line)
        except OSError:
            out[role] = 0
    return out


def recheck(dep, ps, ref, args):
    """The identity prompts again, from cold caches as the reference was made:
    radix-cache hits change the prefill's chunks, and so bf16 rounding."""
    cluster.flush_cache(dep.prefill_url)
    cluster.flush_cache(dep.decode_url)
    after = identity.collect(dep.url, ps[:args.after], args.max_new_tokens, args.concurrency, args.request_timeout)
    return compare({k: ref[k] for k in list(ref)[:args.after]}, after)


def _wait(fn, deadline_s):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.5)
    return None


def verdict(version_rec):
    """Failures of one release (SGLang's own prefill's leftovers are findings)."""
    bad = []
    pre = version_rec.get("preflight", {})
    for k in ("libs_ok", "hooks_ok"):
        if not pre.get(k):
            bad.append(f"preflight {k}")
    for v in ("sglang", "kvxfer"):
        rec = version_rec.get(v, {})
        idt = rec.get("identity", {})
        if not idt or idt.get("identical") != idt.get("prompts"):
            bad.append(f"{v}: identity {idt}")
    k = version_rec.get("kvxfer", {})
    if not k.get("kvxfer_took_prefill"):
        bad.append("kvxfer did not take the prefill")
    if not (k.get("after_storm") or {}).get("quiet"):
        bad.append(f"kvxfer: not quiet after the storm: {k.get('after_storm')}")
    for key in ("identity_after_storm", "identity_after_kill", "identity_after_decode_restart"):
        if key in k and k[key]["identical"] != k[key]["prompts"]:
            bad.append(f"kvxfer: {key} {k[key]}")
    for key in ("kvxferd_kill", "decode_restart"):
        f = k.get(key)
        if f and (not f["within_bound"] or f["hung_threads"] or f["in_flight_wrong"]):
            bad.append(f"kvxfer: {key} {f}")
    dr = (k.get("decode_restart") or {}).get("fault") or {}
    if dr and not dr.get("prefill_drained"):
        bad.append(f"kvxfer: the prefill still held requests {DECODE_BOUND_S:.0f} s after the decode died: {dr}")
    if "kvxferd_kill" in k and not k["kvxferd_kill"].get("restarted"):
        bad.append("kvxfer: kvxferd not restarted")
    kk = k.get("kvxferd_kill") or {}
    if kk.get("lost_rooms_named") and kk.get("reads_status") and not kk.get("decode_endpoints_told"):
        bad.append(f"kvxfer: the restarted kvxferd told no decode of {kk['lost_rooms_named']} lost rooms")
    if "tracing" in version_rec and not version_rec["tracing"].get("ok"):
        bad.append(f"tracing: {version_rec['tracing'].get('errors')}")
    if "after_faults" in k and not k["after_faults"].get("quiet"):
        bad.append(f"kvxfer: not quiet after the faults: {k['after_faults']}")
    return bad


def tables(res):
    lines = ["", "Token identity (greedy output ids, prompt by prompt)", "",
             "| release | deployment | prompts | identical | differ | errors |", "|---|---|---|---|---|---|"]
    for v, r in res["releases"].items():
        n = r.get("prompts", 0)
        lines.append(f"| {v} | monolithic | {n} | (reference) | | {r.get('mono_errors', 0)} |")
        for name, key in (("PD, SGLang's NIXL prefill", "sglang"), ("PD, kvxfer prefill", "kvxfer")):
            i = r.get(key, {}).get("identity", {})
            lines.append(f"| {v} | {name} | {i.get('prompts', '-')} | {i.get('identical', '-')} | {i.get('differ', '-')} | {i.get('errors', '-')} |")
    lines += ["", "Client-abort storm through the router, then a bounded wait for quiet",
              "", "| release | prefill | requests | cancelled (send/prefill/first/decode) | aborts seen by prefill/decode | completed | errors | left in queues | KV slots leaked (prefill/decode) | kvxferd rooms | quiet after | identical after |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for v, r in res["releases"].items():
        for name, key in (("SGLang NIXL", "sglang"), ("kvxfer", "kvxfer")):
            rec = r.get(key, {})
            s, q, ia = rec.get("storm", {}), rec.get("after_storm", {}), rec.get("identity_after_storm", {})
            if not s:
                continue
            ph = s.get("by_phase", {})
            left = sum((q.get("queues") or {}).values())
            lines.append(f"| {v} | {name} | {s['requests']} | {s['cancelled']} ({ph.get('send', 0)}/{ph.get('prefill', 0)}/{ph.get('first', 0)}/{ph.get('decode', 0)}) | {(s.get('server_aborts') or {}).get('prefill', '-')}/{(s.get('server_aborts') or {}).get('decode', '-')} | {s['ok']} | {s['errors']} | {left} | {q.get('prefill_kv_used')}/{q.get('decode_kv_used')} | {q.get('kvxferd_rooms', '-') if q.get('kvxferd_rooms') is not None else '-'} | {'yes' if q.get('quiet') else 'NO'} in {q.get('seconds')} s | {ia.get('identical', '-')}/{ia.get('prompts', '-')} |")
    lines += ["", "Faults under load (6 clients in a loop)", "",
              "| release | fault | in flight | ended ok / error | wrong output | ended within 15 s | last ended after | bound | restarted / back | identical after |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for v, r in res["releases"].items():
        k = r.get("kvxfer", {})
        for key, name, after in (("kvxferd_kill", "kvxferd SIGKILL", "identity_after_kill"),
                                 ("decode_restart", "decode SIGKILL + restart", "identity_after_decode_restart")):
            f = k.get(key)
            if not f:
                continue
            fl = f.get("fault", {})
            if key == "kvxferd_kill":
                back = "kvxferd yes" if f.get("restarted") else "kvxferd NO"
                if "lost_rooms_named" in f:
                    back += f"; {f['lost_rooms_named']} lost rooms named, {f['decode_endpoints_told']} decode told"
            else:
                back = f"prefill empty {fl.get('prefill_drained_s')} s after the kill; decode up in {fl.get('decode_up_s')} s"
            ia = k.get(after, {})
            lines.append(f"| {v} | {name} | {f['in_flight']} | {f['in_flight_ok']} / {f['in_flight_errors']} | {f['in_flight_wrong']} | {f.get('ended_within_told_s', '-')} | {f['max_end_after_fault_s']} s | {f['bound_s']} s | {back} | {ia.get('identical', '-')}/{ia.get('prompts', '-')} |")
    for v, r in res["releases"].items():
        q = r.get("kvxfer", {}).get("after_faults")
        if q:
            lines.append(f"\n{v}, kvxfer, after both faults: {'quiet' if q.get('quiet') else 'NOT quiet'} in {q.get('seconds')} s "
                         f"(KV used {q.get('prefill_kv_used')}/{q.get('decode_kv_used')}, kvxferd rooms {q.get('kvxferd_rooms')})")
    lines.append("")
    for v, r in res["releases"].items():
        bad = r.get("failures")
        lines.append(f"{v}: " + ("PASS" if bad == [] else "not judged" if bad is None else "FAILED: " + "; ".join(bad)[:600]))
    return "\n".join(lines)


def run_header(res):
    """The command, date, duration and load of one run."""
    command = "python serving/suite.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in res["args"].items()
        if v not in (None, False) and k not in ("render", "doc", "run_dir", "wheel"))
    when = res.get("started") or time.strftime("%Y-%m-%d")
    if "seconds" not in res:  # stopped after its last complete release
        done = ", ".join(res["releases"])
        secs = sum(r.get("seconds", 0) for r in res["releases"].values())
        return (f"`{command}` — {when}, stopped after {done} ({secs:.0f} s), "
                f"load average {res['load_start'][0]:.1f} at start (2 cores).")
    load = f"load average {res['load_start'][0]:.1f} at start, {res['load_end'][0]:.1f} at end (2 cores)"
    return f"`{command}` — {when}, {res['seconds']:.0f} s, {load}."


def render_doc(runs, path):
    """Replace the results section of docs/serving.md with these runs' tables
    (one block per run: a release rerun after a fix gets its own)."""
    begin, end = "<!-- serving-results:begin -->", "<!-- serving-results:end -->"
    text = open(path).read()
    blocks = [f"{run_header(res)}\n{tables(res)}" for res in runs]
    body = f"{begin}\n" + "\n\n".join(blocks) + f"\n{end}"
    if begin in text and end in text:
        text = text[:text.index(begin)] + body + text[text.index(end) + len(end):]
    else:
        text += "\n" + body + "\n"
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", default="0.5.23,0.5.18")
    ap.add_argument("--wheel", default=None, help="default: the newest dist/kvxfer-*.whl")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--after", type=int, default=50, help="prompts checked after the storm and each fault")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    # One at a time: a batch of other prompts changes bf16 numerics (SGLang's
    # own PD differed from monolithic on 2 of 50 prompts at 4).
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--storm", type=int, default=500)
    ap.add_argument("--storm-concurrency", type=int, default=16)
    ap.add_argument("--cancel-frac", type=float, default=0.4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--smoke", action="store_true", help="CI subset: no decode restart, no tracing check")
    ap.add_argument("--no-tracing", action="store_true", help="skip the tracing check (serving/tracing.py runs it alone)")
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--render", default=None, metavar="SUITE_JSON[,SUITE_JSON]",
                    help="print (and with --doc write) finished runs' tables, one block per run; runs nothing")
    ap.add_argument("--doc", default=None, help="replace the results section of this file (docs/serving.md)")
    args = ap.parse_args()
    if args.render:
        runs = [json.load(open(p)) for p in args.render.split(",")]
        for res in runs:
            print(run_header(res) + "\n" + tables(res))
        if args.doc:
            render_doc(runs, args.doc)
        return
    wheel = args.wheel or max(glob.glob(os.path.join(ROOT, "dist", "kvxfer-*.whl")), key=os.path.getmtime, default=None)
    if not wheel:
        sys.exit("no dist/kvxfer-*.whl: run `make wheel` first")
    run_dir = args.run_dir or cluster.new_run_dir("suite")
    os.makedirs(run_dir, exist_ok=True)
    ps = prompt_set.prompts()[:args.prompts]
    args.after = min(args.after, len(ps))
    res = {"args": vars(args), "wheel": wheel, "releases": {}, "load_start": os.getloadavg(),
           "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    failures = []
    t_all = time.monotonic()
    for version in args.versions.split(","):
        rec = res["releases"].setdefault(version, {"prompts": len(ps)})
        t0 = time.monotonic()
        try:
            rec["preflight"] = preflight(version, wheel)
            log(f"{version}: preflight {rec['preflight']}")
            model = cluster.ensure_model(version)
            mono = cluster.monolithic(version, run_dir=os.path.join(run_dir, version, "monolithic"), model=model)
            with mono:
                ref = identity.collect(mono.url, ps, args.max_new_tokens, args.concurrency, args.request_timeout)
            rec["mono_errors"] = sum(1 for v in ref.values() if "error" in v)
            log(f"{version}: monolithic reference, {rec['mono_errors']} errors")
            for variant in ("sglang", "kvxfer"):
                run_pd(version, variant, model, ps, ref, args, os.path.join(run_dir, version), rec)
            if not args.smoke and not args.no_tracing:
                import tracing  # serving/tracing.py: one trace per request, SGLang's span over kvxfer's room

                tr = tracing.check(version, run_dir=os.path.join(run_dir, version, "tracing"))
                rec["tracing"] = {k: tr.get(k) for k in ("ok", "errors", "completed_ok", "rows") if k in tr}
                log(f"{version}: tracing ok={tr.get('ok')} errors={tr.get('errors')}")
        except Exception as e:  # noqa: BLE001 - one release failing is reported, the next still runs
            rec["error"] = f"{type(e).__name__}: {e}"[:4000]
            log(f"{version}: {rec['error']}")
        rec["seconds"] = round(time.monotonic() - t0, 1)
        bad = verdict(rec) + ([rec["error"]] if "error" in rec else [])
        rec["failures"] = bad
        failures += [f"{version}: {b}" for b in bad]
        with open(os.path.join(run_dir, "suite.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
    res["seconds"] = round(time.monotonic() - t_all, 1)
    res["load_end"] = os.getloadavg()
    with open(os.path.join(run_dir, "suite.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(tables(res))
    print(f"\nload average {res['load_start'][0]:.1f} at start, {res['load_end'][0]:.1f} at end; {res['seconds']:.0f} s; {run_dir}/suite.json")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("\nPASS")


if __name__ == "__main__":
    main()
