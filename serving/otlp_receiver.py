"""A small OTLP trace receiver for the real-serving suite: gRPC and
HTTP/protobuf, spans to a JSONL file.

SGLang's exporter (observability/trace.py) speaks OTLP/gRPC by default
(`--otlp-traces-endpoint host:port`, insecure) or OTLP/HTTP protobuf with
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf; kvxferd speaks either
(telemetry.Setup). This receiver listens on both:

    python serving/otlp_receiver.py --out spans.jsonl --ready ready.json \
        [--grpc 127.0.0.1:0] [--http 127.0.0.1:0] [--max-seconds 1800] [--max-spans 200000]

`--ready` is written (atomically) once both listeners are up:
{"grpc": PORT, "http": PORT, "pid": PID}. One JSON object per span:
trace_id, span_id, parent_span_id (hex, "" for a root), name, kind, service
(the resource's service.name), resource, attributes, status {code, message}
(code: 0 unset, 1 ok, 2 error), start_ns, end_ns, events [{name, time_ns,
attributes}], links [{trace_id, span_id}], via ("grpc" or "http").

Bounded: it exits by itself after --max-seconds, stops writing after
--max-spans (and counts what it dropped in --ready's "dropped" when it
exits), refuses HTTP bodies over 32 MiB, and exits on SIGTERM/SIGINT.
Needs grpcio and opentelemetry-proto (the serving venv with SGLang's tracing
packages: serving/tracing.py installs them). `load(path)` reads the file back
with the standard library only.
"""

import argparse
import gzip
import json
import os
import signal
import sys
import threading
import time
import zlib

MAX_BODY = 32 << 20


def load(path):
    """The spans written so far (a partly written last line is skipped)."""
    out = []
    try:
        with open(path, "rb") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return out


def _value(v):
    """An OTLP AnyValue as plain JSON."""
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which)


def _attrs(kvs):
    return {kv.key: _value(kv.value) for kv in kvs}


def spans_of(request, via):
    """ExportTraceServiceRequest -> span dicts."""
    out = []
    for rs in request.resource_spans:
        res = _attrs(rs.resource.attributes)
        service = res.get("service.name", "")
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.append({
                    "trace_id": sp.trace_id.hex(), "span_id": sp.span_id.hex(),
                    "parent_span_id": sp.parent_span_id.hex(), "name": sp.name, "kind": int(sp.kind),
                    "service": service, "resource": res, "scope": ss.scope.name,
                    "attributes": _attrs(sp.attributes),
                    "status": {"code": int(sp.status.code), "message": sp.status.message},
                    "start_ns": int(sp.start_time_unix_nano), "end_ns": int(sp.end_time_unix_nano),
                    "events": [{"name": e.name, "time_ns": int(e.time_unix_nano), "attributes": _attrs(e.attributes)}
                               for e in sp.events],
                    "links": [{"trace_id": ln.trace_id.hex(), "span_id": ln.span_id.hex()} for ln in sp.links],
                    "via": via,
                })
    return out


class Sink:
    """The JSONL file, one writer at a time, at most max_spans lines."""

    def __init__(self, path, max_spans):
        self.f = open(path, "a", buffering=1)
        self.max_spans = max_spans
        self.written = self.dropped = self.requests = 0
        self.lock = threading.Lock()

    def put(self, spans):
        with self.lock:
            self.requests += 1
            room = max(0, self.max_spans - self.written)
            keep, drop = spans[:room], spans[room:]
            if keep:
                self.f.write("".join(json.dumps(s, sort_keys=True) + "\n" for s in keep))
                self.f.flush()
            self.written += len(keep)
            self.dropped += len(drop)

    def close(self):
        with self.lock:
            self.f.close()


def _write_json(path, obj):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _split(addr):
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def start_grpc(addr, sink):
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 - the generated name
            sink.put(spans_of(request, "grpc"))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", MAX_BODY)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port(addr)
    if not port:
        raise OSError(f"otlp_receiver: cannot listen on {addr} (gRPC)")
    server.start()
    return server, port


def start_http(addr, sink):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _reply(self, code, body=b"", ctype="application/x-protobuf"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802
            self._reply(200 if self.path == "/health" else 404, b"ok" if self.path == "/health" else b"", "text/plain")

        def do_POST(self):  # noqa: N802
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                n = -1
            if n < 0 or n > MAX_BODY:
                self.close_connection = True
                return self._reply(413, b"", "text/plain")
            body = self.rfile.read(n)
            if self.path.rstrip("/") not in ("/v1/traces", ""):
                return self._reply(404, b"", "text/plain")
            enc = (self.headers.get("Content-Encoding") or "").lower()
            try:
                if enc == "gzip":
                    body = gzip.decompress(body)
                elif enc == "deflate":
                    body = zlib.decompress(body)
                if "json" in (self.headers.get("Content-Type") or ""):
                    return self._reply(415, b"otlp_receiver: http/json is not supported", "text/plain")
                req = trace_service_pb2.ExportTraceServiceRequest()
                req.ParseFromString(body)
            except Exception as e:  # noqa: BLE001
                return self._reply(400, str(e).encode()[:200], "text/plain")
            sink.put(spans_of(req, "http"))
            self._reply(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

    host, port = _split(addr)
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="otlp-http", daemon=True).start()
    return server, server.server_address[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSONL file the spans are appended to")
    ap.add_argument("--ready", help="JSON file written once listening: ports, pid")
    ap.add_argument("--grpc", default="127.0.0.1:0", help="gRPC listen address ('' for none)")
    ap.add_argument("--http", default="127.0.0.1:0", help="HTTP listen address ('' for none)")
    ap.add_argument("--max-seconds", type=float, default=1800.0, help="exit after this long")
    ap.add_argument("--max-spans", type=int, default=200000, help="spans written at most; the rest are counted")
    a = ap.parse_args(argv)

    sink = Sink(a.out, a.max_spans)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    info = {"pid": os.getpid(), "grpc": None, "http": None}
    grpc_server = http_server = None
    if a.grpc:
        grpc_server, info["grpc"] = start_grpc(a.grpc, sink)
    if a.http:
        http_server, info["http"] = start_http(a.http, sink)
    if a.ready:
        _write_json(a.ready, info)
    print(f"otlp_receiver: listening {json.dumps(info)}, spans to {a.out}", flush=True)
    stop.wait(max(0.0, a.max_seconds))
    if grpc_server is not None:
        grpc_server.stop(grace=2).wait(5)
    if http_server is not None:
        http_server.shutdown()
        http_server.server_close()
    sink.close()
    info.update({"written": sink.written, "dropped": sink.dropped, "requests": sink.requests, "exited": True})
    if a.ready:
        _write_json(a.ready, info)
    print(f"otlp_receiver: exit {json.dumps(info)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
