#!/usr/bin/env python3
"""Re-measure docs/benchmarks.md's figures on two trees, alternating.

    scripts/bench-compare.py [--reps 3] [--only suite,demo,go] [--go SUBSTR] [--out DIR] OLD NEW

OLD and NEW are git revisions (or "WORKTREE" for the working tree as it is).
Each is built once into its own directory (binaries and Go test binaries);
then every figure is measured on both, alternating per repetition (old, new;
new, old; ...), so that a load that drifts during the run touches both alike.
The table gives each figure's median and range per tree, new ÷ old of the
medians, and the 1-minute load average seen around the figure's runs.

A figure a tree cannot produce (a benchmark it does not have) shows "—".
Nothing here asserts a speed: the output is for people to read.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Go micro-benchmarks docs/benchmarks.md quotes: (package, -test.bench, -test.benchtime).
GO_BENCHES = [
    ("./actors", "^BenchmarkBytesPerLiveRoom$", "20000x"),
    ("./actors", "^BenchmarkNewRoomsBatched$", "1s"),
    ("./actors", "^BenchmarkPoll1000$", "1s"),
    ("./actors", "^BenchmarkRoomLifecycle$", "1s"),
    ("./actors/xfer", "^BenchmarkRoomCompletion$", "3000x"),
    ("./transport/control", "^BenchmarkAbortStorm$/.*/shm", "3x"),
    ("./daemon", "^BenchmarkDaemonIngest$/(new|opened)/batched", "100000x"),
    ("./daemon", "^BenchmarkDecodeRegistration$", "200x"),
    ("./transport/zmqio", "^BenchmarkIngestTransferInfo$", "1s"),
    ("./telemetry", "^BenchmarkTelemetryOverhead$/^ratio-0.1$", "100000x"),
]

DEMOS = [
    ("demo 20% aborts, fleet 0.5.22,0.5.23", ["-fleet", "0.5.22,0.5.23", "-rooms", "30000"]),
    ("demo no aborts, c=64", ["-abort-share", "0", "-rooms", "30000", "-concurrency", "64"]),
]


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run(cmd, cwd=None, timeout=1800):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def build(rev, work):
    """Builds rev into work/<name>; returns its directory."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", rev)
    out = os.path.join(work, name)
    src = REPO
    if rev != "WORKTREE":
        src = os.path.join(work, name + "-src")
        rc, log = run(["git", "-C", REPO, "worktree", "add", "--detach", "-f", src, rev])
        if rc != 0:
            sys.exit(f"bench-compare: cannot check out {rev}: {log}")
    os.makedirs(out, exist_ok=True)
    print(f"[build] {rev} in {src}", file=sys.stderr, flush=True)
    rc, log = run(["go", "build", "-o", out + "/", "./cmd/..."], cwd=src)
    if rc != 0:
        sys.exit(f"bench-compare: build of {rev} failed:\n{log}")
    for pkg in sorted({b[0] for b in GO_BENCHES}):
        t = os.path.join(out, pkg.strip("./").replace("/", "_") + ".test")
        rc, log = run(["go", "test", "-c", "-o", t, pkg], cwd=src)
        if rc != 0:
            print(f"[build] {rev}: {pkg} has no test binary ({log.strip()[:200]})", file=sys.stderr)
    return out, src


def suite_figures(bindir, tmp):
    out = os.path.join(tmp, "suite")
    shutil.rmtree(out, ignore_errors=True)
    rc, log = run([os.path.join(bindir, "kvxfer-bench"), "-suite", "quick", "-no-races", "-q", "-out", out])
    if rc != 0:
        print(f"[suite] failed: {log[-500:]}", file=sys.stderr)
        return {}
    with open(os.path.join(out, "results.json")) as f:
        d = json.load(f)
    figs = {}
    for row in d.get("throughput") or []:
        eng = {e["engine"]: e for e in row["engines"]}
        a = eng.get("actors")
        if not a:
            continue
        figs[f"suite {row['name']}: actors rooms/s"] = a["rooms_per_sec_median"]
        figs[f"suite {row['name']}: actors CPU s/1k rooms"] = a["cpu_s_per_1k_rooms_median"]
        if "fixed" in eng:
            figs[f"suite {row['name']}: actors ÷ fixed (same run)"] = (
                a["rooms_per_sec_median"] / eng["fixed"]["rooms_per_sec_median"])
        ttt = a.get("time_to_terminal") or {}
        for q in ("p50", "p99"):
            if ttt.get(q + "_ns"):
                figs[f"suite {row['name']}: actors TTT {q} ms"] = ttt[q + "_ns"] / 1e6
    storm = d.get("storm")
    if storm:
        for e in storm["engines"]:
            if e["engine"] not in ("actors", "fixed"):
                continue
            a2t = e.get("abort_to_terminal") or {}
            for q in ("p50", "p99"):
                if a2t.get(q + "_ns"):
                    figs[f"suite storm: {e['engine']} A2T {q} ms"] = a2t[q + "_ns"] / 1e6
            if e["engine"] == "actors":
                figs["suite storm: actors rooms/s"] = e["rooms_per_sec_median"]
    for m in d.get("memory") or []:
        for e in m["engines"]:
            if e["engine"] == "actors":
                figs[f"suite memory {m['rooms']} rooms: actors heap B/room"] = e["heap_bytes_per_room"]
    return figs


