#!/usr/bin/env bash
# Idle CPU of a whole kvxferd (docs/benchmarks.md, "Idle
# CPU"): tests/sglang/prefill_bench.py --idle starts kvxferd through the
# kvxfer plug-in (memory registered, one SGLang decode receiver loaded, one
# room done), then measures kvxferd's CPU (/proc/PID/stat) over SECONDS of
# nothing. REPS runs; prints each and the median, with the load average.
#
#   scripts/idle-cpu.sh [KVXFERD] [BACKEND nixl|loopback] [REPS] [SECONDS]
#
# With loopback the decode's registration (real NIXL metadata) is refused and
# the room fails; the daemon is live and idle all the same. Needs the SGLang
# 0.5.18 venv (make deps-sglang). A benchmark, not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-bin/kvxferd}
backend=${2:-nixl}
reps=${3:-3}
secs=${4:-25}
py=${KVXFER_SGLANG_PYTHON:-/opt/kvxfer-sglang/0.5.18/bin/python}
if [ ! -x "$py" ]; then
  echo "idle-cpu: skipped, no SGLang venv at $py (make deps-sglang)"
  exit 0
fi
out=$(mktemp)
for r in $(seq 1 "$reps"); do
  KVXFER_NIXL_BACKEND=$backend "$py" tests/sglang/prefill_bench.py --kvxferd "$bin" --engine kvxfer \
    --idle "$secs" 2>/dev/null | tail -1 | tee -a "$out"
done
"$py" - "$out" "$backend" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v = [r["idle_cores_kvxferd"] * 100 for r in rows]
print(f"kvxferd -nixl-backend {sys.argv[2]} idle: median {statistics.median(v):.2f} % of a core "
      f"(runs {', '.join(f'{x:.2f}' for x in v)}; {rows[0]['idle_s']:.0f} s each; load {rows[-1]['loadavg']})")
PY
rm -f "$out"
