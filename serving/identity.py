"""Token identity: monolithic SGLang vs PD (prefill + decode over NIXL + router).

    python serving/identity.py --version 0.5.23 --prompts 50 --max-new-tokens 16

Runs a monolithic server and collects greedy output ids for every prompt
(serving/prompts.py); stops it; runs a PD deployment per --variants (default
`sglang`: SGLang's own NIXL prefill, KVXFER_DISABLE=1 in the prefill's
environment; `kvxfer`: the prefill taken by the kvxfer plug-in, which must be
pip-installed into the venv) and collects the same through the router;
compares prompt by prompt. Deployments run one after another. Prints a table,
writes <run-dir>/identity.json; exit status 1 on any mismatch or failed
request, 2 when a deployment did not come up.
"""

import argparse
import concurrent.futures
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster  # noqa: E402
import prompts as prompt_set  # noqa: E402

VARIANTS = {
    # name: (prefill env, decode env)
    "sglang": ({"KVXFER_DISABLE": "1"}, {"KVXFER_DISABLE": "1"}),
    "kvxfer": ({"KVXFER_DISABLE": None}, {"KVXFER_DISABLE": "1"}),
}


def collect(url, ps, max_new_tokens, concurrency, timeout, top_logprobs=0):
    """{name: {"ids": [...], "s": latency, "cached": n, "top": [[[lp, id], ...], ...]}} or {"error": str}."""
    fields = {"return_logprob": True, "top_logprobs_num": top_logprobs} if top_logprobs else {}

    def one(p):
        t = time.monotonic()
        try:
            out = cluster.generate_raw(url, input_ids=p["ids"], max_new_tokens=max_new_tokens, timeout=timeout, **fields)
            mi = out.get("meta_info", {})
            r = {"ids": list(out["output_ids"]), "s": round(time.monotonic() - t, 3),
                 "cached": mi.get("cached_tokens"), "prompt_tokens": mi.get("prompt_tokens")}
            if top_logprobs:
                r["top"] = [[[round(e[0], 5), e[1]] for e in (pos or [])] for pos in (mi.get("output_top_logprobs") or [])]
            return p["name"], r
        except Exception as e:  # noqa: BLE001 - recorded per prompt
            return p["name"], {"error": f"{type(e).__name__}: {e}"[:2000], "s": round(time.monotonic() - t, 3)}

    results = {}
    if concurrency <= 1:
        for p in ps:
            k, v = one(p)
            results[k] = v
    else:
        with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
            for k, v in ex.map(one, ps):
                results[k] = v
    return results


def _margin(top, mine, other):
    """logprob(mine) - logprob(other) in one position's top list; None when
    `other` is not in it (then it is at least mine - the last listed)."""
    lp = {int(t): l for l, t in top}
    if mine not in lp:
        return None
    if other in lp:
        return lp[mine] - lp[other]
    return None if not top else -(lp[mine] - min(lp.values()))  # negative: a lower bound, not a tie


def compare(ref, got, tie_eps):
    """'same', ('tie', i, margin) or ('diff', i, margin-or-None)."""
    a, b = ref["ids"], got["ids"]
    if a == b:
        return "same", None, None
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if i >= min(len(a), len(b)) or not ref.get("top") or not got.get("top") or i >= len(ref["top"]) or i >= len(got["top"]):
        return "diff", i, None
    m_ref = _margin(ref["top"][i], a[i], b[i])
    m_got = _margin(got["top"][i], b[i], a[i])
    if m_ref is None or m_got is None or m_ref < 0 or m_got < 0:
        return "diff", i, None
    m = max(m_ref, m_got)
    return ("tie" if m <= tie_eps else "diff"), i, round(m, 5)


