//go:build (amd64 || arm64) && !race

package telemetry

import (
	"sync/atomic"
	"unsafe"
)

// add adds n to c, one of st's counters; the caller pinned st (pin). A P's
// own stripe has one writer at a time (the goroutine pinned to that P), so
// the add is a plain read and write of the word: on amd64 and arm64 an
// aligned 64-bit store is never torn, and Go's memory model guarantees a
// racing word-sized read (Produce's atomic load) sees some value that was
// written, so a scrape reads each counter as it was at some moment. An
// atomic store is a locked exchange on amd64, which waits for the core's
// store buffer to drain: about a fifth of a room's bookkeeping, for some 20
// counter updates per room. The race detector's build (stripe_atomic.go)
// keeps atomic stores, so that -race stays quiet and checks the rest.
func (st *stripe) add(c *atomic.Int64, n int64) {
	if st.shared {
		c.Add(n)
		return
	}
	p := (*int64)(unsafe.Pointer(c)) // atomic.Int64 is its value, aligned
	*p += n
}
