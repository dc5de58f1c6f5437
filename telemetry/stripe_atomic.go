//go:build !((amd64 || arm64) && !race)

package telemetry

import "sync/atomic"

// add adds n to c, one of st's counters; the caller pinned st (pin). A P's
// own stripe has one writer at a time, so a load and a store suffice;
// readers (Produce) load atomically. (stripe_plain.go: the plain store used
// on amd64 and arm64 outside the race detector.)
func (st *stripe) add(c *atomic.Int64, n int64) {
	if st.shared {
		c.Add(n)
		return
	}
	c.Store(c.Load() + n)
}
