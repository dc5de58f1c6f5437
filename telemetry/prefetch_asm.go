//go:build amd64 || arm64

package telemetry

import "unsafe"

// prefetchRec asks the CPU to bring the first 9 cache lines at p (a record's
// hot part, see roomRec) into its cache, and returns at once: a prefetch
// instruction never waits for the memory, where a load whose value is used
// (warm) holds the core's in-order retirement until it arrives. prefetch_*.s.
//
//go:noescape
func prefetchRec(p unsafe.Pointer)
