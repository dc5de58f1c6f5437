// Package decode emulates one SGLang decode rank (NIXL backend) against a
// prefill bootstrap server and its ZMQ PULL socket, per the protocol spec §8:
// topology and endpoint queries, the KV-args registration, per-room transfer
// infos, decode's completion rule over NIXL notifications, the aux
// bootstrap_room gate, the waiting timeout, ABORT, the heartbeat, and (in ack
// mode) deferred release of an aborted room's pages until ABORT_ACK.
//
// Unlike a real decode it verifies every byte that lands in its KV pages, and
// it poisons pages before it hands them out, so a late or misdirected write
// from the prefill shows up as wrong bytes in another room.
//
// Emulator is the library; cmd/kvxfer-decode is its command line. Run plays
// the shared workload (emul/workload); RunRoom plays one plan, which is what
// tests use.
package decode
