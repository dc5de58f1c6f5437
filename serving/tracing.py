"""SGLang's tracing with kvxfer's prefill: does a request's trace hold its
kvxfer room span, under SGLang's own spans, and does an aborted request's room
span say why it failed?

    python serving/tracing.py --version 0.5.23 [--requests 4] [--run-dir DIR]

What it does (every wait bounded):
  1. the serving venv gets SGLang's `tracing` extra if it lacks it
     (opentelemetry-sdk and the OTLP gRPC/HTTP exporters, at the venv's
     opentelemetry-api version; pip, under the harness's venv lock);
  2. starts serving/otlp_receiver.py (OTLP/gRPC and OTLP/HTTP, spans to
     <run-dir>/spans.jsonl);
  3. starts a PD deployment: kvxfer's prefill with `--enable-trace
     --otlp-traces-endpoint 127.0.0.1:<grpc port>` and no OTEL_* endpoint in
     its environment (the plug-in gives kvxferd SGLang's endpoint and
     protocol), SGLang's own decode (KVXFER_DISABLE=1), the mini-LB router;
  4. sends N requests through the router (each with its own `rid`), then
     streamed requests the client closes before their first token, and
     requests aborted with the prefill's POST /abort_request {rid} (a few
     moments each, each beside a long request so that it waits in the
     prefill);
  5. waits for the spans and checks, per request: the prefill's root span
     ("prefill Req <rid>", attribute rid), the kvxfer room span
     (`kv_transfer.room`, `pd.bootstrap_room` = the root's bootstrap_room) in
     the same trace, whose parent is a span SGLang exported in that trace;
     for a cancelled or aborted request whose room failed: status Error with
     `error.type` (the reason). Room spans in a trace whose root SGLang never
     exported are listed (`rooms_without_root`).

`check(version, run_dir)` returns the results as a dict (also written to
<run-dir>/tracing.json); main prints a table and exits 0 when it passed.
The router (sglang-router 0.3.2's mini-LB) takes no part: its tracing imports
`sglang.srt.tracing.trace`, which neither release has, and it forwards no W3C
header, so each server's trace starts at that server (docs/observability.md,
"Tracing with SGLang").
"""

import argparse
import json
import os
import select
import socket
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import cluster  # noqa: E402
import otlp_receiver  # noqa: E402  (load() only: the standard library)
import prompts as prompt_set  # noqa: E402

RECEIVER = os.path.join(HERE, "otlp_receiver.py")
SPAN_DEADLINE_S = 120.0
ROOM_SPAN = "kv_transfer.room"
# OTEL_* a caller's environment may hold: removed from the prefill's, so the
# plug-in's own derivation from SGLang's flags is what is tested.
OTEL_UNSET = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
              "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SDK_DISABLED",
              "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG")
TRACE_IMPORTS = ("import grpc, opentelemetry.sdk.trace, opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc, "
                 "opentelemetry.exporter.otlp.proto.grpc.trace_exporter, opentelemetry.exporter.otlp.proto.http.trace_exporter")
TRACE_PACKAGES = ("opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc", "opentelemetry-exporter-otlp-proto-http")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] tracing: {msg}", flush=True)


# ---------------------------------------------------------------- venv


