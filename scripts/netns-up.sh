#!/usr/bin/env bash
# Two simulated hosts for the two-host suite (make test-hosts, hosts/):
# network namespaces <prefix>p (prefill, 192.0.2.1) and <prefix>d (decode,
# 192.0.2.2) joined by one veth pair (veth-p <-> veth-d, created directly
# inside the namespaces, so nothing appears in the caller's namespace).
# Addresses are from the documentation range (RFC 5737). Each namespace gets
# a default route over the veth, so that SGLang-style auto-detection (the
# route to 8.8.8.8) finds 192.0.2.x; nothing is forwarded anywhere, so no
# packet leaves the pair.
#
# Usage: scripts/netns-up.sh PREFIX     (e.g. kvxh123)
# Exit status: 0 ready; 2 namespaces cannot be created here (reason on stderr).
set -euo pipefail
prefix=${1:?usage: netns-up.sh PREFIX}
p=${prefix}p
d=${prefix}d
die() { echo "netns-up: $*" >&2; "$(dirname "$0")/netns-down.sh" "$prefix" || true; exit 2; }
command -v ip >/dev/null || die "no ip(8) (iproute2) here"
[ "$(id -u)" = 0 ] || die "network namespaces need root (uid $(id -u))"
"$(dirname "$0")/netns-down.sh" "$prefix" # leftovers of a killed run
# The suite names its namespaces kvxh<pid of the test process>: remove those
# whose test process is gone (a run killed with SIGKILL cannot clean up).
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^kvxh[0-9]+[pd]$' || true); do
  pid=${ns#kvxh}; pid=${pid%?}
  kill -0 "$pid" 2>/dev/null || "$(dirname "$0")/netns-down.sh" "kvxh$pid"
done
ip netns add "$p" 2>/dev/null || die "ip netns add failed (no CAP_SYS_ADMIN, or no netns support in this kernel/container)"
ip netns add "$d" || die "ip netns add $d failed"
ip link add veth-p netns "$p" type veth peer name veth-d netns "$d" || die "cannot create a veth pair (no veth driver?)"
ip -n "$p" link set lo up
ip -n "$d" link set lo up
ip -n "$p" addr add 192.0.2.1/24 dev veth-p
ip -n "$d" addr add 192.0.2.2/24 dev veth-d
ip -n "$p" link set veth-p up
ip -n "$d" link set veth-d up
ip -n "$p" route add default dev veth-p
ip -n "$d" route add default dev veth-d
# The link must carry traffic before anyone relies on it: a TCP connect to a
# closed port of the decode host must be refused (a RST came back).
for _ in $(seq 1 50); do
  out=$(ip netns exec "$p" bash -c 'exec 3<>/dev/tcp/192.0.2.2/9' 2>&1 || true)
  case $out in *refused*) exit 0 ;; esac
  sleep 0.1
done
die "veth link 192.0.2.1 <-> 192.0.2.2 does not pass traffic"
