package loopback

import (
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// Fault describes what transfers from this agent to one peer suffer. The zero
// value is a healthy peer. Faults are keyed by peer name and survive
// DropPeer/LoadPeer; SetFault(peer, Fault{}) clears them.
type Fault struct {
	// Latency, if set, is each posted request's wire time (see Fixed and
	// Uniform): the copy runs at once, but the notification and Done wait for
	// the first Poll at or after post time + latency (monotonic clock; no
	// timer fires). The request stays InProgress meanwhile.
	Latency func() time.Duration
	// Bandwidth, if set, adds bytes ÷ Bandwidth (bytes per second) to each
	// request's latency: a wire of that speed.
	Bandwidth float64
	// Fail makes each posted request end Failed (ErrBackend) without copying or notifying.
	Fail bool
	// Hang makes each posted request stay InProgress forever (it can never be
	// released), like a NIXL transfer to a stalled peer.
	Hang bool
	// Disconnect makes posts and SendNotif fail with ErrRemoteDisconnect, and fails
	// requests in flight to the peer with ErrRemoteDisconnect when it is set.
	Disconnect bool
}

func (f Fault) delay(bytes uint64) time.Duration {
	var d time.Duration
	if f.Latency != nil {
		d = f.Latency()
	}
	if f.Bandwidth > 0 {
		d += time.Duration(float64(bytes) / f.Bandwidth * float64(time.Second))
	}
	return d
}

// Fixed is a constant latency.
func Fixed(d time.Duration) func() time.Duration { return func() time.Duration { return d } }

// SetFault sets the fault for transfers to peer (loaded or not yet).
func (a *Agent) SetFault(peer string, f Fault) {
	defer a.wake() // after the unlock below
	a.mu.Lock()
	defer a.mu.Unlock()
	if f.Latency == nil && f.Bandwidth == 0 && !f.Fail && !f.Hang && !f.Disconnect {
		delete(a.faults, peer)
	} else {
		a.faults[peer] = f
	}
	if f.Disconnect {
		a.failInflightLocked(func(x *xfer) bool { return x.peer.name == peer },
			nixl.Errorf(nixl.ErrRemoteDisconnect, "loopback: injected disconnect of %q", peer))
	}
}
