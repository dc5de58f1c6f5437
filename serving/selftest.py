"""Quick checks of the harness pieces that need no server (seconds, not minutes).

    /opt/kvxfer-serving/<version>/bin/python serving/selftest.py [--version 0.5.23]

- the sgl_kernel stand-in: pure-torch semantics of copy_all_layer_kv_cache_cpu
  and assign_req_to_token_pool_cpu against straightforward references (on
  random cases), the speculative names raise NotImplementedError, any other
  name ImportError, no torch.ops.sgl_kernel op registered;
- the cpu_dram plug-in: the wheel builds byte-identical twice; installed into
  the venv, SGLang's load_plugins() makes _normalize_kv_mem_kinds answer DRAM
  under SGLANG_USE_CPU_ENGINE=1 (keeping its validation) and VRAM without;
- the model: two builds are byte-identical; the prompts are deterministic.
Exit status 0 when all pass.
"""

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster  # noqa: E402

STANDIN_CHECK = r"""
import torch, random, sys
import sgl_kernel as sk
assert sk.__file__.startswith(sys.argv[1]), sk.__file__
g = torch.Generator().manual_seed(0)
rnd = random.Random(0)
# assign_req_to_token_pool_cpu vs a reference
for _ in range(50):
    R, L = rnd.randint(1, 6), rnd.randint(4, 40)
    r2t = torch.randint(0, 1000, (R, L), generator=g, dtype=torch.int32)
    ref = r2t.clone()
    bs = rnd.randint(1, R)
    idx = rnd.sample(range(R), bs)
    starts, ends, locs = [], [], []
    for r in idx:
        s = rnd.randint(0, L); e = rnd.randint(s, L)
        starts.append(s); ends.append(e)
        run = [rnd.randint(0, 5000) for _ in range(e - s)]
        locs += run
        ref[r, s:e] = torch.tensor(run, dtype=torch.int32)
    sk.assign_req_to_token_pool_cpu(torch.tensor(idx), r2t, torch.tensor(starts), torch.tensor(ends),
                                    torch.tensor(locs, dtype=torch.int64), L)
    assert torch.equal(r2t, ref)
# copy_all_layer_kv_cache_cpu vs a reference (rows, in-place safe)
for _ in range(50):
    rows, width = rnd.randint(2, 30), rnd.choice([8, 16, 64])
    bufs = [torch.randn(rows, width, generator=g).to(torch.bfloat16) for _ in range(rnd.randint(1, 4))]
    n = rnd.randint(0, rows)
    src = torch.tensor(rnd.sample(range(rows), n), dtype=torch.int64)
    tgt = torch.tensor(rnd.sample(range(rows), n), dtype=torch.int64)
    refs = []
    for b in bufs:
        r = b.clone(); r[tgt] = b[src].clone(); refs.append(r)
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    sk.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    assert all(torch.equal(b, r) for b, r in zip(bufs, refs))
for name in sk.SPECULATIVE:
    try:
        getattr(sk, name)()
        raise AssertionError(name)
    except NotImplementedError:
        pass
try:
    from sgl_kernel import fused_add_rmsnorm  # noqa: F401
    raise AssertionError("fused_add_rmsnorm importable")
except ImportError as e:
    assert "stand-in" in str(e) or "sgl_kernel" in str(e)
try:
    import sgl_kernel.flash_attn  # noqa: F401
    raise AssertionError("submodule importable")
except ModuleNotFoundError:
    pass
assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
print("standin ok")
"""

PLUGIN_CHECK = r"""
import logging, os
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.disaggregation.nixl import conn
want = "DRAM" if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1" else "VRAM"
assert conn._normalize_kv_mem_kinds(None, 3) == [want] * 3, conn._normalize_kv_mem_kinds(None, 3)
assert conn._normalize_kv_mem_kinds(["VRAM", "VRAM"], 2) == [want] * 2
assert conn._unpack_kv_mem_kinds(b"VRAM,VRAM", 2) == [want] * 2
try:
    conn._normalize_kv_mem_kinds(["VRAM"], 2)
    raise AssertionError("length check lost")
except ValueError:
    pass
print("plugin ok", want)
"""


def run(py, code, env, *args):
    r = subprocess.run([py, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)
    tail = (r.stdout + r.stderr).strip().splitlines()[-5:]
    return r.returncode == 0, "\n".join(tail)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", default="0.5.23", choices=cluster.VERSIONS)
    a = ap.parse_args()
    py = cluster.venv_python(a.version)
    results = []

    env = cluster.server_env({})
    results.append(("sgl_kernel stand-in", *run(py, STANDIN_CHECK, env, cluster.STANDINS)))

    sys.path.insert(0, cluster.PLUGIN_DIR)
    import build_wheel

    with tempfile.TemporaryDirectory() as t1, tempfile.TemporaryDirectory() as t2:
        w1, w2 = build_wheel.build(t1), build_wheel.build(t2)
        same = open(w1, "rb").read() == open(w2, "rb").read()
    results.append(("plug-in wheel reproducible", same, os.path.basename(w1)))

    cluster.ensure_cpu_dram_plugin(a.version)
    results.append(("plug-in: CPU engine -> DRAM", *run(py, PLUGIN_CHECK, cluster.server_env({}))))
    results.append(("plug-in: no CPU engine -> VRAM", *run(py, PLUGIN_CHECK, cluster.server_env({"SGLANG_USE_CPU_ENGINE": None}))))

    with tempfile.TemporaryDirectory() as t:
        digests = []
        for i in range(2):
            d = os.path.join(t, f"m{i}")
            r = subprocess.run([py, os.path.join(HERE, "model.py"), d, "--digests"], capture_output=True, text=True,
                               timeout=600, env=cluster._clean_env())
            digests.append(r.stdout.split("\n", 1)[1] if r.returncode == 0 else f"rc {r.returncode}: {r.stderr[-500:]}")
        results.append(("model byte-identical", digests[0] == digests[1] and "model.safetensors" in digests[0], digests[0][-300:]))

    import prompts

    results.append(("prompts deterministic", prompts.prompts() == prompts.prompts() and prompts.count() >= 50, f"{prompts.count()} prompts"))

    ok = True
    for name, passed, detail in results:
        ok &= bool(passed)
        print(f"{'PASS' if passed else 'FAIL'}  {name}" + ("" if passed else f"\n      {detail}"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
