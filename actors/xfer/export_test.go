package xfer

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/internal/clock"
)

// Barrier returns once every pool actor has handled each message queued to
// it before the call: a tick a spinning worker sent itself is handled (and
// queues the next) before Barrier returns, so two Barriers with no poll
// between them prove that no worker is spinning. actor.Touch is answered by
// the actor system after the worker's Receive has ignored it.
func (p *Pool) Barrier() error {
	for _, pid := range p.pids {
		if _, err := p.system.Root.RequestFuture(pid, &actor.Touch{}, 20*time.Second).Result(); err != nil {
			return err
		}
	}
	return nil
}

// SetPace replaces the clock that spaces a parked worker's polls until the
// returned func is called. Call it before New and restore it after Close.
func SetPace(c clock.Clock) (restore func()) {
	old := pace
	pace = c
	return func() { pace = old }
}

// SetCoreFree replaces the free-processor probe until the returned func is
// called.
func SetCoreFree(f func() bool) (restore func()) {
	old := coreFree
	coreFree = f
	return func() { coreFree = old }
}

// SpinTicks is how many empty polls a spinning worker makes before it parks.
const SpinTicks = spinTicks
