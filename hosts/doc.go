// Package hosts is the two-host suite: kvxferd and its decodes on
// two simulated hosts, network namespaces joined by one veth pair (prefill
// 192.0.2.1, decode 192.0.2.2; scripts/netns-up.sh), with the real NIXL
// library over UCX_TLS=tcp, so that every byte crosses the link.
//
// The test binary re-executes itself inside the prefill namespace (it plays
// SGLang's prefill scheduler over kvxferd's control API, a Unix socket, and
// starts kvxferd there); decodes run in the decode namespace through
// `ip netns exec`: SGLang's own decode classes (tests/sglang/decode_peer.py,
// driven through package sgltest) and kvxfer-decode -nixl-backend nixl.
// Scenarios: one chunk; 200 rooms; aborts from either side; decode kill -9;
// a 10 s link cut mid-transfer (veth down), after which both sides must agree
// on every room, no byte may land in a page decode gave up, and new rooms
// must succeed; and kvxferd -host 0.0.0.0 with its advertised address
// auto-detected. Every byte is verified. The scenario table with times is
// printed (and, with KVXFER_HOSTS_DOC=docs/hosts.md, written there).
//
// Running (root, iproute2, the NIXL and SGLang venvs):
//
//	make test-hosts
//
// The tests skip unless KVXFER_HOSTS=1, and skip with the reason where
// namespaces cannot be created (not root, no netns or veth support);
// KVXFER_REQUIRE_HOSTS=1 turns those skips into failures. See docs/hosts.md.
package hosts
