"""The `sglang.srt.plugins` entry point: kvxfer takes over SGLang's NIXL prefill side.

SGLang runs `register()` in every process (load_plugins). It installs the
allocation hooks (kvxfer.sglang_alloc: a kvxfer prefill's host pools in shared
memory kvxferd can map) and REPLACEs
sglang.srt.disaggregation.nixl.conn.NixlKVManager and NixlKVSender with
dispatchers: a PREFILL-mode manager is kvxfer's (one kvxferd per rank),
anything else — DECODE mode, attention CP, the staging buffer, KVXFER_DISABLE=1
— is SGLang's own class, constructed unchanged. Receiver and bootstrap server
stay SGLang's: kvxferd registers each rank with SGLang's bootstrap server.
"""

import logging
import os

from . import sglang_alloc

log = logging.getLogger("kvxfer")

SUPPORTED = ("0.5.18", "0.5.23")  # inclusive
TARGET = "sglang.srt.disaggregation.nixl.conn"


def _vtuple(v):
    out = []
    for p in v.split(".")[:3]:
        n = "".join(ch for ch in p if ch.isdigit())
        out.append(int(n) if n else 0)
    return tuple(out)


def sglang_version():
    from importlib.metadata import version

    return version("sglang")


def supported(v):
    return _vtuple(SUPPORTED[0]) <= _vtuple(v) <= _vtuple(SUPPORTED[1])


def unsupported_message(v):
    return (f"kvxfer supports SGLang {SUPPORTED[0]} to {SUPPORTED[1]}; this is SGLang {v}. "
            f"Install a supported SGLang, or uninstall kvxfer (or set SGLANG_PLUGINS to exclude it)")


def _is_prefill(mode):
    return str(getattr(mode, "value", mode)).lower() == "prefill"


def _handled(args, kwargs):
    mode = args[1] if len(args) > 1 else kwargs.get("disaggregation_mode")
    sa = args[2] if len(args) > 2 else kwargs.get("server_args")
    ok = sglang_alloc.takes_prefill(mode, sa)
    if not ok and _is_prefill(mode) and os.environ.get("KVXFER_DISABLE") != "1":
        log.warning("kvxfer: attention context parallelism and SGLANG_DISAGG_STAGING_BUFFER are not "
                    "handled; SGLang's own NIXL prefill runs")
    return ok


def make_classes(orig_manager, orig_sender, version):
    """Dispatchers subclassing SGLang's classes (so class attributes read off
    get_kv_class's answer are SGLang's) whose __new__ picks the implementation."""
    ok = supported(version)

    class KvxferNixlKVManager(orig_manager):
        kvxfer_original = orig_manager

        def __new__(cls, *args, **kwargs):
            if _handled(args, kwargs):
                if not ok:
                    raise RuntimeError(unsupported_message(version))
                from .sglang_prefill import KvxferPrefillManager

                return KvxferPrefillManager(*args, **kwargs)
            return orig_manager(*args, **kwargs)

    class KvxferNixlKVSender(orig_sender):
        kvxfer_original = orig_sender

        def __new__(cls, *args, **kwargs):
            mgr = args[0] if args else kwargs.get("mgr")
            from .sglang_prefill import KvxferPrefillManager

            if isinstance(mgr, KvxferPrefillManager):
                from .sglang_prefill import KvxferPrefillSender

                return KvxferPrefillSender(*args, **kwargs)
            return orig_sender(*args, **kwargs)

    return KvxferNixlKVManager, KvxferNixlKVSender


def register():
    """Entry point (zero-arg): register the REPLACE hooks."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    version = sglang_version()
    if not supported(version):
        # load_plugins only logs a plug-in's exception: the prefill manager raises too.
        log.error(unsupported_message(version))
    import importlib

    conn = importlib.import_module(TARGET)
    orig_m = getattr(conn.NixlKVManager, "kvxfer_original", conn.NixlKVManager)
    orig_s = getattr(conn.NixlKVSender, "kvxfer_original", conn.NixlKVSender)
    mgr_cls, sender_cls = make_classes(orig_m, orig_s, version)
    HookRegistry.register(f"{TARGET}.NixlKVManager", mgr_cls, HookType.REPLACE)
    HookRegistry.register(f"{TARGET}.NixlKVSender", sender_cls, HookType.REPLACE)
    try:
        hooked = sglang_alloc.register(HookRegistry, HookType.AROUND)
        log.info("kvxfer: host pools of a kvxfer prefill allocated in shared memory (hooks: %d)", len(hooked))
    except Exception as e:  # noqa: BLE001 - the manager then names the buffer it cannot reach
        log.error("kvxfer: SGLang %s: the pool allocation hooks could not be installed (%s); "
                  "a kvxfer prefill will refuse its host buffers at start-up", version, e)
    log.info("kvxfer: SGLang %s NIXL prefill manager and sender replaced (kvxferd per rank)", version)
    if not supported(version):
        raise RuntimeError(unsupported_message(version))