DEMO_RE = {
    "rooms/s": re.compile(r"pinned \d+, (\d+) rooms/s"),
    "TTT p50 ms": re.compile(r"time-to-terminal p50 ([\d.]+) ms"),
    "TTT p99 ms": re.compile(r"time-to-terminal p50 [\d.]+ ms p99 ([\d.]+) ms"),
    "kvxferd CPU µs/room": re.compile(r"kvxferd (\d+) µs"),
    "all processes CPU µs/room": re.compile(r"all (\d+) µs"),
}


def demo_figures(bindir, name, args):
    rc, log = run([os.path.join(bindir, "kvxfer-demo")] + args)
    summary = log[log.find("== summary"):] if "== summary" in log else ""
    figs = {}
    for k, rx in DEMO_RE.items():
        m = rx.search(summary)
        if m:
            figs[f"{name}: {k}"] = float(m.group(1))
    if rc != 0 or not figs:
        print(f"[demo] {name}: rc {rc}: {log[-300:]}", file=sys.stderr)
    return figs


BENCH_LINE = re.compile(r"^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$")


def go_figures(bindir, pkg, bench, benchtime):
    t = os.path.join(bindir, pkg.strip("./").replace("/", "_") + ".test")
    if not os.path.exists(t):
        return {}
    env_cwd = None
    rc, log = run([t, "-test.run", "^$", "-test.bench", bench, "-test.benchtime", benchtime], cwd=env_cwd)
    figs = {}
    for line in log.splitlines():
        m = BENCH_LINE.match(line.strip())
        if not m:
            continue
        fields = m.group(2).split()
        for v, unit in zip(fields[0::2], fields[1::2]):
            try:
                figs[f"{pkg.strip('./')} {m.group(1)}: {unit}"] = float(v)
            except ValueError:
                pass
    if rc != 0:
        print(f"[go] {pkg} {bench}: rc {rc}: {log[-300:]}", file=sys.stderr)
    return figs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="suite,demo,go")
    ap.add_argument("--out", default="")
    ap.add_argument("--go", default="", help="only the Go benchmarks whose package or name contains this")
    args = ap.parse_args()
    parts = set(args.only.split(","))
    work = tempfile.mkdtemp(prefix="kvxfer-cmp-")
    trees = {}
    srcs = []
    for label, rev in (("old", args.old), ("new", args.new)):
        bindir, src = build(rev, work)
        trees[label] = bindir
        if src != REPO:
            srcs.append(src)
    values = {}  # figure -> label -> [values]
    loads = {}  # figure -> [load]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    def record(label, figs, ld):
        for k, v in figs.items():
            values.setdefault(k, {}).setdefault(label, []).append(v)
            loads.setdefault(k, []).append(ld)

    jobs = []
    if "suite" in parts:
        jobs.append(("suite", lambda b: suite_figures(b, work)))
    if "demo" in parts:
        for name, dargs in DEMOS:
            jobs.append((name, lambda b, n=name, a=dargs: demo_figures(b, n, a)))
    if "go" in parts:
        for pkg, bench, bt in GO_BENCHES:
            if args.go and args.go not in pkg + " " + bench:
                continue
            jobs.append((f"{pkg} {bench}", lambda b, p=pkg, x=bench, t=bt: go_figures(b, p, x, t)))
    try:
        for rep in range(args.reps):
            order = ("old", "new") if rep % 2 == 0 else ("new", "old")
            for name, job in jobs:
                for label in order:
                    ld = load1()
                    print(f"[rep {rep + 1}/{args.reps}] {name} on {label} (load {ld})", file=sys.stderr, flush=True)
                    record(label, job(trees[label]), max(ld, load1()))
    finally:
        for s in srcs:
            run(["git", "-C", REPO, "worktree", "remove", "--force", s])
    lines = [
        f"bench-compare {started}: old = `{args.old}`, new = `{args.new}`, {args.reps} alternating reps, "
        f"{os.cpu_count()} CPUs; command: `scripts/bench-compare.py --reps {args.reps} --only {args.only} "
        f"{'--go ' + args.go + ' ' if args.go else ''}{args.old} {args.new}`",
        "",
        "| figure | old median [range] | new median [range] | new ÷ old | load 1m |",
        "|---|---|---|---|---|",
    ]

    def fmt(xs):
        if not xs:
            return "—"
        m = statistics.median(xs)
        return f"{m:.4g} [{min(xs):.4g}–{max(xs):.4g}]"

    for k in values:
        o, n = values[k].get("old", []), values[k].get("new", [])
        ratio = f"{statistics.median(n) / statistics.median(o):.2f}" if o and n and statistics.median(o) else "—"
        ls = loads[k]
        lines.append(f"| {k} | {fmt(o)} | {fmt(n)} | {ratio} | {min(ls):.1f}–{max(ls):.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "compare.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "compare.json"), "w") as f:
            json.dump({"old": args.old, "new": args.new, "values": values, "loads": loads}, f, indent=1)


if __name__ == "__main__":
    main()
