//go:build amd64 || arm64

package telemetry

import "unsafe"

// prefetchRec asks the CPU to bring the 6 cache lines of the record at p
// (see roomRec) into its cache, and returns at once: a prefetch instruction
// never waits for the memory, where a load whose value is used (warm) holds
// the core's in-order retirement until it arrives. prefetch_*.s.
//
//go:noescape
func prefetchRec(p unsafe.Pointer)

// prefetchLines asks the CPU to bring n cache lines from p on into its
// cache, and returns at once (the emitter's next room's span memory, see
// spanArena.prefetch).
//
//go:noescape
func prefetchLines(p unsafe.Pointer, n int)
