#!/usr/bin/env bash
# Removes the namespaces made by scripts/netns-up.sh PREFIX (and so the veth
# pair and every socket in them). Safe to run twice.
set -uo pipefail
prefix=${1:?usage: netns-down.sh PREFIX}
for ns in "${prefix}p" "${prefix}d"; do
  if ip netns list 2>/dev/null | grep -qw "$ns"; then
    # Processes still inside would keep the namespace alive: end them first.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null || true
  fi
done
exit 0
