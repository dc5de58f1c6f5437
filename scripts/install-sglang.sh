#!/usr/bin/env bash
# Installs SGLang's real decode-side transfer code (0.5.18 and 0.5.23) into
# cached venvs for tests/sglang/decode_peer.py and the sgltest Go package:
#   /opt/kvxfer-sglang/<version>/bin/python
# Each venv holds the sglang wheel (--no-deps: no torch, triton, model code),
# only the pure-Python packages its disaggregation transfer path imports, and
# NIXL's wheel (as scripts/install-nixl.sh). tests/sglang/stubs/ stands in for
# the heavy modules outside that path (tests/sglang/README.md lists them).
# Idempotent: a venv that already passes the import probe is left alone, so a
# second run downloads nothing. Best effort: without it the sgltest tests skip
# (unless KVXFER_REQUIRE_SGLANG=1).
set -uo pipefail
ROOT=${KVXFER_SGLANG_ROOT:-/opt/kvxfer-sglang}
VERSIONS=${KVXFER_SGLANG_VERSIONS:-"0.5.18 0.5.23"}
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
# What the transfer path imports besides the stdlib, found by trying
# (tests/sglang/README.md): numpy, pyzmq, requests, aiohttp (the bootstrap
# server module is imported by common/conn.py), psutil (utils/network.py),
# msgspec (0.5.22+ AbortNotification/AbortAck, pp_consensus_store).
# Pinned to the versions the suite was proven with, so CI is reproducible.
DEPS="numpy==2.4.6 pyzmq==27.3.0 requests==2.34.2 aiohttp==3.14.5 psutil==7.2.2 msgspec==0.23.0"

probe() { # venv version
  "$1/bin/python" - "$2" "$HERE/tests/sglang/stubs" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
assert version("sglang") == sys.argv[1], version("sglang")
sys.path.insert(0, sys.argv[2])
import kvx_sglang_shim
kvx_sglang_shim.install()
import nixl_cu12, numpy, zmq, requests, aiohttp, psutil, msgspec  # noqa: F401
import sglang.srt.disaggregation.nixl.conn  # noqa: F401
PY
}

rc=0
for v in $VERSIONS; do
  venv="$ROOT/$v"
  if probe "$venv" "$v"; then
    echo "sglang $v: ready in $venv"
    continue
  fi
  echo "sglang $v: installing into $venv"
  if { mkdir -p "$ROOT" && "$PY" -m venv "$venv" &&
       "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "sglang==$v" &&
       "$venv/bin/pip" install -q --disable-pip-version-check --no-deps nixl==1.5.1 nixl-cu12==1.5.1 &&
       "$venv/bin/pip" install -q --disable-pip-version-check $DEPS; } 2>&1 |
       grep -v "requires .*, which is not installed\|dependency resolver does not currently\|dependency conflicts" ; \
     probe "$venv" "$v"; then
    echo "sglang $v: ready in $venv"
  else
    echo "sglang $v: NOT installed (sgltest will skip it)" >&2
    rc=1
  fi
done
[ "${KVXFER_REQUIRE_SGLANG:-0}" = 1 ] && exit $rc
exit 0
