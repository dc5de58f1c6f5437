//go:build !amd64 && !arm64

package telemetry

import "unsafe"

// prefetchRec does nothing where no prefetch instruction is wired up.
func prefetchRec(unsafe.Pointer) {}
