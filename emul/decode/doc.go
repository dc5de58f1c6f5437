// Package decode emulates one SGLang decode rank (NIXL backend) of a chosen
// release, 0.5.18 to 0.5.23 (Release; ../shared/spec/sglang-versions.md),
// against a prefill bootstrap server and its ZMQ PULL socket: topology and
// endpoint queries, the KV-args registration (23 or 24 frames), per-room
// transfer infos, the release's completion rule (NIXL notifications and/or
// KV_STATUS "4" from N distinct prefill ranks), the aux bootstrap_room gate,
// the waiting timeout, ABORT (with a generation from 0.5.22 when armed), the
// heartbeat, and from 0.5.21 deferred release of an aborted or failed room's
// pages until every target's ABORT_ACK or the release timeout.
//
// Unlike a real decode it verifies every byte that lands in its KV pages, and
// it poisons pages before it hands them out, so a late or misdirected write
// from the prefill shows up as wrong bytes in another room.
//
// Emulator is the library; cmd/kvxfer-decode is its command line. Run plays
// the shared workload (emul/workload); RunRoom plays one plan, which is what
// tests use.
package decode
