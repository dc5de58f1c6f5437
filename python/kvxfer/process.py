"""Start (or attach to) the kvxferd of one prefill rank and watch it.

The child gets the rank's identity flags, SGLang's bootstrap server as
-bootstrap-url (kvxferd registers its rank there, as SGLang's prefill ranks
do), -parent-pid, and PR_SET_PDEATHSIG(SIGKILL) from a preexec hook, so it
never outlives the scheduler process that started it.
"""

import ctypes
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .control import ControlClient

log = logging.getLogger("kvxfer")

PR_SET_PDEATHSIG = 1


def find_binary():
    """KVXFER_BIN, else the binary shipped in the wheel (kvxfer/bin/kvxferd), else PATH."""
    env = os.environ.get("KVXFER_BIN")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "kvxferd")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("kvxferd")
    if found:
        return found
    raise FileNotFoundError(
        "kvxfer: no kvxferd binary: install the platform wheel (make wheel), put kvxferd on PATH "
        "or set KVXFER_BIN")


def _pdeathsig():
    # Runs in the child between fork and exec: stop with the parent (thread).
    # SIGTERM, not SIGKILL: kvxferd's shutdown is bounded, fails its rooms
    # towards the decodes and, its parent gone, removes its control socket and
    # state directory (SGLang never shuts a manager down).
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except Exception:  # noqa: BLE001 - -parent-pid still covers it
        pass


def _runtime_dir():
    return os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()


def default_endpoint(tag):
    sweep_stale()
    base = _runtime_dir()
    path = os.path.join(base, f"kvxfer-{os.getuid()}-{os.getpid()}-{tag}.sock")
    if len(path) > 107:
        path = os.path.join(tempfile.gettempdir(), f"kvx-{os.getuid()}-{os.getpid()}-{tag}.sock")
    return "ipc://" + path


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(base=None):
    """Remove control sockets and state directories of ours whose scheduler
    process is gone (both were killed at once, so neither could). The pid is
    in every name; only our uid's entries, never through a symlink."""
    base = base or _runtime_dir()
    uid = os.getuid()
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        pid = _owner_pid(name, uid)
        if pid is None or pid == os.getpid() or _pid_alive(pid):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != uid:
            continue
        import stat
        try:
            if stat.S_ISSOCK(st.st_mode):
                os.unlink(path)
            elif stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path, ignore_errors=True)
            else:
                continue
            removed.append(path)
        except OSError:
            pass
    return removed


def _owner_pid(name, uid):
    """The scheduler pid in a socket or state-dir name of ours, else None."""
    for prefix, suffix in ((f"kvxfer-{uid}-state-", ""), (f"kvxfer-{uid}-", ".sock"), (f"kvx-{uid}-", ".sock")):
        if name.startswith(prefix) and name.endswith(suffix):
            head = name[len(prefix):].split("-", 1)[0]
            if head.isdigit():
                return int(head)
    return None


def remove_at_exit(daemon, endpoint, state_path):
    """On this scheduler's normal exit: stop kvxferd, remove its socket and state."""
    import atexit

    def cleanup():
        try:
            daemon.stop()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
        if endpoint.startswith("ipc://"):
            try:
                os.unlink(endpoint[len("ipc://"):])
            except OSError:
                pass
        if state_path:
            shutil.rmtree(state_path, ignore_errors=True)

    atexit.register(cleanup)
    return cleanup


def state_dir(tag, bootstrap):
    """A private directory (0700, ours) for kvxferd's -state-dir: the decode
    registrations one rank accepted, replayed by its next incarnation (emptied
    here: the manager calls this once, when it is created). Keyed
    by the rank (tag) and SGLang's bootstrap address, so another deployment
    never replays it. None when it cannot be made private."""
    base = _runtime_dir()
    key = hashlib.sha256(f"{bootstrap}|{tag}".encode()).hexdigest()[:16]
    path = os.path.join(base, f"kvxfer-{os.getuid()}-state-{os.getpid()}-{tag}-{key}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        log.warning("kvxfer: no state dir %s (%s): a restarted kvxferd will not know decodes that "
                    "registered with the one before", path, e)
        return None
    st = os.lstat(path)
    import stat
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        log.warning("kvxfer: %s is not our directory; kvxferd runs without -state-dir", path)
        return None
    os.chmod(path, 0o700)
    # Fresh for this scheduler process: only its own kvxferd restarts replay
    # (a crashed earlier deployment on the same address leaves nothing behind).
    for name in ("registrations", "registrations.tmp"):
        try:
            os.unlink(os.path.join(path, name))
        except FileNotFoundError:
            pass
    return path


class Kvxferd:
    """One kvxferd: a child we started (argv given) or one we attach to
    (endpoint given, argv None). generation counts incarnations: a room
    opened under an older one was lost with its process."""

    def __init__(self, endpoint, argv=None, env=None, hello=None, start_timeout=60.0,
                 call_timeout_ms=10000, pass_fds=()):
        self.endpoint = endpoint
        self.argv = argv
        self.pass_fds = tuple(pass_fds)
        self.env = env
        self.hello_fields = hello or {}
        self.start_timeout = start_timeout
        self.call_timeout_ms = call_timeout_ms
        self.proc = None
        self.client = None
        self.generation = 0
        self.start_seconds = None
        self.lost_reason = None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def alive(self):
        return self.proc is None or self.proc.poll() is None

    def start(self):
        """Start (or reconnect) and wait until the control API answers hello."""
        self.close_client()
        t0 = time.monotonic()
        if self.argv is not None:
            # A session of its own: a signal to SGLang's process group (a
            # launcher stopping its servers) reaches kvxferd only as the
            # parent-death SIGTERM, after its scheduler is gone, so it can
            # tell a stop for good (remove its socket and state) from one the
            # plug-in will restart.
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                         preexec_fn=_pdeathsig, close_fds=True, pass_fds=self.pass_fds,
                                         start_new_session=True)
        deadline = t0 + self.start_timeout
        last = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"kvxfer: kvxferd exited with status {self.proc.returncode} at start-up "
                                   f"({' '.join(self.argv)})")
            c = ControlClient(self.endpoint, timeout_ms=500, alive=self.alive)
            try:
                info = c.hello(**self.hello_fields)
            except (TimeoutError, ConnectionError) as e:
                last = e
                c.close()
                continue
            c.timeout_ms = self.call_timeout_ms
            self.client = c
            self.generation += 1
            self.lost_reason = None
            self.start_seconds = time.monotonic() - t0
            log.info("kvxfer: kvxferd %s live in %.3f s (pid %s, control %s, generation %d)",
                     "started" if self.proc else "attached", self.start_seconds,
                     info.get("pid"), self.endpoint, self.generation)
            return info
        self.stop()
        raise TimeoutError(f"kvxfer: kvxferd at {self.endpoint} not live after {self.start_timeout} s: {last}")

    def lost(self, why):
        """Mark this incarnation lost; the next start() makes a new one."""
        if self.lost_reason is None:
            self.lost_reason = why
            log.error("kvxfer: kvxferd (pid %s, control %s) lost: %s; its non-terminal rooms fail "
                      "(transfer_process_lost), new rooms get a restarted kvxferd", self.pid, self.endpoint, why)
            self.close_client()
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass

    def check(self):
        """False (and marked lost) once the child has exited."""
        if self.lost_reason is not None:
            return False
        if not self.alive():
            self.lost(f"kvxferd exited with status {self.proc.returncode}")
            return False
        return True

    def close_client(self):
        if self.client is not None:
            self.client.close()
            self.client = None

    def stop(self):
        self.close_client()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
