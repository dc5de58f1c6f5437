"""Start and stop real SGLang deployments on a CPU-only machine (the real-serving harness).

Two shapes, each a `Deployment` (a context manager):

  monolithic(version)  one `sglang.launch_server`                      .url
  pd(version)          prefill + decode servers (NIXL) + SGLang's
                       mini-LB router (`sglang_router.launch_router
                       --pd-disaggregation --mini-lb`)                  .url (router),
                                                                        .prefill_url, .decode_url

Every server is a real SGLang process tree, started by the release's venv
(/opt/kvxfer-serving/<version>/bin/python, KVXFER_SERVING_ROOT to move it) in
its own process group (start_new_session), logging to <run_dir>/<name>.log.
Every wait has a deadline; a server that exits while being waited on fails the
wait at once with the tail of its log. Groups are SIGTERMed, then SIGKILLed,
on stop(), at interpreter exit (atexit) and on SIGTERM/SIGINT/SIGHUP.

Per server, `extra_env` (a value of None removes the variable) and
`extra_args` let a second PD variant run on the same code: e.g. the prefill
handled by the kvxfer plug-in (pip-installed into the same venv) vs SGLang's
own NIXL prefill with KVXFER_DISABLE=1.

Clients: generate(url, ...) -> output token ids (SGLang's top-level
"output_ids" of /generate); server_info(url) -> KV slots in use and queue
lengths from /v1/loads, /metrics and /server_info.

Run by the serving venv's python (or any python 3.9+: the harness itself uses
the standard library only; the servers run in the venv).
"""

import atexit
import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # model.py, prompts.py beside this file
STANDINS = os.path.join(HERE, "standins")
PLUGIN_DIR = os.path.join(HERE, "cpu_dram_plugin")
VENV_ROOT = os.environ.get("KVXFER_SERVING_ROOT", "/opt/kvxfer-serving")
RUNS_ROOT = os.environ.get("KVXFER_SERVING_RUNS", "/tmp/kvxfer-serving-runs")
VERSIONS = ("0.5.23", "0.5.18")

START_DEADLINE_S = float(os.environ.get("KVXFER_SERVING_START_DEADLINE", "480"))
STOP_GRACE_S = 20.0
REQUEST_TIMEOUT_S = 300.0

# The CPU recipe (shared/spec/sglang-cpu-serving.md).
BASE_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",  # is_cpu(); without it --device cpu imports vllm._custom_ops
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "SGLANG_HOST_IP": "127.0.0.1",  # else get_local_ip_auto() advertises eth0
    "UCX_NET_DEVICES": "lo",
    "PYTHONUNBUFFERED": "1",
}
COMMON_ARGS = [
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--max-total-tokens", "4096",
    "--chunked-prefill-size", "64",  # long prompts take several chunks
    "--random-seed", "1234",
    "--enable-metrics",
    "--host", "127.0.0.1",
]
PREFILL_ARGS = [
    "--disaggregation-mode", "prefill",
    "--disaggregation-transfer-backend", "nixl",
    # A radix-cache prefix hit with overlap on records a torch.cuda.Event
    # (disaggregation/prefill.py): "expected stream to be a torch.Stream".
    "--disable-overlap-schedule",
]
DECODE_ARGS = [
    "--disaggregation-mode", "decode",
    "--disaggregation-transfer-backend", "nixl",
    # Otherwise the decode builds a host pool for retraction: cudaHostRegister.
    "--disaggregation-decode-retraction-backup", "cpu_tensor",
]
MONO_ARGS = []


class ServingError(RuntimeError):
    pass


class ServerDied(ServingError):
    pass


class Timeout(ServingError):
    pass


# ---------------------------------------------------------------- venvs


def venv_dir(version):
    return os.path.join(VENV_ROOT, version)


def venv_python(version):
    py = os.path.join(venv_dir(version), "bin", "python")
    if not os.path.exists(py):
        raise ServingError(f"no SGLang {version} serving venv at {venv_dir(version)} (scripts/install-serving.sh)")
    return py


