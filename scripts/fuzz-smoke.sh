#!/usr/bin/env bash
# Runs every Go fuzz target for a short time each. Fuzz targets are found by name
# (func FuzzXxx) so a new target is covered without editing this script.
set -euo pipefail
dur=${1:-5s}
cd "$(dirname "$0")/.."
status=0
while IFS= read -r line; do
  file=${line%%:*}
  name=$(sed -E 's/^func (Fuzz[A-Za-z0-9_]+).*/\1/' <<<"${line#*:}")
  pkg="./$(dirname "$file")"
  echo "fuzz $pkg $name ($dur)"
  if ! go test -run='^$' -fuzz="^${name}\$" -fuzztime="$dur" "$pkg" >/tmp/fuzz-$$.log 2>&1; then
    cat /tmp/fuzz-$$.log; status=1
  fi
done < <(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]+\(' . | sed -E 's/:[0-9]+:/:/')
rm -f /tmp/fuzz-$$.log
exit $status
