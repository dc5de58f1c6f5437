// Package large is the large-room benchmark: rooms of realistic size (tens
// of layers × K and V, pages of 16–64 tokens, megabytes a room, several in
// flight) moved over real NIXL into a decode stand-in, by kvxfer's Go NIXL
// binding posting the room's merged descriptor list (nixl/sglang.MergedKV),
// against a memcpy of the same pairs in this process and NIXL's own Python
// API posting the same list (and SGLang's per-page prepared indices). The
// engines alternate round by round in one run; a run on a machine without
// NIXL is skipped with the reason. docs/benchmarks.md shows the table.
package large
