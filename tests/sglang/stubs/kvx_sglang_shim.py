"""Loads SGLang's real disaggregation code without SGLang's heavy package imports.

`import sglang` would run sglang/__init__.py, which pulls in torch, triton,
transformers and the whole serving stack. This shim registers the `sglang`
package (and a few of its modules, listed in STUBBED) in sys.modules with
their __path__ pointing into the installed wheel, so every other module —
in particular sglang.srt.disaggregation.{base,common,nixl}.conn,
sglang.srt.disaggregation.utils, sglang.srt.environ, sglang.srt.utils.network,
sglang.srt.observability.trace — is loaded from the wheel, unmodified.

What each stub replaces and why is in tests/sglang/README.md.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import os
import socket
import sys
import threading
import types

STUBBED = [
    "sglang (package __init__ only)",
    "sglang.srt.utils (package __init__ only) + sglang.srt.utils.common",
    "sglang.srt.server_args",
    "sglang.srt.runtime_context",
    "sglang.srt.distributed (package __init__) + sglang.srt.distributed.parallel_state",
    "sglang.srt.layers.dp_attention",
    "sglang.srt.configs.model_config",
    "sglang.srt.mem_cache.page_interleave",
    "logging.Logger.warning_once/info_once (added by transformers in SGLang)",
]


_SERVER_ARGS = None


def server_args():
    """The process's ServerArgs-like namespace: one decode rank (tp=pp=cp=dp=1),
    the fields SGLang's decode NIXL manager and its config bags read."""
    global _SERVER_ARGS
    if _SERVER_ARGS is None:
        _SERVER_ARGS = types.SimpleNamespace(
            host="127.0.0.1", port=30000, device="cpu",
            tp_size=1, pp_size=1, dp_size=1, attn_cp_size=1, nnodes=1, node_rank=0,
            enable_dp_attention=False, dist_init_addr=None, load_balance_method="round_robin",
            page_size=1, kv_cache_dtype="auto", chunked_prefill_size=8192, max_prefill_tokens=16384,
            disaggregation_mode="decode", disaggregation_transfer_backend="nixl",
            disaggregation_bootstrap_port=8998, disaggregation_ib_device=None,
            disaggregation_decode_allocation_policy="early",
            disaggregation_enable_kv_checksum=False,
            speculative_algorithm=None, speculative_num_draft_tokens=None,
            enable_dsa_cache_layer_split=False, enable_kv_cache_sharding=False,
            enable_cp_tp_group_sharing=False, enable_trace=False, enable_pd_role_switch=False,
        )
    return _SERVER_ARGS


_PARALLEL = None


def set_rank(tp_size=1, tp_rank=0, pp_size=1, pp_rank=0):
    """This process's place in its decode instance: what SGLang's parallel
    state would report (attention TP size and rank, PP size and rank). Call
    after install() and before creating the manager."""
    sa = server_args()
    sa.tp_size, sa.pp_size = tp_size, pp_size
    if _PARALLEL is not None:
        _PARALLEL.tp_size, _PARALLEL.tp_rank = tp_size, tp_rank
        _PARALLEL.attn_tp_size, _PARALLEL.attn_tp_rank = tp_size, tp_rank
        _PARALLEL.pp_size, _PARALLEL.pp_rank = pp_size, pp_rank


def _pkg(name, path=None):
    m = types.ModuleType(name)
    m.__path__ = [path] if path else []
    m.__package__ = name
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    if path:
        m.__spec__.submodule_search_locations = [path]
    m.__file__ = None
    sys.modules[name] = m
    return m


def _mod(name, **attrs):
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, m)
    return m


def _ns(**kw):
    return types.SimpleNamespace(**kw)


def _bool_env(name, default="false"):
    return os.getenv(name, default).lower() in ("true", "1")


def _int_env(name, default=0):
    v = os.getenv(name)
    return int(v) if v not in (None, "") else default


def _no_gpu(*_a, **_k):
    raise RuntimeError("kvxfer sglang stub: no GPU streams/events (staging buffer is off in these tests)")


class _Group:
    """A one-rank process group (pp/world/attn-tp): rank 0 of 1."""

    world_size = 1
    rank_in_group = 0
    rank = 0
    ranks = [0]
    first_rank = last_rank = 0
    is_first_rank = is_last_rank = True
    cpu_group = device_group = None

    def all_gather_object(self, obj):
        return [obj]

    def barrier(self):
        pass


_GROUP = _Group()


def _install_log_once():
    """transformers adds Logger.warning_once/info_once (lru_cache'd on the
    message) when SGLang imports it; SGLang's transfer code calls them."""
    import functools
    import logging

    if not hasattr(logging.Logger, "warning_once"):
        @functools.lru_cache(None)
        def warning_once(self, *args, **kwargs):
            self.warning(*args, **kwargs)

        logging.Logger.warning_once = warning_once
    if not hasattr(logging.Logger, "info_once"):
        @functools.lru_cache(None)
        def info_once(self, *args, **kwargs):
            self.info(*args, **kwargs)

        logging.Logger.info_once = info_once


