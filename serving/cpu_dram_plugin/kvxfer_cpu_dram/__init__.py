"""SGLang plug-in (entry point group `sglang.srt.plugins`): NIXL KV memory is DRAM on CPU.

With SGLANG_USE_CPU_ENGINE=1 SGLang's KV pool and aux buffers are host memory,
but its NIXL connection still calls them VRAM: the prefill never sets
`kv_args.kv_data_mem_kinds`, so `_normalize_kv_mem_kinds(None, n)` answers
["VRAM"] * n, and the decode sets ["VRAM"] * n itself (disaggregation/decode.py).
UCX then refuses the registration ("VRAM memory is detected as host by UCX",
NIXL_ERR_BACKEND). This plug-in wraps
sglang.srt.disaggregation.nixl.conn._normalize_kv_mem_kinds (same name and
signature in 0.5.18 and 0.5.23) with an AROUND hook that keeps SGLang's own
validation (length, known kinds) and answers DRAM for every entry. The same
function also reads the peer's kinds out of msg[17], so both sides and the
transfer descriptors agree on DRAM.

Without SGLANG_USE_CPU_ENGINE=1 the plug-in registers nothing.
"""

import logging
import os

log = logging.getLogger("kvxfer_cpu_dram")

TARGET = "sglang.srt.disaggregation.nixl.conn._normalize_kv_mem_kinds"


def dram_kinds(original_fn, *args, **kwargs):
    checked = original_fn(*args, **kwargs)
    return ["DRAM"] * len(checked)


def enabled():
    return os.environ.get("SGLANG_USE_CPU_ENGINE") == "1"


def register():
    """Zero-argument entry point run by SGLang's load_plugins() in every process."""
    if not enabled():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, dram_kinds, HookType.AROUND)
    log.info("kvxfer_cpu_dram: NIXL KV memory kinds answer DRAM (SGLANG_USE_CPU_ENGINE=1)")
