package loopback

import (
	"math/rand/v2"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// What this package's external tests use and production code does not.

// AllocRegistered is Alloc followed by Register of the whole buffer.
func (a *Agent) AllocRegistered(kind nixl.MemKind, dev uint64, n int) ([]byte, nixl.RegID, error) {
	b, err := a.Alloc(n)
	if err != nil {
		return nil, 0, err
	}
	id, err := a.Register(kind, []nixl.Desc{nixl.DescOf(b, dev)})
	if err != nil {
		a.Free(b)
		return nil, 0, err
	}
	return b, id, nil
}

// Uniform is a latency drawn uniformly from [min, max].
func Uniform(min, max time.Duration) func() time.Duration {
	if max <= min {
		return Fixed(min)
	}
	return func() time.Duration { return min + rand.N(max-min+1) }
}

// Datagrams counts the notification datagrams a sent.
func (a *Agent) Datagrams() uint64 { return a.datagrams.Load() }

// Landed reports whether request id's bytes were copied (a delayed request
// then waits for its due time in Poll).
func (a *Agent) Landed(id nixl.XferID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	x := a.xfers[id]
	return x != nil && x.landed
}