def install():
    _install_log_once()
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed in this Python")
    root = list(spec.submodule_search_locations)[0]
    srt = os.path.join(root, "srt")

    _pkg("sglang", root)
    _pkg("sglang.srt", srt)

    # sglang.srt.utils: its __init__ star-imports common.py (torch, triton,
    # PIL, starlette...). Submodules such as utils.network load from the wheel.
    def ceil_div(x, y):
        return (x + y - 1) // y

    def run_with_deadline(fn, *, timeout_s, what):  # same contract as common.py
        result, error = [], []

        def target():
            try:
                result.append(fn())
            except BaseException as e:  # noqa: BLE001
                error.append(e)

        t = threading.Thread(target=target, daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            raise RuntimeError(f"{what} did not return within {timeout_s}s on {socket.gethostname()}")
        if error:
            raise error[0]
        return result[0]

    common = dict(
        is_hip=lambda: False,
        is_npu=lambda: False,
        is_cuda=lambda: False,
        is_xpu=lambda: False,
        is_cpu=lambda: True,
        get_bool_env_var=_bool_env,
        get_int_env_var=_int_env,
        ceil_div=ceil_div,
        ceil_align=lambda x, y: ceil_div(x, y) * y,
        run_with_deadline=run_with_deadline,
        # GPU streams/events: only the staging-buffer path (SGLANG_DISAGG_STAGING_BUFFER)
        # uses them, and it is off here.
        create_device_event=_no_gpu,
        create_device_stream=_no_gpu,
        device_stream_context=_no_gpu,
    )
    utils = _pkg("sglang.srt.utils", os.path.join(srt, "utils"))
    utils.__dict__.update(common)
    _mod("sglang.srt.utils.common", **common)

    # ServerArgs: only a name for annotations in base/conn.py; the driver
    # passes a SimpleNamespace with the attributes the managers read.
    class ServerArgs:  # noqa: D401
        pass

    _mod("sglang.srt.server_args", ServerArgs=ServerArgs)

    # runtime_context: SGLang's config bags, snapshotted from ServerArgs at
    # publish. Here every bag is a view of the one flat ServerArgs-like
    # namespace the driver builds (server_args()), and the parallel bag is a
    # single rank.
    sa = server_args()
    parallel = _ns(
        tp_size=1, tp_rank=0, pp_size=1, pp_rank=0, dp_size=1, num_dp_ranks=1,
        attn_tp_size=1, attn_tp_rank=0, attn_cp_size=1, attn_cp_rank=0,
        attn_dp_size=1, attn_dp_rank=0, dcp_size=1, dcp_rank=0, dcp_enabled=False,
        attn_dcp_size=1, attn_dcp_rank=0,
        moe_dense_tp_size=None, enable_dp_attention=False, nnodes=1, node_rank=0,
        dist_init_addr=None, load_balance_method="round_robin",
        enable_dsa_cache_layer_split=False, enable_kv_cache_sharding=False,
        enable_cp_tp_group_sharing=False, world_group=_GROUP, pp_group=_GROUP,
        tp_group=_GROUP, attn_tp_group=_GROUP, attn_cp_group=_GROUP,
    )
    global _PARALLEL
    _PARALLEL = parallel
    resources = _ns(trace_level=None)
    _mod(
        "sglang.srt.runtime_context",
        get_parallel=lambda: parallel,
        get_serving=lambda: sa,
        get_schedule=lambda: sa,
        get_device=lambda: sa,
        get_disagg=lambda: sa,
        get_spec=lambda: sa,
        get_server_args=lambda: sa,
        get_resources=lambda: resources,
        get_observability=lambda: sa,
        linear_attn_tp_size=lambda: 1,
        max_prefill_buffer_tokens=lambda: sa.chunked_prefill_size,
    )

    dist = _pkg("sglang.srt.distributed", os.path.join(srt, "distributed"))
    dist.get_pp_group = lambda: _GROUP
    dist.get_world_group = lambda: _GROUP
    dist.get_tp_group = lambda: _GROUP
    _mod("sglang.srt.distributed.parallel_state", GroupCoordinator=_Group,
         get_pp_group=dist.get_pp_group, get_world_group=dist.get_world_group)
    _pkg("sglang.srt.layers", os.path.join(srt, "layers"))
    _mod(
        "sglang.srt.layers.dp_attention",
        get_attention_tp_size=lambda: 1,
        get_attention_tp_rank=lambda: 0,
        get_attention_dp_size=lambda: 1,
        get_attention_dp_rank=lambda: 0,
        get_attention_cp_size=lambda: 1,
        get_attention_cp_rank=lambda: 0,
        is_dp_attention_enabled=lambda: False,
    )
    _pkg("sglang.srt.configs", os.path.join(srt, "configs"))
    _mod(
        "sglang.srt.configs.model_config",
        get_dsa_index_topk=lambda *a, **k: 0,
        get_dsa_mtp_topk_width=lambda *a, **k: 0,
        is_deepseek_dsa=lambda *a, **k: False,
    )
    _pkg("sglang.srt.mem_cache", os.path.join(srt, "mem_cache"))
    _mod("sglang.srt.mem_cache.page_interleave", get_kv_shard_group=lambda *a, **k: None)
    return root
