#!/usr/bin/env bash
# Installs NIXL's wheel (its shared libraries, UCX included) into a venv so that
# nixl/libnixl's tests and the libnixl backend can load the real library.
# Best effort: without it those tests skip and the loopback backend is used.
# nixl 1.5.1 + nixl-cu12 1.5.1 with --no-deps: the meta package's newest
# version pins an unpublished nixl-cu12, and nixl-cu12 would pull torch.
set -uo pipefail
NIXL_VENV=${NIXL_VENV:-/opt/kvxfer-nixl}
if "$NIXL_VENV/bin/python" -c 'import nixl_cu12, numpy' 2>/dev/null; then
  exit 0
fi
{ python3 -m venv "$NIXL_VENV" &&
  "$NIXL_VENV/bin/pip" install -q --no-deps nixl==1.5.1 nixl-cu12==1.5.1 &&
  "$NIXL_VENV/bin/pip" install -q numpy; } ||
  echo "NIXL wheel not installed: nixl/libnixl tests will skip"
exit 0