def ensure_tracing_packages(version, timeout=600):
    """SGLang's `tracing` extra in the release's venv (the serving install
    leaves extras out). Returns what was done."""
    rc, _, err = cluster._venv_run(version, TRACE_IMPORTS)
    if rc == 0:
        return {"installed": []}
    rc, out, _ = cluster._venv_run(version, "from importlib.metadata import version; print(version('opentelemetry-api'))")
    pin = f"=={out.strip()}" if rc == 0 and out.strip() else ""
    pkgs = [p + pin for p in TRACE_PACKAGES]
    import subprocess

    with cluster._venv_lock(version):
        r = subprocess.run([cluster.venv_python(version), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            *pkgs], capture_output=True, text=True, timeout=timeout, env=cluster._clean_env())
    if r.returncode != 0:
        raise cluster.ServingError(f"pip install {' '.join(pkgs)} into {cluster.venv_dir(version)} failed:\n"
                                   f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    rc, _, err = cluster._venv_run(version, TRACE_IMPORTS)
    if rc != 0:
        raise cluster.ServingError(f"SGLang's tracing packages still do not import in {cluster.venv_dir(version)}: {err[-1000:]}")
    return {"installed": pkgs}


# ---------------------------------------------------------------- receiver


class Receiver:
    def __init__(self, version, run_dir, max_seconds):
        self.out = os.path.join(run_dir, "spans.jsonl")
        self.ready = os.path.join(run_dir, "otlp-receiver.json")
        for p in (self.out, self.ready):
            if os.path.exists(p):
                os.remove(p)
        argv = [cluster.venv_python(version), RECEIVER, "--out", self.out, "--ready", self.ready,
                "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--max-seconds", str(int(max_seconds))]
        self.proc = cluster.Proc("otlp-receiver", argv, cluster._clean_env(),
                                 os.path.join(run_dir, "otlp-receiver.log"), run_dir)
        self.grpc_port = self.http_port = None

    def start(self, deadline_s=60.0):
        self.proc.start()
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if not self.proc.alive():
                raise cluster.ServerDied(f"otlp_receiver exited (rc {self.proc.returncode()}):\n{self.proc.log_tail()}")
            try:
                with open(self.ready) as f:
                    info = json.load(f)
                self.grpc_port, self.http_port = info["grpc"], info["http"]
                return self
            except (OSError, ValueError, KeyError):
                time.sleep(0.2)
        raise cluster.Timeout(f"otlp_receiver not listening after {deadline_s:.0f} s:\n{self.proc.log_tail()}")

    def spans(self):
        return otlp_receiver.load(self.out)

    def stop(self):
        self.proc.stop(grace=10)
        try:
            with open(self.ready) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}


# ---------------------------------------------------------------- clients


def cancelled_stream(url, rid, ids, delay_s, max_new_tokens=16, deadline_s=60.0):
    """A streamed /generate the client closes `delay_s` after sending it, or
    at its first token if that comes first. Returns (outcome, seconds):
    "closed_before_first_token" or "token_first"."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    body = json.dumps({"input_ids": ids, "rid": rid, "stream": True,
                       "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                           "ignore_eos": True}}).encode()
    head = (f"POST /generate HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    s = socket.create_connection((host, int(port)), timeout=10)
    t0 = time.monotonic()
    outcome = "closed_before_first_token"
    try:
        s.sendall(head + body)
        t0 = time.monotonic()
        buf = b""
        end = t0 + min(delay_s, deadline_s)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            r, _, _ = select.select([s], [], [], left)
            if not r:
                continue
            chunk = s.recv(65536)
            if not chunk:
                outcome = "server_closed"
                break
            buf += chunk
            if b"data:" in buf and b"output_ids" in buf:
                outcome = "token_first"
                break
    finally:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
    return outcome, round(time.monotonic() - t0, 3)


def _generate(url, rid, ids, max_new_tokens, out, key):
    try:
        r = cluster.generate_raw(url, input_ids=ids, max_new_tokens=max_new_tokens, rid=rid, timeout=300)
        fin = (r.get("meta_info") or {}).get("finish_reason")
        out[key] = {"ok": True, "finish_reason": fin, "tokens": len(r.get("output_ids") or [])}
    except Exception as e:  # noqa: BLE001
        out[key] = {"ok": False, "error": str(e)[:300]}


def _rid(tag):
    # No "_": SGLang's root span keeps the part of the rid after the last "_".
    return f"kvxtrace{tag}{uuid.uuid4().hex[:16]}"


# ---------------------------------------------------------------- spans


def _by_trace(spans):
    out = {}
    for s in spans:
        out.setdefault(s["trace_id"], []).append(s)
    return out


def _root_of(spans, rid):
    """SGLang's prefill root span of the request rid (no parent, attribute rid)."""
    for s in spans:
        a = s.get("attributes") or {}
        if a.get("rid") == rid and s["service"] != "kvxferd" and not s["parent_span_id"]:
            return s
    for s in spans:  # a root under an external parent (a traceparent header)
        if (s.get("attributes") or {}).get("rid") == rid and s["service"] != "kvxferd":
            return s
    return None


