#!/usr/bin/env bash
# Telemetry's cost counted, not timed (docs/observability.md, Cost):
# telemetry's BenchmarkRoomsCounted under cachegrind, one configuration at a
# time (off, metrics-only, ratio-0, ratio-0.1), at two room counts; the
# difference between them, divided by the rooms between, is per room (the
# set-up cancels). GOMAXPROCS=1 (no thread spins waiting for work: valgrind
# runs one thread at a time) and GOGC=off (no collector: its idle workers
# run when a thread waits, so their work varies from run to run). Caches
# simulated: 48 KiB L1d, and a 2 MiB last level (this machine's L2 per
# core), so "LL misses" are misses of a core's own caches.
#
#   scripts/telemetry-counts.sh [ROOMS_LOW] [ROOMS_HIGH]
#
# Needs valgrind (apt-get install -y valgrind). Prints a table: per room,
# instructions, L1d misses and LL misses, and what each configuration adds
# to off. Takes a few minutes. A measurement, not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
lo=${1:-5000}
hi=${2:-15000}
command -v valgrind >/dev/null || { echo "telemetry-counts: valgrind not found (apt-get install -y valgrind)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go test -c -o "$work/telemetry.test" ./telemetry/
modes="off metrics-only ratio-0 ratio-0.1"
for m in $modes; do
	for n in $lo $hi; do
		echo "telemetry-counts: $m, $n rooms" >&2
		GOGC=off GOMAXPROCS=1 valgrind --tool=cachegrind --cache-sim=yes --D1=49152,12,64 --LL=2097152,16,64 \
			--cachegrind-out-file=/dev/null "$work/telemetry.test" -test.run '^$' \
			-test.bench "RoomsCounted/^$m\$" -test.benchtime "${n}x" > "$work/$m.$n.log" 2>&1
	done
done
python3 - "$work" "$lo" "$hi" $modes <<'PY'
import re, sys
work, lo, hi, modes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
keys = {"I   refs": "instructions", "D1  misses": "L1d misses", "LLd misses": "LL misses"}
def counts(path):
    got = {}
    for line in open(path):
        m = re.match(r"==\d+== (I   refs|D1  misses|LLd misses):\s+([\d,]+)", line)
        if m:
            got[keys[m.group(1)]] = int(m.group(2).replace(",", ""))
    return got
per = {}
for m in modes:
    a, b = counts(f"{work}/{m}.{lo}.log"), counts(f"{work}/{m}.{hi}.log")
    per[m] = {k: (b[k] - a[k]) / (hi - lo) for k in keys.values()}
off = per["off"]
print(f"| per room ({hi - lo} rooms) | instructions | L1d misses | LL misses | added instructions | added LL misses |")
print("|---|---|---|---|---|---|")
for m in modes:
    p = per[m]
    add = "" if m == "off" else f"+{p['instructions'] - off['instructions']:.0f} ({100 * (p['instructions'] / off['instructions'] - 1):.1f} %)"
    addl = "" if m == "off" else f"+{p['LL misses'] - off['LL misses']:.1f} ({100 * (p['LL misses'] / off['LL misses'] - 1):.1f} %)"
    print(f"| {m} | {p['instructions']:.0f} | {p['L1d misses']:.1f} | {p['LL misses']:.1f} | {add} | {addl} |")
PY
