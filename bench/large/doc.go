// Package large is the large-room benchmark: rooms of realistic size (tens
// of layers × K and V, pages of 16–64 tokens, megabytes a room, several in
// flight) moved over real NIXL into a decode stand-in, by kvxfer's Go NIXL
// binding posting the room's merged descriptor list (nixl/sglang.MergedKV),
// against a memcpy of the same pairs in this process, NIXL's own Python API
// posting the same list (and SGLang's per-page prepared indices), and, with
// the stand-in on this host, the kernel's cross-process copy of the same
// pairs that UCX's shared-memory transport makes (process_vm_writev). The
// engines alternate round by round in one run; a run on a machine without
// NIXL is skipped with the reason. docs/libnixl.md §9 shows the tables.
package large
