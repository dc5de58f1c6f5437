//go:build !race

package telemetry

import (
	"sync/atomic"
	"unsafe"
)

// addLocal adds n to c with a plain (not locked) read-modify-write: c is a
// counter of a P's own stripe, written only by the goroutine pinned to that
// P (see stripe.add). On amd64 an atomic Store is an XCHG, a locked
// instruction that costs about as much as an atomic Add; a room adds to its
// stripe about 20 times, so the locked stores were about a fifth of the
// telemetry's CPU per room. Readers (Produce) load c atomically: a
// word-sized, aligned value is never torn (the Go memory model lets a racy
// read of a word observe only a value some write stored), so a scrape sees
// each counter's value before or after an add. Under the race detector,
// addlocal_race.go adds atomically instead, so -race checks everything else.
func addLocal(c *atomic.Int64, n int64) {
	p := (*int64)(unsafe.Pointer(c)) // atomic.Int64 is its int64 (no other sized fields)
	*p += n
}