def _room_spans(spans, room):
    return [s for s in spans if s["name"] == ROOM_SPAN and (s.get("attributes") or {}).get("pd.bootstrap_room") == room]


def judge(spans, rid, kind):
    """One request's row: its root, its room span, the room span's parent."""
    row = {"rid": rid, "kind": kind, "root": None, "room": None, "trace_id": None, "room_span": None,
           "room_status": None, "error_type": None, "status_message": None, "parent": None,
           "parent_in_sglang_trace": False, "ok": False, "why": None}
    root = _root_of(spans, rid)
    if root is None:
        row["why"] = "no SGLang root span with this rid"
        return row
    row["root"] = root["name"]
    row["trace_id"] = root["trace_id"]
    room_hex = (root.get("attributes") or {}).get("bootstrap_room")
    if not room_hex:
        row["why"] = "the root span has no bootstrap_room"
        return row
    room = int(str(room_hex), 16)
    row["room"] = room
    rooms = _room_spans(spans, room)
    if not rooms:
        row["why"] = f"no {ROOM_SPAN} span for room {room}"
        return row
    trace = [s for s in spans if s["trace_id"] == root["trace_id"]]
    sgl = {s["span_id"]: s for s in trace if s["service"] != "kvxferd"}
    rs = next((s for s in rooms if s["trace_id"] == root["trace_id"]), rooms[0])
    a = rs.get("attributes") or {}
    row.update({"room_span": rs["span_id"], "room_status": a.get("kv_transfer.status"),
                "error_type": a.get("error.type"), "status_message": (rs.get("status") or {}).get("message"),
                "status_code": (rs.get("status") or {}).get("code"), "room_trace_id": rs["trace_id"],
                "sampling": a.get("kv_transfer.sampling")})
    parent = sgl.get(rs["parent_span_id"])
    if rs["trace_id"] != root["trace_id"]:
        row["why"] = f"room span in trace {rs['trace_id']}, not the request's {root['trace_id']}"
        return row
    if parent is None:
        row["why"] = f"room span's parent {rs['parent_span_id'] or '(none)'} is not a span SGLang exported in the trace"
        return row
    row["parent"] = parent["name"]
    row["parent_service"] = parent["service"]
    row["parent_in_sglang_trace"] = True
    # The parent's chain up to the root, all SGLang's.
    chain, cur = [], parent
    while cur is not None and len(chain) < 16:
        chain.append(cur["name"])
        cur = sgl.get(cur["parent_span_id"])
    row["ancestry"] = chain
    if kind == "completed":
        row["ok"] = row["room_status"] == "Success"
        if not row["ok"]:
            row["why"] = f"room status {row['room_status']}"
    else:
        failed = row["room_status"] == "Failed"
        row["ok"] = (not failed) or (bool(row["error_type"]) and row.get("status_code") == 2)
        if failed and not row["ok"]:
            row["why"] = "failed room without error.type / Error status"
        # The SGLang side of the abort: the spans of the trace carrying an error.
        row["sglang_errors"] = [{"span": s["name"], "attributes": {k: v for k, v in (s.get("attributes") or {}).items()
                                                                   if k in ("reason", "type", "message", "status_code")}}
                                for s in trace if s["service"] != "kvxferd" and (s.get("status") or {}).get("code") == 2]
    return row


def tree(spans, trace_id):
    """The trace's spans as indented lines (parent before children, by start)."""
    trace = sorted((s for s in spans if s["trace_id"] == trace_id), key=lambda s: s["start_ns"])
    ids = {s["span_id"] for s in trace}
    kids = {}
    for s in trace:
        kids.setdefault(s["parent_span_id"] if s["parent_span_id"] in ids else "", []).append(s)
    lines = []

    def walk(pid, depth):
        for s in kids.get(pid, []):
            ms = (s["end_ns"] - s["start_ns"]) / 1e6 if s["end_ns"] else 0
            extra = ""
            a = s.get("attributes") or {}
            if s["name"] == ROOM_SPAN:
                extra = f" status={a.get('kv_transfer.status')}" + (f" error.type={a['error.type']}" if a.get("error.type") else "")
            elif (s.get("status") or {}).get("code") == 2:
                extra = " ERROR " + ", ".join(f"{k}={str(v)[:80]}" for k, v in a.items() if k in ("reason", "type", "message"))
            lines.append(f"{'  ' * depth}{s['name']} [{s['service']}] {ms:.1f} ms{extra}")
            if len(lines) < 200:
                walk(s["span_id"], depth + 1)

    walk("", 0)
    return lines


