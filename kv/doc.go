// Package kv holds the words the rest of kvxfer shares about a transfer room:
// its status (SGLang's KVPoll), why it failed (Reason), a poll's answer
// (Reply), a decode rank's address (Endpoint) and one chunk to write
// (Transfer, reported back through a DoneFunc).
//
// It is a leaf: it imports nothing of kvxfer, so the room's rules
// (actors/room), the wire codecs (transport/wire), the control API
// (transport/control), telemetry, the benchmarks and the emulators can all
// speak it without importing one another.
package kv
