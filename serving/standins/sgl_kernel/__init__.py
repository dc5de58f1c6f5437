"""Stand-in for `sgl_kernel` on CPU-only machines (the real-serving harness).

PyPI's `sglang-kernel` wheel is CUDA-only: importing it dies on a machine
without libcuda ("Could not load any common_ops library"); SGLang's CPU ops
come from a CPU build of sgl-kernel that PyPI does not ship. The harness puts
serving/standins first on PYTHONPATH so this package shadows the installed one.

With SGLANG_USE_CPU_ENGINE=1 (`is_cpu()`), SGLang imports a handful of names
from `sgl_kernel` at module import time. This package makes exactly those
importable (see serving/README.md for each name, who imports it and why):

  copy_all_layer_kv_cache_cpu    kernels/ops/kvcache/cache_move.py        pure torch
  assign_req_to_token_pool_cpu   srt/mem_cache/allocation.py              pure torch
  speculative decoding (EAGLE/ngram) CPU kernels       NotImplementedError when called

Any other name raises AttributeError (so `from sgl_kernel import X` raises
ImportError, which SGLang's optional-import sites already handle), naming this
stand-in. Nothing is registered under torch.ops.sgl_kernel, so SGLang's AMX
probe (`hasattr(torch.ops.sgl_kernel, "convert_weight_packed")`) answers False
and every layer takes its `forward_native` path.

KVXFER_SGL_KERNEL_TRACE=<file> appends one line per name asked for (found or
not) with the importing frame, to find what a release needs.
"""

import os
import sys

import torch

__version__ = "0.0.0+kvxfer-cpu-standin"
STANDIN = True

_TRACE = os.environ.get("KVXFER_SGL_KERNEL_TRACE")


def _trace(name, found, depth=2):
    if not _TRACE:
        return
    try:
        f = sys._getframe(depth)
        while f is not None and "importlib" in f.f_code.co_filename:
            f = f.f_back
        where = f"{f.f_code.co_filename}:{f.f_lineno}"
    except ValueError:
        where = "?"
    try:
        with open(_TRACE, "a") as out:
            out.write(f"{os.getpid()} {'ok' if found else 'MISSING'} {name} {where}\n")
    except OSError:
        pass


def _ptr_rows(ptr, nbytes_per_row, nrows):
    """A uint8 [nrows, nbytes_per_row] view of host memory at address `ptr`."""
    import ctypes

    n = int(nbytes_per_row) * int(nrows)
    buf = (ctypes.c_uint8 * n).from_address(int(ptr))
    return torch.frombuffer(buf, dtype=torch.uint8, count=n).view(int(nrows), int(nbytes_per_row))


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every KV buffer i (base address data_ptrs[i], row size strides[i]
    bytes): row[tgt_loc[j]] = row[src_loc[j]] for all j, reading every source
    row before writing (in-place safe, like SGLang's tiled Triton kernel
    copy_all_layer_kv_cache_tiled). Called by copy_all_layer_kv_cache_func
    (kernels/ops/kvcache/cache_move.py) with tgt/src already cut to num_locs;
    SGLang's pools call it from move_kv_cache and once at pool warm-up with a
    0 -> 0 copy."""
    _trace("copy_all_layer_kv_cache_cpu()", True)
    tgt = tgt_loc.to(torch.int64).cpu()
    src = src_loc.to(torch.int64).cpu()
    if tgt.numel() == 0:
        return
    if tgt.numel() != src.numel():
        raise ValueError(f"copy_all_layer_kv_cache_cpu: {tgt.numel()} targets, {src.numel()} sources")
    nrows = int(torch.maximum(tgt.max(), src.max()).item()) + 1
    ptrs = data_ptrs.cpu().tolist()
    rows = strides.cpu().tolist()
    for ptr, stride in zip(ptrs, rows):
        view = _ptr_rows(ptr, stride, nrows)
        view[tgt] = view[src]  # advanced indexing gathers a copy first


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len):
    """req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]] =
    the i-th run of out_cache_loc (runs laid end to end in request order),
    the semantics of SGLang's Triton kernel assign_req_to_token_pool
    (srt/mem_cache/allocation.py). In place on req_to_token; pool_len is its
    row length (req_to_token.shape[1])."""
    _trace("assign_req_to_token_pool_cpu()", True)
    idx = req_pool_indices.cpu().tolist()
    starts = start_offset.cpu().tolist()
    ends = end_offset.cpu().tolist()
    if req_to_token.dim() != 2 or req_to_token.shape[1] != int(pool_len):
        raise ValueError(f"assign_req_to_token_pool_cpu: req_to_token {tuple(req_to_token.shape)}, pool_len {pool_len}")
    pos = 0
    for r, s, e in zip(idx, starts, ends):
        n = int(e) - int(s)
        if n <= 0:
            continue
        req_to_token[int(r), int(s) : int(e)] = out_cache_loc[pos : pos + n].to(req_to_token.dtype)
        pos += n


def _not_implemented(name):
    def fn(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: speculative decoding has no CPU kernel in kvxfer's sgl_kernel "
            f"stand-in (serving/standins/sgl_kernel); run without --speculative-algorithm"
        )

    fn.__name__ = fn.__qualname__ = name
    return fn


# Imported at module import time by SGLang's speculative-decoding modules under
# is_cpu(); never called unless --speculative-algorithm is given.
SPECULATIVE = (
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
)
for _n in SPECULATIVE:
    globals()[_n] = _not_implemented(_n)
del _n

__all__ = ["copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu", *SPECULATIVE]


class _NoSubmodules:
    """sys.meta_path finder: `import sgl_kernel.<anything>` fails with a clear
    ModuleNotFoundError (the stand-in has no submodules)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        _trace(fullname, False, depth=3)
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: kvxfer's CPU stand-in for sgl_kernel "
            f"(serving/standins/sgl_kernel) has no submodules",
            name=fullname,
        )


if not any(isinstance(f, _NoSubmodules) or getattr(f, "__name__", "") == "_NoSubmodules" for f in sys.meta_path):
    sys.meta_path.insert(0, _NoSubmodules())


if _TRACE:
    import types

    class _TracingModule(types.ModuleType):
        def __getattribute__(self, name):
            if not (name.startswith("__") and name.endswith("__")) and not name.startswith("_"):
                d = types.ModuleType.__getattribute__(self, "__dict__")
                if name in d:
                    d["_trace"](name, True)
            return types.ModuleType.__getattribute__(self, name)

    sys.modules[__name__].__class__ = _TracingModule


def __getattr__(name):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    _trace(name, False)
    raise AttributeError(
        f"sgl_kernel.{name} is not provided by kvxfer's CPU stand-in for sgl_kernel "
        f"(serving/standins/sgl_kernel, first on PYTHONPATH): only {', '.join(__all__)}. "
        f"The real sgl-kernel wheel on PyPI is CUDA-only."
    )
