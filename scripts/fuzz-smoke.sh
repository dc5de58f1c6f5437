#!/usr/bin/env bash
# Runs every Go fuzz target briefly: its checked-in corpus plus a budget of new
# inputs. Targets are found by name (func FuzzXxx), so a new target is covered
# without editing this script.
#
# The budget is an execution count (-fuzztime Nx), not a duration: Go 1.26's
# fuzz coordinator can report a bare "context deadline exceeded" failure when a
# duration budget expires while a worker is mid-call (golang/go#75804, fixed
# only in Go 1.27), which failed CI with no failing input. A count has no
# deadline to race. Targets differ ~100x in speed, so a target may set its own
# count with a comment line directly above it:  // fuzz-smoke: 3000x
#
# usage: scripts/fuzz-smoke.sh [default-count, e.g. 200000x]
set -euo pipefail
default=${1:-200000x}
case $default in *x) ;; *) echo "fuzz-smoke: budget must be a count like 200000x, got $default" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
while IFS= read -r line; do
  file=${line%%:*}
  rest=${line#*:}
  lineno=${rest%%:*}
  name=$(sed -E 's/^func (Fuzz[A-Za-z0-9_]+).*/\1/' <<<"${rest#*:}")
  budget=$default
  if [ "$lineno" -gt 1 ]; then
    above=$(sed -n "$((lineno - 1))p" "$file")
    if [[ $above =~ ^//\ fuzz-smoke:\ ([0-9]+x)$ ]]; then budget=${BASH_REMATCH[1]}; fi
  fi
  pkg=$(dirname "$file")
  echo "fuzz $pkg $name ($budget)"
  if ! go test -run='^$' -fuzz="^${name}\$" -fuzztime="$budget" "$pkg" >"$log" 2>&1; then
    cat "$log"; status=1
  fi
done < <(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]+\(' . | sort)
exit $status