def run_deployment(dep, ps, args, log, save=lambda rec: None):
    """Start, collect, read server_info, save(rec) (before stopping), stop."""
    rec = {"kind": dep.kind, "ok": False}
    t0 = time.monotonic()
    try:
        dep.start(deadline_s=args.deadline)
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["describe"] = dep.describe()
        log(f"  {dep.kind}: did not start: {str(e)[:3000]}")
        dep.stop()
        return rec
    try:
        rec["timings"] = dict(dep.timings)
        log(f"  {dep.kind}: up in {time.monotonic() - t0:.1f} s {dep.timings}")
        t1 = time.monotonic()
        rec["results"] = collect(dep.url, ps, args.max_new_tokens, args.concurrency, args.request_timeout,
                                 top_logprobs=args.top_logprobs)
        rec["collect_s"] = round(time.monotonic() - t1, 1)
        info_urls = {"server": dep.url} if dep.kind == "monolithic" else {"prefill": dep.prefill_url, "decode": dep.decode_url}
        rec["server_info"] = {}
        for role, u in info_urls.items():
            try:
                si = cluster.server_info(u)
                si.pop("loads", None)
                rec["server_info"][role] = si
            except Exception as e:  # noqa: BLE001
                rec["server_info"][role] = {"error": str(e)}
        rec["alive_after"] = dep.alive()
        rec["describe"] = dep.describe()
        rec["ok"] = True
        errs = sum(1 for r in rec["results"].values() if "error" in r)
        log(f"  {dep.kind}: {len(ps)} prompts in {rec['collect_s']} s, {errs} failed, all alive after: {rec['alive_after']}")
        save(rec)
    finally:
        dep.stop()
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description="monolithic vs PD greedy token identity on real SGLang servers")
    ap.add_argument("--version", default="0.5.23", choices=cluster.VERSIONS)
    ap.add_argument("--prompts", type=int, default=50, help=f"how many of the {prompt_set.count()} fixed prompts")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--variants", default="sglang", help="comma-separated PD variants: " + ",".join(VARIANTS))
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--deadline", type=float, default=cluster.START_DEADLINE_S, help="per-server start deadline, s")
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--parallel-start", action="store_true", help="start prefill and decode at the same time")
    ap.add_argument("--dtype", default=None, help="--dtype for every server (default: the model's bf16)")
    ap.add_argument("--top-logprobs", type=int, default=5,
                    help="ask for this many top logprobs per output token (0: none) to tell ties from differences")
    ap.add_argument("--tie-eps", type=float, default=0.05,
                    help="a first divergence where both sides' logprob margin is <= this is a TIE (bf16 logits tie exactly "
                         "for a few %% of tokens; which of two tied tokens wins depends on the batch shape)")
    ap.add_argument("--allow-ties", action="store_true", help="TIEs do not fail the run (they are reported)")
    args = ap.parse_args(argv)

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v}")
    run_dir = args.run_dir or cluster.new_run_dir(f"identity-{args.version}")
    os.makedirs(run_dir, exist_ok=True)
    logf = open(os.path.join(run_dir, "identity.log"), "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    t_all = time.monotonic()
    log(f"identity: SGLang {args.version}, {args.prompts} prompts, {args.max_new_tokens} new tokens, "
        f"concurrency {args.concurrency}, variants {variants}; run dir {run_dir}")
    if not cluster.venv_ready(args.version):
        log(f"identity: SGLang {args.version} venv {cluster.venv_dir(args.version)} not ready")
        return 2
    model = cluster.ensure_model(args.version, args.model)
    cluster.ensure_cpu_dram_plugin(args.version)
    dists = cluster.installed_distributions(args.version)
    log(f"  model {model}; venv {dists}")
    if "kvxfer" in variants and not dists.get("kvxfer"):
        log("identity: variant kvxfer needs the kvxfer wheel installed in the venv (make wheel; pip install dist/kvxfer-*.whl)")
        return 2
    ps = prompt_set.prompts(args.prompts)

    record = {"version": args.version, "prompts": len(ps), "max_new_tokens": args.max_new_tokens,
              "concurrency": args.concurrency, "run_dir": run_dir, "distributions": dists,
              "args": {"common": cluster.COMMON_ARGS, "mono": cluster.MONO_ARGS, "prefill": cluster.PREFILL_ARGS,
                       "decode": cluster.DECODE_ARGS, "env": cluster.BASE_ENV},
              "deployments": {}}
    xargs = ["--dtype", args.dtype] if args.dtype else []
    record["args"]["extra"] = xargs
    deps = [("monolithic", cluster.monolithic(args.version, run_dir=os.path.join(run_dir, "monolithic"), model=model,
                                              server={"extra_args": xargs}))]
    for v in variants:
        penv, denv = VARIANTS[v]
        deps.append((f"pd-{v}", cluster.pd(args.version, run_dir=os.path.join(run_dir, f"pd-{v}"), model=model,
                                           prefill={"extra_env": penv, "extra_args": xargs},
                                           decode={"extra_env": denv, "extra_args": xargs},
                                           name=f"pd-{v}", parallel_start=args.parallel_start)))
    def save(name, rec):
        record["deployments"][name] = rec
        with open(os.path.join(run_dir, "identity.json"), "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)

    for name, dep in deps:
        log(f"- {name}")
        save(name, run_deployment(dep, ps, args, log, save=lambda rec, name=name: save(name, rec)))

    mono = record["deployments"]["monolithic"]
    failed_start = [n for n, r in record["deployments"].items() if not r["ok"]]
    rows, mismatches, errors, ties = [], 0, 0, 0
    pd_names = [n for n, _ in deps[1:]]
    for p in ps:
        m = (mono.get("results") or {}).get(p["name"], {"error": "not run"})
        row = {"name": p["name"], "kind": p["kind"], "len": len(p["ids"]), "mono": {k: v for k, v in m.items() if k != "top"}}
        for n in pd_names:
            r = (record["deployments"][n].get("results") or {}).get(p["name"], {"error": "not run"})
            margin = None
            if "error" in m or "error" in r:
                verdict = "ERROR"
                errors += 1
            else:
                kind, i, margin = compare(m, r, args.tie_eps)
                if kind == "same":
                    verdict = "same"
                elif kind == "tie":
                    verdict = f"TIE@{i}"
                    ties += 1
                else:
                    verdict = f"DIFF@{i}"
                    mismatches += 1
            row[n] = {"verdict": verdict, "margin": margin, **{k: v for k, v in r.items() if k != "top"}}
        rows.append(row)

    hdr = f"{'prompt':24s} {'kind':7s} {'len':>5s} {'mono s':>7s} {'cached':>6s}"
    for n in pd_names:
        hdr += f" | {n + ' s':>16s} {'cached':>6s} {'verdict':>16s}"
    log("")
    log(hdr)
    log("-" * len(hdr))
    for row in rows:
        m = row["mono"]
        line = f"{row['name']:24s} {row['kind']:7s} {row['len']:5d} {m.get('s', 0):7.2f} {str(m.get('cached', '-')):>6s}"
        for n in pd_names:
            r = row[n]
            v = r["verdict"] + ("" if r.get("margin") is None else f"({r['margin']:.3f})")
            line += f" | {r.get('s', 0):16.2f} {str(r.get('cached', '-')):>6s} {v:>16s}"
        log(line)
    log("")
    for name, r in record["deployments"].items():
        log(f"{name}: start {r.get('timings')}, collect {r.get('collect_s')} s, ok {r['ok']}")
        for role, si in (r.get("server_info") or {}).items():
            log(f"  {role} server_info: " + json.dumps({k: si.get(k) for k in (
                "kv_used_tokens", "kv_total_tokens", "token_usage", "running_reqs", "waiting_reqs",
                "disaggregation_mode", "prefill_bootstrap_queue", "prefill_inflight_queue",
                "decode_prealloc_queue", "decode_transfer_queue")}))
    same = sum(1 for row in rows for n in pd_names if row[n]["verdict"] == "same")
    bad_ties = 0 if args.allow_ties else ties
    verdict = "PASS" if not (mismatches or errors or failed_start or bad_ties) else "FAIL"
    summary = {"verdict": verdict, "same": same, "ties": ties, "mismatches": mismatches, "errors": errors,
               "failed_start": failed_start, "total_s": round(time.monotonic() - t_all, 1)}
    record["rows"] = rows
    record["summary"] = summary
    with open(os.path.join(run_dir, "identity.json"), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    log(f"identity {args.version}: {verdict}: {same}/{len(ps) * len(pd_names)} identical, {ties} ties"
        f"{' (allowed)' if args.allow_ties and ties else ''}, {mismatches} differ, "
        f"{errors} errors, failed to start: {failed_start or 'none'}; {summary['total_s']} s; {run_dir}/identity.json")
    if failed_start:
        return 2
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