# ---------------------------------------------------------------- the check


def _abort_via_api(prefill_url, rid, delay_s):
    """POST /abort_request {rid} to the prefill server after delay_s."""
    time.sleep(delay_s)
    status, body = cluster.http("POST", prefill_url.rstrip("/") + "/abort_request", {"rid": rid}, timeout=30)
    return status


def _orphans(spans):
    """Room spans whose trace has no SGLang root span ("prefill Req ...")."""
    rooted = {s["trace_id"] for s in spans if s["service"] != "kvxferd" and not s["parent_span_id"]}
    byid = {s["span_id"]: s for s in spans}
    out = []
    for s in spans:
        if s["name"] == ROOM_SPAN and s["trace_id"] not in rooted:
            a = s.get("attributes") or {}
            p = byid.get(s["parent_span_id"])
            out.append({"room": a.get("pd.bootstrap_room"), "status": a.get("kv_transfer.status"),
                        "error_type": a.get("error.type"), "trace_id": s["trace_id"],
                        "parent": p["name"] if p else None})
    return out


def check(version, run_dir=None, requests=4, cancels=(0.15, 0.4, 0.8), aborts=(0.3, 0.8), max_new_tokens=8,
          span_deadline_s=SPAN_DEADLINE_S, start_deadline_s=cluster.START_DEADLINE_S):
    """Run it; the results as a dict (ok, rows, one request's span tree, ...).

    ok: every completed request's room span is Success under SGLang's trace,
    at least one cancelled or aborted request's room failed, and every failed
    one carries its reason (Error status, error.type) under SGLang's trace.
    `client_cancel_failed_room` says whether a client's close reached the
    prefill's room (SGLang 0.5.18 never aborts it: docs/observability.md)."""
    run_dir = run_dir or cluster.new_run_dir(f"tracing-{version}")
    os.makedirs(run_dir, exist_ok=True)
    res = {"version": version, "run_dir": run_dir, "ok": False, "errors": [], "rows": []}
    t0 = time.monotonic()
    rec = dep = None
    try:
        res["packages"] = ensure_tracing_packages(version)
        rec = Receiver(version, run_dir, max_seconds=start_deadline_s * 3 + span_deadline_s + 900).start()
        res["receiver"] = {"grpc": rec.grpc_port, "http": rec.http_port}
        endpoint = f"127.0.0.1:{rec.grpc_port}"
        prefill_env = {k: None for k in OTEL_UNSET}
        prefill_env.update({"KVXFER_DISABLE": None, "KVXFER_LINGER_TIMEOUT": "20",
                            "SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS": "500"})
        trace_args = ["--enable-trace", "--otlp-traces-endpoint", endpoint]
        res["prefill_args"] = trace_args
        dep = cluster.pd(version, run_dir=run_dir, name="pd-trace",
                         prefill={"extra_args": trace_args, "extra_env": prefill_env},
                         decode={"extra_env": {"KVXFER_DISABLE": "1"}})
        log(f"{version}: starting the PD deployment (prefill traced to {endpoint})")
        dep.start(deadline_s=start_deadline_s)
        res["timings"] = dep.timings
        log(f"{version}: up {dep.timings}")

        ps = prompt_set.prompts(56)
        short = [p["ids"] for p in ps if p["kind"] in ("short", "medium")]
        long_ = sorted((p["ids"] for p in ps if p["kind"] == "long"), key=len, reverse=True)
        sent = []
        outcomes = {}
        for i in range(requests):
            rid = _rid(f"c{i}")
            _generate(dep.url, rid, short[i % len(short)], max_new_tokens, outcomes, rid)
            sent.append((rid, "completed"))
        log(f"{version}: {requests} requests done; cancelling and aborting")
        k = 0

        def busy():
            nonlocal k
            rid = _rid(f"b{k}")
            th = threading.Thread(target=_generate, args=(dep.url, rid, long_[(2 * k) % len(long_)], max_new_tokens,
                                                          outcomes, rid), daemon=True)
            th.start()
            sent.append((rid, "completed"))
            k += 1
            time.sleep(0.05)
            return th

        # Streams the client closes, each while a long request keeps the prefill busy.
        for j, delay in enumerate(cancels):
            th = busy()
            rid = _rid(f"x{j}")
            outcome, secs = cancelled_stream(dep.url, rid, long_[(2 * k + 1) % len(long_)], delay)
            outcomes[rid] = {"after_s": delay, "client": outcome, "closed_at_s": secs}
            sent.append((rid, "cancelled"))
            th.join(timeout=300)
        # Requests aborted through SGLang's own API on the prefill.
        for j, delay in enumerate(aborts):
            th = busy()
            rid = _rid(f"a{j}")
            gen = threading.Thread(target=_generate, args=(dep.url, rid, long_[(2 * k + 1) % len(long_)],
                                                           max_new_tokens, outcomes, rid), daemon=True)
            gen.start()
            status = _abort_via_api(dep.prefill_url, rid, delay)
            gen.join(timeout=300)
            outcomes[rid] = dict(outcomes.get(rid) or {}, after_s=delay, abort_http=status)
            sent.append((rid, "aborted"))
            th.join(timeout=300)
        res["client"] = outcomes

        # Spans: every request's root and room span, bounded.
        end = time.monotonic() + span_deadline_s
        while True:
            spans = rec.spans()
            rows = [judge(spans, rid, kind) for rid, kind in sent]
            missing = [r for r in rows if r["room_span"] is None or r["root"] is None]
            if not missing or time.monotonic() > end:
                break
            time.sleep(2)
        time.sleep(2)  # late parents (a scheduler thread span ends with the request)
        spans = rec.spans()
        rows = [judge(spans, rid, kind) for rid, kind in sent]
        for r in rows:
            if r["kind"] != "completed":
                o = outcomes.get(r["rid"], {})
                r.update({"after_s": o.get("after_s"), "client": o.get("client") or f"abort HTTP {o.get('abort_http')}"})
        res["rows"] = rows
        res["rooms_without_root"] = _orphans(spans)
        res["spans"] = {"total": len(spans), "by_service": {}}
        for s in spans:
            res["spans"]["by_service"][s["service"]] = res["spans"]["by_service"].get(s["service"], 0) + 1
        done = [r for r in rows if r["kind"] == "completed"]
        ended = [r for r in rows if r["kind"] != "completed"]
        failed_rooms = [r for r in ended if r["room_status"] == "Failed"]
        shown = [r for r in failed_rooms if r["ok"] and r["parent_in_sglang_trace"]]
        res["completed_ok"] = sum(1 for r in done if r["ok"] and r["parent_in_sglang_trace"])
        res["completed"] = len(done)
        for kind in ("cancelled", "aborted"):
            rs = [r for r in ended if r["kind"] == kind]
            res[kind] = {"requests": len(rs), "root_exported": sum(1 for r in rs if r["root"]),
                         "room_failed": sum(1 for r in rs if r["room_status"] == "Failed"),
                         "reason_shown": sum(1 for r in shown if r["kind"] == kind)}
        res["client_cancel_failed_room"] = res["cancelled"]["room_failed"] > 0
        example = next((r for r in done if r["ok"]), None)
        if example:
            res["example_tree"] = {"rid": example["rid"], "trace_id": example["trace_id"],
                                   "lines": tree(spans, example["trace_id"])}
        ab = next(iter(shown), None)
        if ab:
            res["aborted_tree"] = {"rid": ab["rid"], "kind": ab["kind"], "trace_id": ab["trace_id"],
                                   "lines": tree(spans, ab["trace_id"])}
        if res["completed_ok"] != res["completed"]:
            res["errors"].append(f"{res['completed'] - res['completed_ok']} of {res['completed']} completed requests "
                                 f"lack a Success room span under SGLang's trace")
        if not failed_rooms:
            res["errors"].append("no cancelled or aborted request's room failed")
        elif len(shown) != len(failed_rooms):
            res["errors"].append(f"{len(failed_rooms) - len(shown)} failed room spans do not carry their reason "
                                 f"under SGLang's trace")
        if not res["client_cancel_failed_room"]:
            res["notes"] = [f"no client-closed stream failed its prefill room (roots exported: "
                            f"{res['cancelled']['root_exported']}/{res['cancelled']['requests']}; rooms without an "
                            f"exported root: {[(o['room'], o['status']) for o in res['rooms_without_root']]})"]
        res["ok"] = not res["errors"]
    except Exception as e:  # noqa: BLE001
        res["errors"].append(f"{type(e).__name__}: {str(e)[:3000]}")
    finally:
        if dep is not None:
            try:
                res["deployment"] = dep.describe()
            except Exception:  # noqa: BLE001
                pass
            dep.stop()
        if rec is not None:
            res["receiver_exit"] = rec.stop()
        res["seconds"] = round(time.monotonic() - t0, 1)
        with open(os.path.join(run_dir, "tracing.json"), "w") as f:
            json.dump(res, f, indent=1, sort_keys=True, default=str)
    return res


