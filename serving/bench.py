"""Serving benchmark: SGLang's own NIXL prefill vs kvxfer's prefill, measured
with SGLang's own client (`python -m sglang.bench_serving`).

    /opt/kvxfer-serving/0.5.23/bin/python serving/bench.py [--version 0.5.23 --reps 3
        --num-prompts 64 --request-rate 4 --max-concurrency 8 --input-len 256
        --output-len 16 --seed 1] [--doc docs/benchmarks.md]

For rep in 1..reps, for each variant in an order that alternates from rep to
rep (sglang, kvxfer; then kvxfer, sglang; ...): start the PD deployment
(serving/cluster.py: prefill + decode over NIXL + SGLang's mini-LB router;
variants as in serving/identity.py), send a few warm-up requests of the same
shape, measure an idle CPU baseline (--idle-s), then run bench_serving
against the router with a deadline, and stop the deployment.

bench_serving runs with `--backend sglang` (the router's streaming
/generate), `--dataset-name random --dataset-path <file>` where <file> is a
ShareGPT-format JSON of random words of the tiny model's vocabulary written
into the run dir (a valid local file: bench_serving downloads ShareGPT only
when the path is not one), `--tokenize-prompt` (token ids sent, so every
prompt is exactly --input-len tokens), `--random-range-ratio 1` (fixed input
and output lengths), `--warmup-requests 0` (our own warm-up uses prompts
outside the measured set, so nothing of it sits in the radix cache).
`--dataset random-ids` uses SGLang's integer prompts instead; they are
rotations of 0..vocab-1, so with vocab 256 about one prompt in eight repeats
another whole (a radix-cache hit).

CPU per request: user+system seconds of every process in the prefill
launcher's tree whose name starts with "sglang::scheduler" (SGLang's
setproctitle; psutil's name() gives the full title) and of every "kvxferd",
sampled when bench_serving prints "Warmup completed ... Starting main
benchmark run" and when it prints its "Serving Benchmark Result" block (the
window is its timed run plus its 1 s pre-run sleep), divided by the completed
requests. Idle schedulers busy-poll, so an idle window of --idle-s seconds
before each run gives CPU/s idle, and "net" = (delta - idle rate x window) /
completed. Load averages (os.getloadavg) at the start and end of each run.

Prints a Markdown table (variant x rep, a median row per variant, the ratio
kvxfer/sglang of the medians); writes bench.md and bench.json into the run
dir (cluster.new_run_dir("bench")); with --doc PATH replaces the section
between `<!-- bench-serving:begin -->` and `<!-- bench-serving:end -->` of
that file (appended at its end when absent). `--render bench.json` re-renders
a finished run (and --doc) without running anything.

Exit status 0 when every run completed every request, 1 when requests failed
or a run broke, 2 when a deployment did not come up.
"""

import argparse
import concurrent.futures
import json
import os
import random
import shlex
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster  # noqa: E402
import identity  # noqa: E402

BEGIN = "<!-- bench-serving:begin -->"
END = "<!-- bench-serving:end -->"
START_MARK = "Starting main benchmark run"  # printed right before the timed run (after its 1 s sleep)
END_MARK = "Serving Benchmark Result"  # printed right after its metrics
BENCH_MODULE = "sglang.bench_serving"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---------------------------------------------------------------- CPU sampling


def _role(name):
    if name.startswith("sglang::scheduler"):
        return "scheduler"
    if name == "kvxferd" or name.startswith("kvxferd"):
        return "kvxferd"
    if name.startswith("sglang::detokenizer"):
        return "detokenizer"
    return "other"


