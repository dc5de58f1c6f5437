#!/usr/bin/env bash
# The control-path benchmarks, side by side in one run
# (docs/benchmarks.md, "Control path"): per-call cost from Python (kvxfer
# request/reply, kvxfer shared memory, SGLang's in-process NixlKVSender), the
# abort storm as the scheduler sees it (Go, both paths), and the demo end to
# end with the scheduler emulator on each path. Needs the SGLang 0.5.18 venv
# (make deps-sglang) for the Python part. Benchmarks, not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${KVXFER_SGLANG_PYTHON:-/opt/kvxfer-sglang/0.5.18/bin/python}
go build -o bin/ ./cmd/...
echo "== load: $(cat /proc/loadavg)"
echo "== per call and poll of 1,000 rooms (python/tests/bench_calls.py)"
"$py" python/tests/bench_calls.py --kvxferd bin/kvxferd --rooms "${ROOMS:-2000}"
echo "== abort storm (BenchmarkAbortStorm)"
go test -run '^$' -bench AbortStorm -benchtime "${STORMS:-3}x" ./transport/control/ | grep Benchmark
for share in 0.2 0; do
  for path in reqrep shm; do
    echo "== make demo, -abort-share $share, scheduler path $path (load: $(cat /proc/loadavg))"
    KVXFER_SCHED_PATH=$path bin/kvxfer-demo -abort-share "$share" | grep -A1 '== summary'
  done
done
