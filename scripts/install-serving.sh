#!/usr/bin/env bash
# Installs full SGLang serving stacks (launch_server, the PD router,
# bench_serving) for the real-serving suite (serving/, make test-serving):
#   /opt/kvxfer-serving/<version>/bin/python
# Each venv holds sglang with all of its dependencies (torch and the CUDA
# wheels PyPI ships; about 11 GB), NIXL 1.5.1 and sglang-router. The kvxfer
# wheel is installed into it by the suite itself, from `make wheel`, as the
# README tells users. Idempotent: a venv that passes the import probe is kept.
set -uo pipefail
ROOT=${KVXFER_SERVING_ROOT:-/opt/kvxfer-serving}
VERSIONS=${KVXFER_SERVING_VERSIONS:-"0.5.23 0.5.18"}
PY=${PYTHON:-python3}
ROUTER=${KVXFER_ROUTER_VERSION:-0.3.2}
SKIP=${KVXFER_SERVING_SKIP:-cuda-tile}

probe() { # venv version
  "$1/bin/python" - "$2" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
assert version("sglang") == sys.argv[1], version("sglang")
import torch, transformers, tokenizers, safetensors  # noqa: F401
import sglang_router  # noqa: F401
import nixl  # noqa: F401
PY
}

rc=0
for v in $VERSIONS; do
  venv="$ROOT/$v"
  if probe "$venv" "$v"; then
    echo "sglang serving $v: ready in $venv"
    continue
  fi
  echo "sglang serving $v: installing into $venv (several minutes, ~11 GB)"
  # sglang first without its dependencies, then every dependency its metadata
  # names except $SKIP: 0.5.18 pins cuda-tile==1.6.0rc5, a placeholder that
  # fetches its real wheel from pypi.nvidia.com (unreachable here; GPU only,
  # never imported on the CPU path).
  if mkdir -p "$ROOT" && "$PY" -m venv "$venv" &&
     "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "sglang==$v" &&
     "$venv/bin/python" - "$SKIP" >"$venv/kvxfer-requirements.txt" <<'PY' &&
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
skip = set(sys.argv[1].split())
for line in requires("sglang") or []:
    r = Requirement(line)
    if r.name in skip or (r.marker and not r.marker.evaluate({"extra": ""})):
        continue
    print(line.split(";")[0].strip())
PY
     "$venv/bin/pip" install -q --disable-pip-version-check -r "$venv/kvxfer-requirements.txt" \
        nixl==1.5.1 nixl-cu12==1.5.1 "sglang-router==$ROUTER" &&
     probe "$venv" "$v"; then
    echo "sglang serving $v: ready in $venv"
  else
    echo "sglang serving $v: NOT installed" >&2
    rc=1
  fi
done
exit $rc