def cpu_snapshot(root_pid):
    """{pid: {"name", "role", "create_time", "cpu"}} over root_pid and its
    descendants; cpu = user + system seconds of the process itself."""
    import psutil  # in the serving venv (SGLang depends on it)

    out = {}
    try:
        root = psutil.Process(root_pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return out
    for p in procs:
        try:
            with p.oneshot():
                name = p.name()
                t = p.cpu_times()
                ct = p.create_time()
        except psutil.Error:
            continue
        role = "launcher" if p.pid == root_pid else _role(name)
        out[p.pid] = {"name": name, "role": role, "create_time": ct, "cpu": t.user + t.system}
    return out


def cpu_delta(a, b):
    """Per role: CPU seconds spent between snapshots a and b, the pids seen,
    and the pids that ended in between (their last seconds are lost)."""
    roles = {}
    for pid, e in b.items():
        r = roles.setdefault(e["role"], {"cpu_s": 0.0, "pids": [], "started": [], "ended": []})
        prev = a.get(pid)
        if prev is not None and abs(prev["create_time"] - e["create_time"]) < 1e-3:
            r["cpu_s"] += max(0.0, e["cpu"] - prev["cpu"])
        else:
            r["cpu_s"] += e["cpu"]  # started inside the window
            r["started"].append(pid)
        r["pids"].append(pid)
    for pid, e in a.items():
        if pid not in b or abs(b[pid]["create_time"] - e["create_time"]) >= 1e-3:
            r = roles.setdefault(e["role"], {"cpu_s": 0.0, "pids": [], "started": [], "ended": []})
            r["ended"].append(pid)
    for r in roles.values():
        r["cpu_s"] = round(r["cpu_s"], 3)
    return roles


def _cpu(roles, role):
    return (roles.get(role) or {}).get("cpu_s", 0.0)


# ---------------------------------------------------------------- dataset


def vocab_words(model_dir):
    """The tokenizer's non-special tokens (WordLevel: one word, one token)."""
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = (tok.get("model") or {}).get("vocab") or {}
    special = {t.get("content") for t in tok.get("added_tokens") or []}
    words = sorted((w for w in vocab if w not in special and not w.startswith("<")), key=lambda w: vocab[w])
    if len(words) < 16:
        raise cluster.ServingError(f"{model_dir}/tokenizer.json: only {len(words)} plain words")
    return words


def write_dataset(path, model_dir, n, input_len, seed):
    """A ShareGPT-format JSON (what bench_serving's `random` dataset samples
    from) of n conversations whose first turn is input_len + 16 random words:
    bench_serving truncates each to exactly input_len tokens."""
    words = vocab_words(model_dir)
    rng = random.Random(seed * 7919 + 17)
    convs = []
    for i in range(n):
        human = " ".join(rng.choice(words) for _ in range(input_len + 16))
        gpt = " ".join(rng.choice(words) for _ in range(8))
        convs.append({"id": f"bench-{i}", "conversations": [{"from": "human", "value": human},
                                                            {"from": "gpt", "value": gpt}]})
    with open(path, "w") as f:
        json.dump(convs, f)
    return path


def warmup_prompts(model_dir, n, input_len, seed):
    """Token-id prompts outside the measured set (another RNG stream)."""
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    ids = sorted(v for w, v in vocab.items() if not w.startswith("<"))
    rng = random.Random(seed * 104729 + 99991)
    return [[rng.choice(ids) for _ in range(input_len)] for _ in range(n)]


def warmup(url, prompts, output_len, concurrency, timeout):
    def one(p):
        t = time.monotonic()
        try:
            cluster.generate(url, input_ids=p, max_new_tokens=output_len, timeout=timeout)
            return {"ok": True, "s": round(time.monotonic() - t, 2)}
        except Exception as e:  # noqa: BLE001 - recorded
            return {"ok": False, "s": round(time.monotonic() - t, 2), "error": f"{type(e).__name__}: {e}"[:500]}

    with concurrent.futures.ThreadPoolExecutor(max(1, concurrency)) as ex:
        return list(ex.map(one, prompts))


# ---------------------------------------------------------------- bench_serving


def bench_argv(args, url, model, dataset_path, out_file):
    argv = [cluster.venv_python(args.version), "-m", BENCH_MODULE,
            "--backend", "sglang",
            "--base-url", url,
            "--model", model, "--tokenizer", model,
            "--num-prompts", str(args.num_prompts),
            "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len),
            "--random-range-ratio", "1.0",
            "--tokenize-prompt",
            "--request-rate", str(args.request_rate),
            "--max-concurrency", str(args.max_concurrency),
            "--seed", str(args.seed),
            "--warmup-requests", "0",
            "--ready-check-timeout-sec", "60",
            "--output-file", out_file, "--output-details",
            "--disable-tqdm"]
    if args.dataset == "random":
        argv += ["--dataset-name", "random", "--dataset-path", dataset_path]
    else:
        argv += ["--dataset-name", "random-ids"]
    return argv


def bench_env():
    env = cluster._clean_env()
    env.update({"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.pop("SGLANG_IS_IN_CI", None)  # it would flush the cache after (our absent) warm-up
    return env


def run_bench_serving(argv, log_path, run_dir, deadline_s, on_mark):
    """Run bench_serving as a cluster.Proc (own process group, stopped at
    exit); follow its log, calling on_mark("start"/"end") when the markers
    appear; kill it at the deadline. Returns (rc or None, timed_out, seconds)."""
    proc = cluster.Proc("bench_serving", argv, bench_env(), log_path, run_dir)
    proc.start()
    t0 = time.monotonic()
    seen = set()
    pos = 0
    buf = ""
    timed_out = False
    try:
        while True:
            alive = proc.alive()
            try:
                with open(log_path, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos += len(chunk)
                buf += chunk.decode(errors="replace")
            except OSError:
                pass
            for mark, key in ((START_MARK, "start"), (END_MARK, "end")):
                if key not in seen and mark in buf:
                    seen.add(key)
                    on_mark(key)
            buf = buf[-4096:]
            if not alive:
                break
            if time.monotonic() - t0 > deadline_s:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        if proc.alive():
            proc.stop(grace=5)
        else:
            proc.stop(grace=1)  # the group, should a child linger
    return proc.returncode(), timed_out, round(time.monotonic() - t0, 1)


def parse_result(path):
    """The last JSON line of bench_serving's --output-file, or None."""
    try:
        with open(path) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def _num(x, nd=3):
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    if x != x:  # nan
        return None
    return round(x, nd)


# ---------------------------------------------------------------- one run


def run_one(args, variant, rep, model, dataset_path, run_dir):
    penv, denv = identity.VARIANTS[variant]
    name = f"pd-{variant}"
    sub = os.path.join(run_dir, f"rep{rep}-{variant}")
    os.makedirs(sub, exist_ok=True)
    rec = {"variant": variant, "rep": rep, "ok": False, "run_dir": sub}
    dep = cluster.pd(args.version, run_dir=sub, model=model, name=name,
                     prefill={"extra_env": dict(penv)}, decode={"extra_env": dict(denv)})
    t0 = time.monotonic()
    try:
        dep.start(deadline_s=args.start_deadline)
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"did not start: {type(e).__name__}: {e}"[:4000]
        rec["start_failed"] = True
        rec["describe"] = dep.describe()
        log(f"rep {rep} {variant}: did not start: {str(e)[:1500]}")
        dep.stop()
        return rec
    try:
        rec["timings"] = dict(dep.timings)
        rec["up_s"] = round(time.monotonic() - t0, 1)
        log(f"rep {rep} {variant}: up in {rec['up_s']} s {dep.timings}")
        try:
            with open(dep.prefill.proc.log_path, errors="replace") as f:
                plog = f.read()
            rec["kvxfer_took_prefill"] = "kvxferd started live" in plog
        except OSError:
            rec["kvxfer_took_prefill"] = None
        root = dep.prefill.proc.pid

        # Warm-up: a few requests of the measured shape, not from the measured set.
        t1 = time.monotonic()
        wp = warmup_prompts(model, args.warmup, args.input_len, args.seed + rep)
        rec["warmup"] = warmup(dep.url, wp, args.output_len, min(args.max_concurrency, 2), args.request_timeout)
        rec["warmup_s"] = round(time.monotonic() - t1, 1)
        wfail = sum(1 for w in rec["warmup"] if not w["ok"])
        log(f"rep {rep} {variant}: warm-up {len(wp)} requests in {rec['warmup_s']} s, {wfail} failed")

        snap0 = cpu_snapshot(root)
        procs = {str(pid): {"name": e["name"], "role": e["role"]} for pid, e in snap0.items()}
        rec["prefill_processes"] = procs
        if not any(e["role"] == "scheduler" for e in snap0.values()):
            log(f"rep {rep} {variant}: WARNING no sglang::scheduler process under pid {root}: {procs}")
        has_kvxferd = any(e["role"] == "kvxferd" for e in snap0.values())
        if (variant == "kvxfer") != has_kvxferd:
            log(f"rep {rep} {variant}: WARNING kvxferd {'absent' if not has_kvxferd else 'present'} in the prefill tree")
        rec["kvxferd_present"] = has_kvxferd

        # Idle baseline.
        idle = {}
        if args.idle_s > 0:
            ti = time.monotonic()
            time.sleep(args.idle_s)
            snap1 = cpu_snapshot(root)
            dt = time.monotonic() - ti
            roles = cpu_delta(snap0, snap1)
            idle = {"window_s": round(dt, 2), "roles": roles,
                    "scheduler_cpu_per_s": round(_cpu(roles, "scheduler") / dt, 4),
                    "kvxferd_cpu_per_s": round(_cpu(roles, "kvxferd") / dt, 4)}
            log(f"rep {rep} {variant}: idle CPU/s scheduler {idle['scheduler_cpu_per_s']}, kvxferd {idle['kvxferd_cpu_per_s']}")
        rec["idle"] = idle

        # The measured run.
        out_file = os.path.join(sub, "bench_serving.jsonl")
        argv = bench_argv(args, dep.url, model, dataset_path, out_file)
        rec["bench_argv"] = argv
        marks = {}

        def on_mark(key):
            marks[key] = (time.monotonic(), cpu_snapshot(root), loadavg())

        rec["load_start"] = loadavg()
        ta = time.monotonic()
        snap_a = cpu_snapshot(root)
        rc, timed_out, bench_s = run_bench_serving(argv, os.path.join(sub, "bench_serving.log"), sub,
                                                   args.bench_timeout, on_mark)
        snap_d = cpu_snapshot(root)
        td = time.monotonic()
        rec["load_end"] = loadavg()
        rec["bench_rc"], rec["bench_timed_out"], rec["bench_s"] = rc, timed_out, bench_s
        if "start" in marks and "end" in marks:
            (tb, snap_b, lb), (tc, snap_c, lc) = marks["start"], marks["end"]
            window = {"kind": "timed run (bench_serving markers)", "s": round(tc - tb, 2),
                      "roles": cpu_delta(snap_b, snap_c)}
            rec["load_start"], rec["load_end"] = lb, lc
        else:
            window = {"kind": "whole bench_serving process", "s": round(td - ta, 2), "roles": cpu_delta(snap_a, snap_d)}
        rec["window"] = window
        rec["whole_process_cpu"] = {"s": round(td - ta, 2), "roles": cpu_delta(snap_a, snap_d)}

        res = parse_result(out_file)
        if res is None:
            rec["error"] = (f"bench_serving rc {rc}{' (timed out after %.0f s)' % args.bench_timeout if timed_out else ''}, "
                            f"no result; log {os.path.join(sub, 'bench_serving.log')}:\n"
                            + tail(os.path.join(sub, "bench_serving.log")))
            log(f"rep {rep} {variant}: {rec['error'][:3000]}")
        else:
            completed = int(res.get("completed") or 0)
            errors = [e for e in (res.get("errors") or []) if e]
            n_sent = len(res.get("input_lens") or []) or args.num_prompts
            rec["errors_sample"] = errors[:5]
            m = {
                "ttft_p50_ms": _num(res.get("median_ttft_ms"), 1),
                "ttft_p99_ms": _num(res.get("p99_ttft_ms"), 1),
                "itl_p50_ms": _num(res.get("median_itl_ms"), 2),
                "req_per_s": _num(res.get("request_throughput"), 3),
                "completed": completed,
                "failed": max(n_sent - completed, len(errors)),
                "duration_s": _num(res.get("duration"), 2),
                "input_tokens": res.get("total_input_tokens"),
                "output_tokens": res.get("total_output_tokens"),
            }
            roles = window["roles"]
            sch, kvx = _cpu(roles, "scheduler"), _cpu(roles, "kvxferd")
            m["window_s"] = window["s"]
            m["cpu_sched_s"], m["cpu_kvxferd_s"] = round(sch, 3), round(kvx, 3)
            if completed:
                m["cpu_sched_per_req"] = round(sch / completed, 4)
                m["cpu_kvxferd_per_req"] = round(kvx / completed, 4)
                m["cpu_sum_per_req"] = round((sch + kvx) / completed, 4)
                if idle:
                    idle_cpu = (idle["scheduler_cpu_per_s"] + idle["kvxferd_cpu_per_s"]) * window["s"]
                    m["cpu_net_per_req"] = round((sch + kvx - idle_cpu) / completed, 4)
            if idle:
                m["idle_cpu_per_s"] = round(idle["scheduler_cpu_per_s"] + idle["kvxferd_cpu_per_s"], 3)
            rec["metrics"] = m
            rec["bench_result"] = {k: v for k, v in res.items() if k not in ("generated_texts", "itls", "server_info")}
            rec["ok"] = rc == 0 and not timed_out
            if rc != 0 or timed_out:
                rec["error"] = f"bench_serving rc {rc}, timed out {timed_out}"
            log(f"rep {rep} {variant}: {completed} completed, {m['failed']} failed in {m['duration_s']} s; "
                f"TTFT p50 {m['ttft_p50_ms']} ms p99 {m['ttft_p99_ms']} ms, ITL p50 {m['itl_p50_ms']} ms, "
                f"{m['req_per_s']} req/s; CPU/req sched {m.get('cpu_sched_per_req')} kvxferd {m.get('cpu_kvxferd_per_req')} "
                f"over {window['s']} s ({window['kind']}); load {rec['load_start']} -> {rec['load_end']}")
        rec["alive_after"] = dep.alive()
        rec["describe"] = dep.describe()
    except Exception as e:  # noqa: BLE001 - one broken run does not end the benchmark
        rec["ok"] = False
        rec["error"] = f"{type(e).__name__}: {e}"[:4000]
        log(f"rep {rep} {variant}: failed: {rec['error'][:2000]}")
    finally:
        ts = time.monotonic()
        dep.stop()
        rec["stop_s"] = round(time.monotonic() - ts, 1)
    return rec


def tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-n:])
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------- report

COLS = [
    # key, header, format
    ("ttft_p50_ms", "TTFT p50 ms", "{:.1f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.1f}"),
    ("itl_p50_ms", "ITL p50 ms", "{:.2f}"),
    ("req_per_s", "req/s", "{:.3f}"),
    ("cpu_sched_per_req", "CPU s/req sched", "{:.3f}"),
    ("cpu_kvxferd_per_req", "CPU s/req kvxferd", "{:.3f}"),
    ("cpu_sum_per_req", "CPU s/req sum", "{:.3f}"),
    ("cpu_net_per_req", "sum net of idle", "{:.3f}"),
    ("idle_cpu_per_s", "idle CPU/s", "{:.2f}"),
    ("window_s", "window s", "{:.1f}"),
]


def _fmt(fmt, v):
    return "-" if v is None else fmt.format(v)


def _load(rec):
    a, b = rec.get("load_start"), rec.get("load_end")
    if not a or not b:
        return "-"
    return f"{a[0]:.1f}→{b[0]:.1f}"


def _median(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def render(record):
    variants = record["variants"]
    runs = record["runs"]
    hdr = ["variant", "rep"] + [h for _, h, _ in COLS] + ["ok/failed", "load 1m start→end"]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "|".join("---" for _ in hdr) + "|"]
    for r in runs:
        m = r.get("metrics") or {}
        cells = [r["variant"], str(r["rep"])] + [_fmt(f, m.get(k)) for k, _, f in COLS]
        if m:
            cells.append(f"{m.get('completed')}/{m.get('failed')}")
        else:
            cells.append("ERROR" if not r.get("start_failed") else "NO START")
        cells.append(_load(r))
        lines.append("| " + " | ".join(cells) + " |")
    med = {}
    for v in variants:
        ms = [r.get("metrics") or {} for r in runs if r["variant"] == v and r.get("metrics")]
        med[v] = {k: _median([m.get(k) for m in ms]) for k, _, _ in COLS}
        comp = sum(m.get("completed") or 0 for m in ms)
        fail = sum(m.get("failed") or 0 for m in ms)
        loads = [r.get("load_start", [None])[0] for r in runs if r["variant"] == v and r.get("load_start")]
        loads += [r.get("load_end", [None])[0] for r in runs if r["variant"] == v and r.get("load_end")]
        lm = _median(loads)
        cells = [f"**{v} median**", f"{len(ms)} runs"] + [_fmt(f, med[v][k]) for k, _, f in COLS]
        cells += [f"{comp}/{fail}", "-" if lm is None else f"{lm:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if "sglang" in med and "kvxfer" in med:
        cells = ["**kvxfer/sglang**", "ratio"]
        for k, _, _ in COLS:
            a, b = med["kvxfer"].get(k), med["sglang"].get(k)
            cells.append("-" if a is None or b is None or a <= 0 or b <= 0 else f"{a / b:.2f}")
        cells += ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_md(record):
    a = record["args"]
    la, lb = record.get("load_start"), record.get("load_end")
    flags = record.get("bench_flags") or []
    out = [
        f"Serving benchmark, SGLang {a['version']}, {record.get('started_at')}: "
        f"{a['reps']} rep(s) × {', '.join(record['variants'])} (order alternating per rep), "
        f"{a['num_prompts']} prompts of {a['input_len']} tokens → {a['output_len']} tokens, "
        f"request rate {a['request_rate']}/s, max concurrency {a['max_concurrency']}, seed {a['seed']}.",
        "",
        f"Command: `{record['command']}`",
        "",
        f"Machine: {record.get('cpus')} CPUs (CPU-only, shared), load average (1/5/15 min) "
        f"{la} at the start, {lb} at the end; {record.get('total_s')} s in all. "
        f"Run dir `{record['run_dir']}`.",
        "",
        "Client: `python -m " + BENCH_MODULE + " " + " ".join(shlex.quote(x) for x in flags) + "`",
        "",
        render(record),
        "",
        "TTFT/ITL/req/s: bench_serving's own numbers (median_ttft_ms, p99_ttft_ms, median_itl_ms, "
        "request_throughput). CPU s/req: user+system seconds of the prefill server's `sglang::scheduler` "
        "process and of `kvxferd` over bench_serving's timed run (`window s`), divided by completed "
        "requests; `idle CPU/s` is the same pair measured over "
        f"{a['idle_s']} s idle before the run (schedulers busy-poll), `sum net of idle` subtracts it "
        "over the window; on a saturated machine the poll loop gets less CPU under load than idle, so "
        "that column can go negative and only means something when the load average stays below the CPU "
        "count. Ratios are of the medians (`-` where a median is 0, negative or missing). "
        "Deployment start times (s): "
        + "; ".join(f"rep {r['rep']} {r['variant']} {r.get('up_s', '-')}" for r in record["runs"]) + ".",
    ]
    bad = [r for r in record["runs"] if not r.get("ok")]
    if bad:
        out += ["", "Failed runs: " + "; ".join(f"rep {r['rep']} {r['variant']}: {(r.get('error') or '')[:200]}" for r in bad)]
    return "\n".join(out)


def update_doc(path, body):
    section = f"{BEGIN}\n{body.rstrip()}\n{END}\n"
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    i, j = text.find(BEGIN), text.find(END)
    if i >= 0 and j > i:
        j += len(END)
        if text[j:j + 1] == "\n":
            j += 1
        text = text[:i] + section + text[j:]
    else:
        if text and not text.endswith("\n"):
            text += "\n"
        if text:
            text += "\n"
        text += section
    tmp = path + ".tmp-bench"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_outputs(record, run_dir, doc=None):
    md = report_md(record)
    with open(os.path.join(run_dir, "bench.md"), "w") as f:
        f.write(md + "\n")
    with open(os.path.join(run_dir, "bench.json"), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    if doc:
        update_doc(doc, md)
    return md


# ---------------------------------------------------------------- main


def order(variants, rep):
    return list(variants) if rep % 2 == 1 else list(reversed(variants))


def main(argv=None):
    ap = argparse.ArgumentParser(description="bench_serving against PD with SGLang's vs kvxfer's prefill")
    ap.add_argument("--version", default="0.5.23", choices=cluster.VERSIONS)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--request-rate", type=float, default=4.0)
    ap.add_argument("--max-concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--variants", default="sglang,kvxfer", help="comma-separated: " + ",".join(identity.VARIANTS))
    ap.add_argument("--dataset", default="random", choices=("random", "random-ids"),
                    help="random: bench_serving's `random` over a local ShareGPT-format file of random words "
                         "(no download); random-ids: its integer prompts")
    ap.add_argument("--warmup", type=int, default=4, help="warm-up requests per deployment")
    ap.add_argument("--idle-s", type=float, default=10.0, help="idle CPU baseline window per run, s (0: none)")
    ap.add_argument("--bench-timeout", type=float, default=None,
                    help="bench_serving deadline, s (default 180 + 10 per prompt)")
    ap.add_argument("--start-deadline", type=float, default=cluster.START_DEADLINE_S)
    ap.add_argument("--request-timeout", type=float, default=300.0, help="per warm-up request, s")
    ap.add_argument("--model", default=None)
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--doc", default=None, help="file whose bench-serving section to replace (or append)")
    ap.add_argument("--render", default=None, metavar="BENCH_JSON", help="re-render a finished run; runs nothing")
    args = ap.parse_args(argv)

    if args.render:
        with open(args.render) as f:
            record = json.load(f)
        md = write_outputs(record, os.path.dirname(os.path.abspath(args.render)), args.doc)
        print(md)
        return 0

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in identity.VARIANTS:
            ap.error(f"unknown variant {v}")
    if args.bench_timeout is None:
        args.bench_timeout = 180.0 + 10.0 * args.num_prompts
    run_dir = args.run_dir or cluster.new_run_dir("bench")
    os.makedirs(run_dir, exist_ok=True)
    command = " ".join(shlex.quote(x) for x in [sys.executable, os.path.relpath(os.path.abspath(__file__))] + sys.argv[1:]) \
        if argv is None else " ".join(shlex.quote(x) for x in argv)

    t_all = time.monotonic()
    record = {"command": command, "args": vars(args), "variants": variants, "run_dir": run_dir,
              "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpus": os.cpu_count(),
              "load_start": loadavg(), "runs": []}
    log(f"bench: SGLang {args.version}, variants {variants}, {args.reps} reps, {args.num_prompts} prompts "
        f"{args.input_len}->{args.output_len} tokens at {args.request_rate}/s, concurrency {args.max_concurrency}; "
        f"load {record['load_start']}; run dir {run_dir}")
    if not cluster.venv_ready(args.version):
        log(f"bench: SGLang {args.version} venv {cluster.venv_dir(args.version)} not ready")
        return 2
    model = cluster.ensure_model(args.version, args.model)
    dists = cluster.installed_distributions(args.version)
    record["model"], record["distributions"] = model, dists
    log(f"  model {model}; venv {dists}")
    if "kvxfer" in variants and not dists.get("kvxfer"):
        log("bench: variant kvxfer needs the kvxfer wheel installed in the venv")
        return 2
    dataset_path = os.path.join(run_dir, "random-words-sharegpt.json")
    if args.dataset == "random":
        write_dataset(dataset_path, model, max(256, 2 * args.num_prompts), args.input_len, args.seed)
    record["bench_flags"] = bench_argv(args, "<router>", model, dataset_path, "<rep>/bench_serving.jsonl")[3:]

    rc = 0
    try:
        for rep in range(1, args.reps + 1):
            for v in order(variants, rep):
                log(f"- rep {rep}/{args.reps} {v}")
                rec = run_one(args, v, rep, model, dataset_path, run_dir)
                record["runs"].append(rec)
                if rec.get("start_failed"):
                    rc = max(rc, 2)
                elif not rec.get("ok") or (rec.get("metrics") or {}).get("failed"):
                    rc = max(rc, 1)
                record["load_end"] = loadavg()
                record["total_s"] = round(time.monotonic() - t_all, 1)
                write_outputs(record, run_dir)
    finally:
        record["load_end"] = loadavg()
        record["total_s"] = round(time.monotonic() - t_all, 1)
        md = write_outputs(record, run_dir, args.doc)
    print()
    print(md)
    print()
    log(f"bench: {len(record['runs'])} runs in {record['total_s']} s; {run_dir}/bench.md, bench.json"
        + (f"; section updated in {args.doc}" if args.doc else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())