def venv_ready(version, timeout=120):
    """True when the venv imports sglang, sglang_router and torch."""
    py = os.path.join(venv_dir(version), "bin", "python")
    if not os.path.exists(py):
        return False
    try:
        r = subprocess.run(
            [py, "-c", "import sglang, sglang_router, torch"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout,
            env=_clean_env(),
        )
        return r.returncode == 0
    except (subprocess.TimeoutExpired, OSError):
        return False


def _clean_env():
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return env


def _venv_run(version, code, *args, timeout=120):
    r = subprocess.run(
        [venv_python(version), "-c", code, *args],
        capture_output=True, text=True, timeout=timeout, env=_clean_env(),
    )
    return r.returncode, r.stdout, r.stderr


_PIP_LOCK = threading.Lock()


@contextlib.contextmanager
def _venv_lock(version):
    """Serialize pip runs on one venv across processes (fcntl lock file)."""
    import fcntl

    path = os.path.join(venv_dir(version), ".kvxfer-serving-pip.lock")
    with _PIP_LOCK, open(path, "w") as f:
        deadline = time.monotonic() + 600
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Timeout(f"pip lock {path} held for 600 s")
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pip_install_wheel(version, wheel, timeout=600):
    """`pip install --no-deps --no-index --force-reinstall WHEEL` into the release's venv."""
    with _venv_lock(version):
        r = subprocess.run(
            [venv_python(version), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--no-deps", "--no-index", "--force-reinstall", wheel],
            capture_output=True, text=True, timeout=timeout, env=_clean_env(),
        )
    if r.returncode != 0:
        raise ServingError(f"pip install {wheel} into {venv_dir(version)} failed:\n{r.stdout}\n{r.stderr}")


def _plugin_source_digest():
    h = hashlib.sha256()
    for name in ("pyproject.toml", os.path.join("kvxfer_cpu_dram", "__init__.py")):
        with open(os.path.join(PLUGIN_DIR, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


_CHECK_PLUGIN = r"""
import hashlib, os, sys
from importlib.metadata import distribution, PackageNotFoundError
try:
    d = distribution("kvxfer-cpu-dram")
except PackageNotFoundError:
    print("absent"); sys.exit(0)
root = os.path.join(sys.argv[1])
h = hashlib.sha256()
for name in ("pyproject.toml", os.path.join("kvxfer_cpu_dram", "__init__.py")):
    if name == "pyproject.toml":
        data = open(os.path.join(root, name), "rb").read()
    else:
        data = d.locate_file(name).read_bytes()
    h.update(name.encode() + b"\0" + data + b"\0")
eps = [e.value for e in d.entry_points if e.group == "sglang.srt.plugins"]
print(h.hexdigest() if eps == ["kvxfer_cpu_dram:register"] else "bad-entry-point")
"""

_plugin_ok = set()


def ensure_cpu_dram_plugin(version):
    """Install serving/cpu_dram_plugin into the venv unless the same code is
    already there (a wheel built with the standard library, pip --no-deps)."""
    if version in _plugin_ok:
        return
    want = _plugin_source_digest()
    rc, out, err = _venv_run(version, _CHECK_PLUGIN, PLUGIN_DIR)
    if rc != 0 or out.strip() != want:
        sys.path.insert(0, PLUGIN_DIR)
        try:
            import build_wheel  # serving/cpu_dram_plugin/build_wheel.py
        finally:
            sys.path.remove(PLUGIN_DIR)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="kvxfer-cpu-dram-") as tmp:
            pip_install_wheel(version, build_wheel.build(tmp))
        rc, out, err = _venv_run(version, _CHECK_PLUGIN, PLUGIN_DIR)
        if rc != 0 or out.strip() != want:
            raise ServingError(f"kvxfer-cpu-dram plug-in not installed in {venv_dir(version)}: {out} {err}")
    _plugin_ok.add(version)


def installed_distributions(version, names=("sglang", "sglang-router", "nixl", "torch", "transformers", "kvxfer", "kvxfer-cpu-dram")):
    code = (
        "import sys, json\nfrom importlib.metadata import version\nout={}\n"
        "for n in sys.argv[1:]:\n"
        "    try: out[n]=version(n)\n"
        "    except Exception: out[n]=None\n"
        "print(json.dumps(out))"
    )
    rc, out, err = _venv_run(version, code, *names)
    return json.loads(out) if rc == 0 else {}


# ---------------------------------------------------------------- processes

_live = set()
_live_lock = threading.RLock()  # re-entrant: the signal handler runs on the main thread
_handlers_installed = False


def _stop_all(*_):
    with _live_lock:
        procs = list(_live)
    for p in procs:
        p.stop(grace=5)


def _install_handlers():
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_stop_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        prev = signal.getsignal(sig)

        def handler(signum, frame, prev=prev):
            with _live_lock:
                n = len(_live)
            try:
                sys.stderr.write(f"kvxfer serving harness (pid {os.getpid()}): signal {signum}; stopping {n} server group(s)\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            _stop_all()
            if callable(prev):
                prev(signum, frame)
            elif prev == signal.SIG_IGN:
                return
            else:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, handler)


class Proc:
    """One child in its own process group, logging to a file."""

    def __init__(self, name, argv, env, log_path, cwd):
        self.name, self.argv, self.env, self.log_path, self.cwd = name, argv, env, log_path, cwd
        self.popen = None
        self.t_start = self.t_ready = None

    def start(self):
        _install_handlers()
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self.t_start = time.monotonic()
        with _live_lock:
            _live.add(self)
        return self

    @property
    def pid(self):
        return self.popen.pid if self.popen else None

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def returncode(self):
        return None if self.popen is None else self.popen.poll()

    def _killpg(self, sig):
        try:
            os.killpg(self.popen.pid, sig)  # the group this Popen leads (start_new_session)
        except ProcessLookupError:
            pass
        except PermissionError:
            pass

    def _group_alive(self):
        try:
            os.killpg(self.popen.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def stop(self, grace=STOP_GRACE_S):
        """SIGTERM the group, wait up to `grace` s for the leader and every
        member, then SIGKILL what is left (and wait up to 10 s more)."""
        if self.popen is None:
            return
        if self.alive() or self._group_alive():
            self._killpg(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                self.popen.poll()
                if not self._group_alive():
                    break
                time.sleep(0.2)
            if self._group_alive():
                self._killpg(signal.SIGKILL)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and self._group_alive():
                    self.popen.poll()
                    time.sleep(0.1)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        with _live_lock:
            _live.discard(self)

    def log_tail(self, n=60):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - 64 * 1024))
                lines = f.read().decode(errors="replace").splitlines()
            return "\n".join(lines[-n:])
        except OSError:
            return "(no log)"


# ---------------------------------------------------------------- HTTP


def http(method, url, body=None, timeout=30.0):
    """(status, bytes); status 0 when the connection failed."""
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError, OSError):
        return 0, b""


def http_json(method, url, body=None, timeout=30.0):
    status, data = http(method, url, body, timeout)
    if status != 200:
        raise ServingError(f"{method} {url}: HTTP {status} {data[:500]!r}")
    return json.loads(data)


def wait_http(url, deadline_s, procs=(), what=None, ok=(200,), interval=1.0):
    """Poll GET url until its status is in `ok`; fail early if a proc exits,
    fail with Timeout after deadline_s. Returns seconds waited."""
    t0 = time.monotonic()
    end = t0 + deadline_s
    last = None
    while True:
        for p in procs:
            if not p.alive():
                raise ServerDied(
                    f"{p.name} exited (rc {p.returncode()}) while waiting for {what or url}; "
                    f"log {p.log_path}:\n{p.log_tail()}"
                )
        remaining = end - time.monotonic()
        if remaining <= 0:
            tails = "\n".join(f"--- {p.name} ({p.log_path}):\n{p.log_tail(30)}" for p in procs)
            raise Timeout(f"{what or url} not ready after {deadline_s:.0f} s (last status {last})\n{tails}")
        status, _ = http("GET", url, timeout=min(30.0, max(1.0, remaining)))
        last = status
        if status in ok:
            return time.monotonic() - t0
        time.sleep(min(interval, max(0.0, end - time.monotonic())))


# ---------------------------------------------------------------- ports and dirs

_handed_out = set()


def free_port(span=1):
    """A free 127.0.0.1 TCP port p with p..p+span-1 all free, never handed out
    before by this process."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + span > 65535 or any(q in _handed_out for q in range(p, p + span)):
            continue
        ok = True
        for q in range(p, p + span):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", q))
                except OSError:
                    ok = False
                    break
        if ok:
            _handed_out.update(range(p, p + span))
            return p
    raise ServingError("no free port")


def new_run_dir(tag="run"):
    d = os.path.join(RUNS_ROOT, f"{time.strftime('%Y%m%d-%H%M%S')}-{tag}-{os.getpid()}")
    os.makedirs(d, exist_ok=True)
    return d


# ---------------------------------------------------------------- servers


def server_env(extra_env=None):
    env = dict(os.environ)
    env.update(BASE_ENV)
    pp = env.get("PYTHONPATH")
    env["PYTHONPATH"] = STANDINS + (os.pathsep + pp if pp else "")
    for k, v in (extra_env or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


@dataclasses.dataclass
class ServerSpec:
    """What differs per server: extra arguments and environment (None removes a variable)."""

    extra_args: list = dataclasses.field(default_factory=list)
    extra_env: dict = dataclasses.field(default_factory=dict)


def _as_spec(x):
    if x is None:
        return ServerSpec()
    if isinstance(x, ServerSpec):
        return x
    if isinstance(x, dict):
        return ServerSpec(extra_args=list(x.get("extra_args", [])), extra_env=dict(x.get("extra_env", {})))
    raise TypeError(f"server spec: {x!r}")


class Server:
    def __init__(self, name, version, argv, env, run_dir, port, health_path="/health"):
        self.name, self.version, self.port = name, version, port
        self.url = f"http://127.0.0.1:{port}"
        self.health_path = health_path
        self.proc = Proc(name, argv, env, os.path.join(run_dir, f"{name}.log"), run_dir)
        self.start_s = None  # launch -> healthy

    def start(self):
        self.proc.start()
        return self

    def wait_ready(self, deadline_s, others=()):
        waited = wait_http(self.url + self.health_path, deadline_s, procs=[self.proc, *others], what=f"{self.name} {self.url}{self.health_path}")
        self.start_s = time.monotonic() - self.proc.t_start
        return waited

    def stop(self):
        self.proc.stop()

    def describe(self):
        return {
            "name": self.name, "url": self.url, "pid": self.proc.pid, "log": self.proc.log_path,
            "argv": self.proc.argv, "start_s": self.start_s,
            "env": {k: self.proc.env.get(k) for k in sorted(set(BASE_ENV) | {"PYTHONPATH", "KVXFER_DISABLE", "SGLANG_PLUGINS"}) if k in self.proc.env},
        }


def _launch_server_argv(version, model, port, role_args, spec):
    return [venv_python(version), "-m", "sglang.launch_server", "--model-path", model,
            *COMMON_ARGS, "--port", str(port), *role_args, *spec.extra_args]


class Deployment:
    """A set of servers started in order and stopped in reverse order."""

    kind = "deployment"

    def __init__(self, version, run_dir, model):
        self.version, self.run_dir, self.model = version, run_dir, model
        self.servers = []
        self.url = None
        self.started = False
        self.timings = {}

    def _add(self, server):
        self.servers.append(server)
        return server

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self, deadline_s=START_DEADLINE_S):
        raise NotImplementedError

    def stop(self):
        for s in reversed(self.servers):
            s.stop()
        self.started = False

    def alive(self):
        return all(s.proc.alive() for s in self.servers)

    def describe(self):
        return {"kind": self.kind, "version": self.version, "url": self.url, "model": self.model,
                "run_dir": self.run_dir, "timings": self.timings, "servers": [s.describe() for s in self.servers]}

    def _write_description(self):
        with open(os.path.join(self.run_dir, f"{self.kind}.json"), "w") as f:
            json.dump(self.describe(), f, indent=1, sort_keys=True)

    def _prepare(self):
        if not os.path.isdir(self.model):
            raise ServingError(f"no model at {self.model} (serving/model.py)")
        ensure_cpu_dram_plugin(self.version)


class Monolithic(Deployment):
    kind = "monolithic"

    def __init__(self, version, run_dir, model, server=None):
        super().__init__(version, run_dir, model)
        self.spec = _as_spec(server)

    def start(self, deadline_s=START_DEADLINE_S):
        self._prepare()
        port = free_port()
        s = self._add(Server("mono", self.version,
                             _launch_server_argv(self.version, self.model, port, MONO_ARGS, self.spec),
                             server_env(self.spec.extra_env), self.run_dir, port))
        try:
            s.start()
            s.wait_ready(deadline_s)
        except BaseException:
            self.stop()
            raise
        self.url = s.url
        self.timings = {"mono_start_s": round(s.start_s, 1)}
        self.started = True
        self._write_description()
        return self


class PD(Deployment):
    kind = "pd"

    def __init__(self, version, run_dir, model, prefill=None, decode=None, router_args=(), name="pd", parallel_start=False):
        super().__init__(version, run_dir, model)
        self.kind = name
        self.prefill_spec, self.decode_spec = _as_spec(prefill), _as_spec(decode)
        self.router_args = list(router_args)
        self.parallel_start = parallel_start
        self.prefill = self.decode = self.router = None
        self.bootstrap_port = None

    @property
    def prefill_url(self):
        return self.prefill.url if self.prefill else None

    @property
    def decode_url(self):
        return self.decode.url if self.decode else None

    def start(self, deadline_s=START_DEADLINE_S):
        self._prepare()
        pport, dport, rport = free_port(), free_port(), free_port()
        self.bootstrap_port = free_port()
        v, m = self.version, self.model
        self.prefill = self._add(Server(
            f"{self.kind}-prefill", v,
            _launch_server_argv(v, m, pport, [*PREFILL_ARGS, "--disaggregation-bootstrap-port", str(self.bootstrap_port)], self.prefill_spec),
            server_env(self.prefill_spec.extra_env), self.run_dir, pport))
        self.decode = self._add(Server(
            f"{self.kind}-decode", v,
            _launch_server_argv(v, m, dport, DECODE_ARGS, self.decode_spec),
            server_env(self.decode_spec.extra_env), self.run_dir, dport))
        router_argv = [venv_python(v), "-m", "sglang_router.launch_router", "--pd-disaggregation", "--mini-lb",
                       "--prefill", self.prefill.url, str(self.bootstrap_port),
                       "--decode", self.decode.url,
                       "--host", "127.0.0.1", "--port", str(rport), *self.router_args]
        self.router = self._add(Server(f"{self.kind}-router", v, router_argv, server_env({}), self.run_dir, rport))
        t0 = time.monotonic()
        try:
            if self.parallel_start:
                self.prefill.start()
                self.decode.start()
                self.prefill.wait_ready(deadline_s, others=[self.decode.proc])
                self.decode.wait_ready(max(1.0, deadline_s - (time.monotonic() - t0)), others=[self.prefill.proc])
            else:
                self.prefill.start()
                self.prefill.wait_ready(deadline_s)
                self.decode.start()
                self.decode.wait_ready(deadline_s, others=[self.prefill.proc])
            self.router.start()
            self.router.wait_ready(min(deadline_s, 120), others=[self.prefill.proc, self.decode.proc])
            # One generation through the whole path (router -> prefill -> NIXL -> decode).
            t1 = time.monotonic()
            end = t1 + deadline_s
            while True:
                for s in self.servers:
                    if not s.proc.alive():
                        raise ServerDied(f"{s.name} exited (rc {s.proc.returncode()}) during the first PD generation; log {s.proc.log_path}:\n{s.proc.log_tail()}")
                try:
                    generate(self.router.url, input_ids=[1, 4, 5, 6], max_new_tokens=2, timeout=min(120.0, max(1.0, end - time.monotonic())))
                    break
                except ServingError as e:
                    if time.monotonic() > end:
                        raise Timeout(f"first generation through {self.router.url} failed for {deadline_s:.0f} s: {e}")
                    time.sleep(2)
            first_gen_s = time.monotonic() - t1
        except BaseException:
            self.stop()
            raise
        self.url = self.router.url
        self.timings = {
            "prefill_start_s": round(self.prefill.start_s, 1),
            "decode_start_s": round(self.decode.start_s, 1),
            "router_start_s": round(self.router.start_s, 1),
            "first_generate_s": round(first_gen_s, 2),
            "total_start_s": round(time.monotonic() - t0, 1),
        }
        self.started = True
        self._write_description()
        return self


def default_model():
    from model import DEFAULT_DIR  # serving/model.py (imports nothing heavy at module level)

    return DEFAULT_DIR


def ensure_model(version, path=None, timeout=600):
    """Build (or reuse the cached) tiny model with the release's venv python
    (serving/model.py needs torch/transformers); returns its directory."""
    path = path or default_model()
    r = subprocess.run([venv_python(version), os.path.join(HERE, "model.py"), path],
                       capture_output=True, text=True, timeout=timeout, env=_clean_env())
    if r.returncode != 0:
        raise ServingError(f"model.py {path} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout.strip().splitlines()[-1]


def monolithic(version, run_dir=None, model=None, server=None):
    """Monolithic SGLang server (not started: use `with` or .start())."""
    return Monolithic(version, run_dir or new_run_dir(f"mono-{version}"), model or default_model(), server=server)


def pd(version, run_dir=None, model=None, prefill=None, decode=None, router_args=(), name="pd", parallel_start=False):
    """PD deployment: prefill + decode over NIXL + mini-LB router (not started).

    prefill / decode: ServerSpec or {"extra_args": [...], "extra_env": {...}}.
    SGLang's own NIXL prefill with the kvxfer plug-in installed:
        pd(v, prefill={"extra_env": {"KVXFER_DISABLE": "1"}})
    """
    return PD(version, run_dir or new_run_dir(f"{name}-{version}"), model or default_model(),
              prefill=prefill, decode=decode, router_args=router_args, name=name, parallel_start=parallel_start)


# ---------------------------------------------------------------- clients


def generate_raw(url, input_ids=None, text=None, max_new_tokens=16, greedy=True, ignore_eos=True,
                 sampling_params=None, timeout=REQUEST_TIMEOUT_S, **fields):
    """POST /generate; the response JSON (a list for a batch)."""
    if (input_ids is None) == (text is None):
        raise ValueError("exactly one of input_ids, text")
    sp = {"max_new_tokens": int(max_new_tokens)}
    if greedy:
        sp["temperature"] = 0.0
    if ignore_eos:
        sp["ignore_eos"] = True
    sp.update(sampling_params or {})
    body = {"sampling_params": sp, **fields}
    if input_ids is not None:
        body["input_ids"] = input_ids
    else:
        body["text"] = text
    return http_json("POST", url.rstrip("/") + "/generate", body, timeout=timeout)


def generate(url, input_ids=None, text=None, max_new_tokens=16, greedy=True, ignore_eos=True, timeout=REQUEST_TIMEOUT_S, **kw):
    """Greedy generation via /generate: the output token ids (SGLang's
    top-level "output_ids"; a list of lists for a batch of prompts).
    ignore_eos (default) makes every request produce exactly max_new_tokens."""
    out = generate_raw(url, input_ids=input_ids, text=text, max_new_tokens=max_new_tokens, greedy=greedy,
                       ignore_eos=ignore_eos, timeout=timeout, **kw)
    if isinstance(out, list):
        return [list(o["output_ids"]) for o in out]
    return list(out["output_ids"])


def parse_metrics(text):
    """Prometheus text -> {name: value} summed over label sets (histogram
    buckets, _sum and _count dropped), and {name: [(labels, value)]}."""
    flat, full = {}, {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        try:
            head, val = line.rsplit(" ", 1)
            v = float(val)
        except ValueError:
            continue
        name, labels = (head.split("{", 1) + [""])[:2]
        labels = labels.rstrip("}")
        if name.endswith(("_bucket", "_sum", "_count", "_created")):
            continue
        full.setdefault(name, []).append((labels, v))
        flat[name] = flat.get(name, 0.0) + v
    return flat, full


# The gauges that show KV slots and queues (present in 0.5.18 and 0.5.23
# with --enable-metrics; refreshed on the scheduler's stats log, so they lag).
METRICS_OF_INTEREST = (
    "sglang:num_used_tokens", "sglang:kv_used_tokens", "sglang:kv_available_tokens",
    "sglang:kv_evictable_tokens", "sglang:max_total_num_tokens", "sglang:token_usage",
    "sglang:num_running_reqs", "sglang:num_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_transfer_failed_reqs_total", "sglang:num_bootstrap_failed_reqs_total",
)


def server_info(url, timeout=30.0, metrics=True):
    """Live KV slot usage and queue lengths of one SGLang server.

    Returns {"kv_used_tokens", "kv_total_tokens", "token_usage",
    "running_reqs", "waiting_reqs", "prefill_bootstrap_queue",
    "prefill_inflight_queue", "decode_prealloc_queue", "decode_transfer_queue",
    "disaggregation_mode", "loads", "metrics", "internal_state", "version"}.
    The summary comes from /v1/loads (live: the scheduler answers it when
    asked), `metrics` from /metrics (the gauges of METRICS_OF_INTEREST, as
    last logged), `internal_state` a subset of /server_info's internal_states[0].
    """
    base = url.rstrip("/")
    out = {}
    loads = http_json("GET", base + "/v1/loads", timeout=timeout)
    out["version"] = loads.get("version")
    ld = (loads.get("loads") or [{}])[0]
    out["loads"] = ld
    dis = ld.get("disaggregation") or {}
    q = ld.get("queues") or {}
    out.update({
        "kv_used_tokens": ld.get("num_used_tokens"),
        "kv_total_tokens": ld.get("max_total_num_tokens"),
        "token_usage": ld.get("token_usage"),
        "running_reqs": ld.get("num_running_reqs"),
        "waiting_reqs": ld.get("num_waiting_reqs"),
        "disaggregation_mode": dis.get("mode"),
        "prefill_bootstrap_queue": dis.get("prefill_bootstrap_queue_reqs"),
        "prefill_inflight_queue": dis.get("prefill_inflight_queue_reqs"),
        "decode_prealloc_queue": dis.get("decode_prealloc_queue_reqs"),
        "decode_transfer_queue": dis.get("decode_transfer_queue_reqs"),
        "retracted_queue": q.get("retracted"),
    })
    try:
        si = http_json("GET", base + "/server_info", timeout=timeout)
        st = (si.get("internal_states") or [{}])[0]
        out["internal_state"] = {k: st.get(k) for k in ("memory_usage", "disaggregation_mode", "last_gen_throughput",
                                                       "effective_max_running_requests_per_dp") if k in st}
        out["max_total_tokens_arg"] = si.get("max_total_tokens")
    except ServingError as e:
        out["internal_state"] = {"error": str(e)}
    if metrics:
        status, data = http("GET", base + "/metrics", timeout=timeout)
        if status == 200:
            flat, _ = parse_metrics(data.decode(errors="replace"))
            out["metrics"] = {k: flat[k] for k in METRICS_OF_INTEREST if k in flat}
        else:
            out["metrics"] = None
    return out


def flush_cache(url, timeout=60.0):
    status, data = http("POST", url.rstrip("/") + "/flush_cache", timeout=timeout)
    return status == 200
