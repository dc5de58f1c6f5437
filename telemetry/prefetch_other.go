//go:build !amd64 && !arm64

package telemetry

import "unsafe"

// prefetchRec does nothing where no prefetch instruction is wired up.
func prefetchRec(unsafe.Pointer) {}

// prefetchLines does nothing where no prefetch instruction is wired up.
func prefetchLines(unsafe.Pointer, int) {}
