"""Client aborts through SGLang's router: many streamed requests, a share of
them closed by the client at random moments.

Each request is a streamed `/generate` (greedy). A cancelled one closes its
TCP connection (one connection per request, force_close) at one of four
moments: before the request is sent in full ("send"), at a random time while
no token has arrived yet ("prefill": the prefill, the KV transfer or the
decode's first step), right after the first token ("first"), or after a
random number of tokens ("decode"). Every wait has a deadline.
"""

import asyncio
import json
import random
import time

PHASES = ("send", "prefill", "first", "decode")


async def _one(session_factory, url, ids, max_new, plan, deadline_s):
    """One request: (outcome, detail). outcome is ok / cancelled / error."""
    import aiohttp

    phase, delay, after_tokens = plan
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": max_new,
                                                  "ignore_eos": True},
            "stream": True}
    t0 = time.monotonic()
    async with session_factory() as s:
        if phase == "send":
            # Connect and send part of the request, then close.
            try:
                task = asyncio.ensure_future(s.post(url + "/generate", json=body))
                await asyncio.sleep(delay)
                task.cancel()
                try:
                    resp = await task
                    resp.close()
                except (asyncio.CancelledError, aiohttp.ClientError):
                    pass
            except aiohttp.ClientError as e:
                return "error", f"send: {e}"
            return "cancelled", phase
        try:
            resp = await asyncio.wait_for(s.post(url + "/generate", json=body), deadline_s)
        except asyncio.TimeoutError:
            return "error", "no response headers before the deadline"
        except aiohttp.ClientError as e:
            return "error", f"connect: {e}"
        tokens, last = 0, None
        cancel_at = None
        if phase == "prefill":
            cancel_at = t0 + delay
        try:
            while True:
                left = deadline_s - (time.monotonic() - t0)
                if cancel_at is not None:
                    left = min(left, cancel_at - time.monotonic())
                if left <= 0:
                    if cancel_at is not None and tokens == 0:
                        resp.close()
                        return "cancelled", phase
                    resp.close()
                    return "error", f"deadline after {tokens} tokens"
                try:
                    line = await asyncio.wait_for(resp.content.readline(), left)
                except asyncio.TimeoutError:
                    continue
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                msg = json.loads(payload)
                if "error" in msg:
                    return "error", str(msg["error"])[:200]
                last = msg
                tokens = len(msg.get("output_ids") or []) or tokens + 1
                if phase == "prefill" and tokens > 0:
                    # The first token came before the chosen moment: cancel now.
                    resp.close()
                    return "cancelled", "first"
                if phase == "first" and tokens >= 1 or phase == "decode" and tokens >= after_tokens:
                    resp.close()
                    return "cancelled", phase
        except aiohttp.ClientError as e:
            return "error", f"stream: {e}"
        if resp.status != 200:
            return "error", f"HTTP {resp.status}"
        if last is None:
            return "error", "no tokens"
        fin = (last.get("meta_info") or {}).get("finish_reason") or {}
        if isinstance(fin, dict) and fin.get("type") == "abort":
            return "error", f"aborted by the server: {fin.get('message')}"
        return "ok", list(last.get("output_ids") or [])


def plans(n, cancel_frac, max_new, seed, prefill_window_s=2.0):
    """The storm's schedule: per request (phase or None, delay, tokens)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() >= cancel_frac:
            out.append((None, 0, 0))
            continue
        phase = rng.choice(PHASES)
        out.append((phase, rng.uniform(0, 0.02) if phase == "send" else rng.uniform(0, prefill_window_s),
                    rng.randint(2, max(2, max_new - 1))))
    return out


async def run_storm(url, prompts, n=500, concurrency=16, cancel_frac=0.35, max_new=16, seed=7,
                    deadline_s=300.0, progress=None):
    """Run the storm; returns a summary dict and the per-request results."""
    import aiohttp

    def session():
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                     timeout=aiohttp.ClientTimeout(total=deadline_s + 30))

    sched = plans(n, cancel_frac, max_new, seed)
    sem = asyncio.Semaphore(concurrency)
    results = [None] * n
    done = [0]
    t0 = time.monotonic()

    async def worker(i):
        async with sem:
            ids = prompts[i % len(prompts)]
            results[i] = (sched[i][0],) + await _one(session, url, ids, max_new, sched[i], deadline_s)
            done[0] += 1
            if progress and done[0] % 50 == 0:
                progress(f"storm: {done[0]}/{n} requests, {time.monotonic() - t0:.0f} s")

    await asyncio.gather(*(worker(i) for i in range(n)))
    summary = {"requests": n, "planned_cancel": sum(1 for p in sched if p[0]),
               "cancelled": sum(1 for r in results if r[1] == "cancelled"),
               "ok": sum(1 for r in results if r[1] == "ok"),
               "errors": sum(1 for r in results if r[1] == "error"),
               "by_phase": {ph: sum(1 for r in results if r[1] == "cancelled" and r[2] == ph) for ph in PHASES},
               "error_kinds": {}, "seconds": round(time.monotonic() - t0, 1)}
    for r in results:
        if r[1] == "error":
            k = str(r[2])[:80]
            summary["error_kinds"][k] = summary["error_kinds"].get(k, 0) + 1
    return summary, results