def table(res):
    lines = [f"SGLang {res['version']}: kvxfer room spans in SGLang's request traces ({res['run_dir']})", "",
             "| request | kind | bootstrap_room | trace id (low 64 bits) | room span | reason (error.type) | parent (SGLang span) | ok |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res.get("rows", []):
        kind = r["kind"] + (f" ({r.get('client')}, {r.get('after_s')} s)" if r["kind"] != "completed" else "")
        parent = (r["parent"] or "-")[:40]
        lines.append(f"| {r['rid'][:20]} | {kind} | {r['room'] if r['room'] is not None else '-'} | "
                     f"{(r['trace_id'] or '-')[-16:]} | {r['room_status'] or '-'} | {r['error_type'] or '-'} | "
                     f"{parent} | {'yes' if r['ok'] and r['parent_in_sglang_trace'] else 'NO: ' + str(r['why'])} |")
    for key, title in (("example_tree", "One completed request's trace"), ("aborted_tree", "One failed room's trace")):
        t = res.get(key)
        if t:
            lines += ["", f"{title} ({t['rid']}, trace {t['trace_id']}):", *("    " + ln for ln in t["lines"])]
    if res.get("rooms_without_root"):
        lines += ["", "Room spans in a trace without an exported SGLang root:",
                  *(f"    room {o['room']} {o['status']} {o.get('error_type') or ''} parent {o['parent']}"
                    for o in res["rooms_without_root"])]
    lines += ["", f"completed with a Success room under SGLang's trace: {res.get('completed_ok')}/{res.get('completed')}; "
                  f"cancelled {res.get('cancelled')}; aborted {res.get('aborted')}; spans {res.get('spans', {}).get('by_service')}"]
    for n in res.get("notes", []):
        lines.append(f"note: {n}")
    if res["errors"]:
        lines += ["", "FAILED:", *("  " + e for e in res["errors"])]
    else:
        lines += ["", f"passed in {res['seconds']} s"]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default="0.5.23", choices=cluster.VERSIONS)
    ap.add_argument("--run-dir")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--cancels", default="0.15,0.4,0.8", help="seconds after sending at which streams are closed")
    ap.add_argument("--aborts", default="0.3,0.8", help="seconds after sending at which /abort_request is posted")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--span-deadline", type=float, default=SPAN_DEADLINE_S)
    a = ap.parse_args(argv)
    res = check(a.version, a.run_dir, requests=a.requests, max_new_tokens=a.max_new_tokens,
                cancels=tuple(float(x) for x in a.cancels.split(",") if x),
                aborts=tuple(float(x) for x in a.aborts.split(",") if x), span_deadline_s=a.span_deadline)
    print(table(res), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
