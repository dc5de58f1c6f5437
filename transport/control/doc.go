// Package control is kvxferd's local control API: how the SGLang prefill scheduler
// (Python) drives a prefill rank's transfer engine, as a drop-in for the NIXL
// KVSender's methods (init, send, poll, failure_exception, clear, abort,
// pop_decode_prefix_len) plus the registration of the KVArgs buffers.
//
// Wire: ZeroMQ request/reply. The daemon binds a ROUTER socket, by default on an
// ipc:// socket file that is mode 0600 from the moment it appears (the API has no
// other authentication; tcp:// is allowed on loopback only). Clients use REQ or
// DEALER. Each request is one msgpack map {id, op, ...fields}; each reply is one map
// {id, ok: true, result} or {id, ok: false, code, error}. msgpack because Python's
// msgpack package (in SGLang's environment) packs and unpacks it in C; the Go side
// reads and writes it with tinylib/msgp's in-place []byte API, a fuzzed subset (nil,
// bool, int, float64, str, bin, array, map) whose allocation is bounded by the message
// (msgpack.go says why this library). Page indices travel as packed little-endian int32
// bins (numpy's tobytes()), and the per-iteration ops (poll, failure, abort, clear,
// pop_decode_prefix_len) take many rooms per request, because the scheduler polls
// every queued room on every loop iteration and a round trip per room would cost more
// than the poll itself. A generic batch op carries any mix of other ops.
//
// Server (Start) owns its socket in one goroutine, serves requests one at a time, and
// calls an Engine (the daemon adapts the actors' engine to it) for the room ops and a
// MemoryFunc for register_memory. Nothing a client sends can stop it: malformed
// requests get an error reply, messages that cannot be framed are dropped and counted.
// Client (Dial) is the Go reference client; python/kvxfer/control.py is the Python one
// that an SGLang adapter can follow. docs/control-api.md is the protocol reference.
package control
