"""SGLang's request trace context for kvxfer's prefill rooms.

With SGLang's tracing on (`--enable-trace --otlp-traces-endpoint HOST:PORT`),
each request carries a `TraceReqContext` (or `TraceReqContextAsync` with
SGLANG_TRACE_ASYNC=1) in `req.time_stats.trace_ctx`: the tokenizer manager
starts the request's root span ("prefill Req <rid>"), and the scheduler's copy
(rebuilt in `SchedulerReqTimeStats.new_from_obj`) opens the rank's thread span
("Prefill Scheduler [TP n] ...") under it. The sender only gets
`(mgr, bootstrap_addr, bootstrap_room, ...)`, so the plug-in wraps
`PrefillBootstrapQueue.create_sender(req, num_kv_heads)`, the one place that
constructs senders (disaggregation/prefill.py, 0.5.18 and 0.5.23), with an
AROUND hook that keeps `req` in a thread-local while the sender is built. The
sender then opens its kvxferd room with the W3C traceparent of that request's
scheduler thread span (else its root span), and kvxferd makes the room span
its child (docs/observability.md, "Tracing with SGLang").

kvxferd exports with the standard OTEL_* environment; `otel_env` fills it from
SGLang's own flags when the operator has not set an endpoint, with the
protocol SGLang's exporter uses (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, default
grpc).

Nothing here imports SGLang at module level; everything is a no-op when SGLang
tracing is off, and no failure here stops a room from opening.
"""

import logging
import threading

log = logging.getLogger("kvxfer")

CREATE_SENDER = "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.create_sender"

_local = threading.local()
_installed = [False]  # registered (by register or install)
_applied = [None]  # install's answer once tried
_lock = threading.Lock()


# -- server args --------------------------------------------------------------


def _flag(sa, name, default=None):
    v = getattr(sa, name, None) if sa is not None else None
    if v is None:
        try:  # 0.5.23 keeps the flags in the "observability" namespace too
            from sglang.srt.runtime_context import get_observability

            v = getattr(get_observability(), name, None)
        except Exception:  # noqa: BLE001
            v = None
    return default if v is None else v


def tracing_on(sa):
    """Whether SGLang's request tracing is on for this server."""
    return bool(_flag(sa, "enable_trace", False))


def sglang_protocol(env):
    """The OTLP protocol SGLang's exporter uses (observability/trace.py
    get_otlp_span_exporter): OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, default grpc."""
    return (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or "grpc").strip()


def otel_env(sa, env):
    """Fill kvxferd's OTEL_* from SGLang's --otlp-traces-endpoint when SGLang
    tracing is on and no OTLP endpoint is set; returns env (changed in place).

    SGLang exports to the endpoint as given: gRPC (insecure) to `host:port`,
    or HTTP/protobuf to the full URL. kvxferd reads
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as a URL (http:// means no TLS) and
    defaults to http/protobuf, so the protocol is set too."""
    if not tracing_on(sa):
        return env
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return env  # the operator's choice
    endpoint = str(_flag(sa, "otlp_traces_endpoint", "") or "").strip()
    if not endpoint:
        return env
    proto = sglang_protocol(env)
    if "://" not in endpoint:
        endpoint = "http://" + endpoint
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
    env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = proto
    return env


# -- the request's context ----------------------------------------------------


def _format(span_context):
    """W3C traceparent of an OpenTelemetry SpanContext, None if invalid."""
    try:
        tid, sid = int(span_context.trace_id), int(span_context.span_id)
        flags = int(span_context.trace_flags)
    except Exception:  # noqa: BLE001
        return None
    if not tid or not sid:
        return None
    return f"00-{tid:032x}-{sid:016x}-{flags & 0xFF:02x}"


def traceparent_of(trace_ctx):
    """The traceparent a room of this request should be the child of: the
    scheduler's thread span (this rank's part of the request), else the
    request's root span. None when the request is not traced."""
    if trace_ctx is None or not getattr(trace_ctx, "tracing_enable", False):
        return None
    try:
        tc = getattr(trace_ctx, "thread_context", None)
        span = getattr(tc, "thread_span", None) if tc is not None else None
        if span is not None and span.is_recording():
            tp = _format(span.get_span_context())
            if tp:
                return tp
    except Exception:  # noqa: BLE001
        pass
    try:  # the root span's context (a deserialized copy keeps only that)
        ctx = getattr(trace_ctx, "root_span_context", None)
        if ctx is not None:
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

            carrier = {}
            TraceContextTextMapPropagator().inject(carrier, context=ctx)
            if carrier.get("traceparent"):
                return carrier["traceparent"]
    except Exception:  # noqa: BLE001
        pass
    carrier = getattr(trace_ctx, "_root_span_carrier", None)  # TraceReqContextAsync
    if isinstance(carrier, dict) and carrier.get("traceparent"):
        return str(carrier["traceparent"])
    return None


def current_traceparent(room):
    """The traceparent of the request whose sender is being built on this
    thread for `room` (inside create_sender), else None."""
    req = getattr(_local, "req", None)
    if req is None:
        return None
    try:
        if int(getattr(req, "bootstrap_room", -1)) != int(room):
            return None
        return traceparent_of(getattr(getattr(req, "time_stats", None), "trace_ctx", None))
    except Exception:  # noqa: BLE001
        return None


def _create_sender(original, self, req, *args, **kwargs):
    prev = getattr(_local, "req", None)
    _local.req = req
    try:
        return original(self, req, *args, **kwargs)
    finally:
        _local.req = prev


_create_sender.__name__ = "kvxfer_create_sender_trace_context"


def register(registry, hook_type):
    """Register the create_sender hook (for a plug-in entry point, before
    SGLang applies the hooks). Returns the target."""
    with _lock:
        if not _installed[0]:
            registry.register(CREATE_SENDER, _create_sender, hook_type)
            _installed[0] = True
    return CREATE_SENDER


def install():
    """Register and apply the hook now, from a manager built after SGLang
    applied the plug-ins' hooks (the scheduler's constructor): the method is
    looked up on the class at each call, so the live bootstrap queue sees it.
    True when the hook is in place."""
    with _lock:
        if _applied[0] is not None:
            return _applied[0]
        if _installed[0]:  # registered by the entry point: SGLang applied it
            _applied[0] = True
            return True
        _installed[0] = True
        _applied[0] = False
        try:
            import pkgutil

            from sglang.srt.plugins.hook_registry import HookRegistry, HookType

            before = pkgutil.resolve_name(CREATE_SENDER)
            HookRegistry.register(CREATE_SENDER, _create_sender, HookType.AROUND)
            HookRegistry.apply_hooks()  # applies only the targets not patched yet
            if pkgutil.resolve_name(CREATE_SENDER) is before:
                raise RuntimeError("HookRegistry did not apply it")
        except Exception as e:  # noqa: BLE001
            log.warning("kvxfer: SGLang's trace context will not reach kvxferd (%s hook: %s)", CREATE_SENDER, e)
            return False
        _applied[0] = True
    log.info("kvxfer: SGLang tracing on: rooms open under the request's trace (hook on %s)", CREATE_SENDER)
    return True


__all__ = ["CREATE_SENDER", "current_traceparent", "install", "otel_env", "register", "traceparent_of",
           "tracing_on"]
