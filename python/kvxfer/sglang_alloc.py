"""The plug-in's allocation hooks: SGLang's own pool constructors, run under
kvxfer.sharedmem's SharedAllocation when this process's prefill is kvxfer's.

Hooked (HookType.AROUND, through SGLang's HookRegistry like the classes):
- `Scheduler.__init__`: remembers the process's ServerArgs, which decide
  whether kvxfer takes the prefill (`takes_prefill`);
- `MetadataBuffers.__init__`: the aux buffers, host memory on every server;
- every `_create_buffers` defined in `mem_cache/memory_pool.py` (the KV pools)
  and `MambaPool.__init__` (the state pool): only their host tensors move,
  so a GPU pool is unchanged (it goes by CUDA IPC).
A server without kvxfer, a decode server, or a prefill kvxfer does not take
(KVXFER_DISABLE=1, another transfer backend, attention CP, staging) allocates
exactly as before.
"""

import logging
import os
import threading

log = logging.getLogger("kvxfer")

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler.__init__"
METADATA = "sglang.srt.disaggregation.utils.MetadataBuffers.__init__"
POOLS = "sglang.srt.mem_cache.memory_pool"
STATE_POOLS = ("MambaPool",)

_state = threading.local()
_server_args = [None]


def takes_prefill(mode, sa):
    """Whether kvxfer's manager serves a rank of this mode and ServerArgs."""
    if str(getattr(mode, "value", mode)).lower() != "prefill" or os.environ.get("KVXFER_DISABLE") == "1":
        return False
    if sa is not None and int(getattr(sa, "attn_cp_size", 1) or 1) > 1:
        return False
    try:
        from sglang.srt.environ import envs

        if envs.SGLANG_DISAGG_STAGING_BUFFER.get():
            return False
    except Exception:  # noqa: BLE001 - older releases have no staging buffer
        pass
    return True


def _active():
    sa = _server_args[0]
    if sa is None:
        return False
    backend = str(getattr(sa, "disaggregation_transfer_backend", "") or "").lower()
    return backend == "nixl" and takes_prefill(getattr(sa, "disaggregation_mode", None), sa)


def _scheduler_init(original, self, *args, **kwargs):
    sa = args[0] if args else kwargs.get("server_args")
    _server_args[0] = sa
    return original(self, *args, **kwargs)


def shared_scope(name):
    """An AROUND hook running the constructor under SharedAllocation(name)
    when this process's prefill is kvxfer's (not nested)."""

    def hook(original, *args, **kwargs):
        if not _active() or getattr(_state, "depth", 0):
            return original(*args, **kwargs)
        import torch

        from . import sharedmem

        mode_cls = getattr(_state, "mode_cls", None)
        if mode_cls is None:
            mode_cls = _state.mode_cls = sharedmem.make_mode(torch)
        _state.depth = 1
        mode = mode_cls(name)
        try:
            with mode:
                return original(*args, **kwargs)
        finally:
            _state.depth = 0
            if mode.count:
                log.info("kvxfer: %d %s buffers of %s allocated in shared memory (memfd)",
                         mode.count, name, type(args[0]).__name__ if args else "?")

    hook.__name__ = f"kvxfer_shared_{name}"
    return hook


def targets():
    """(target, hook) pairs for the installed release: found in its modules,
    so a pool class a release adds is covered when it defines _create_buffers."""
    import importlib

    out = [(SCHEDULER, _scheduler_init), (METADATA, shared_scope("kvxfer-aux"))]
    pools = importlib.import_module(POOLS)
    kv = shared_scope("kvxfer-kv")
    for name in sorted(dir(pools)):
        cls = getattr(pools, name)
        if isinstance(cls, type) and cls.__module__ == POOLS and "_create_buffers" in vars(cls):
            out.append((f"{POOLS}.{name}._create_buffers", kv))
    for name in STATE_POOLS:
        if isinstance(getattr(pools, name, None), type):
            out.append((f"{POOLS}.{name}.__init__", shared_scope("kvxfer-state")))
    return out


def register(registry, hook_type):
    """Register every allocation hook; returns the targets."""
    out = targets()
    for target, hook in out:
        registry.register(target, hook, hook_type)
    return [t for t, _ in out]
