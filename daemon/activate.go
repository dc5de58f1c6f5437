package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/transport/bootstrap"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// Memory registration and activation hold no lock while they call NIXL or the
// network, so that a slow NIXL call or PUT /route stalls nothing else that
// needs d.mu. d.mu guards only the fields; one register_memory or Activate at
// a time holds the memBusy turn, and a second one is refused at once instead
// of waiting behind the first's NIXL calls or PUT /route.

// rollbackPeers bounds how long a rollback waits for the peers' loads.
const rollbackPeers = 10 * time.Second

var errMemBusy = errors.New("another memory registration is being processed; retry when it has answered")

// beginMem takes the memBusy turn.
func (d *Daemon) beginMem() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.closing:
		return errors.New("shutting down")
	case d.live.Load():
		return errors.New("memory is already registered and the rank is live; restart kvxferd to change it")
	case d.memBusy:
		return errMemBusy
	}
	d.memBusy = true
	return nil
}

func (d *Daemon) endMem() {
	d.mu.Lock()
	d.memBusy = false
	d.mu.Unlock()
}

// backend is the NIXL agent and the pool (either may be nil).
func (d *Daemon) backend() (Agent, *xfer.Pool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.agent, d.pool
}

// now is the engine's clock's time (the liveness measure and the logs).
func (d *Daemon) now() time.Time {
	if c := d.cfg.Engine.Clock; c != nil {
		return c.Now()
	}
	return clock.Real{}.Now()
}

// registerRank sends PUT /route (Daemon.putRoute replaces it in tests).
func (d *Daemon) registerRank(ctx context.Context, url string, reg bootstrap.RankRegistration, opt bootstrap.RegisterOptions) error {
	if d.putRoute != nil {
		return d.putRoute(ctx, url, reg, opt)
	}
	return bootstrap.RegisterRank(ctx, url, reg, opt)
}

// rollback is what an activation started, to undo if it fails.
type rollback struct {
	agent  Agent
	regs   []nixl.RegID
	pool   *xfer.Pool
	ingest *zmqio.Ingest
	replay [][][]byte
}

// rollback undoes a failed activation, last step first: the ZMQ socket stops
// (no more decode frames), registrations still loading finish, every decode
// agent the activation accepted (replayed or registered meanwhile) is dropped
// from the pool and NIXL with its link and probe, the pool stops, the memory
// is deregistered from NIXL. The state file keeps its records (they are
// replayed by the next activation). The bootstrap server is never told: PUT
// /route is the last step, so a failed activation has not registered the
// rank (unless the server applied a PUT whose answer was lost; decodes then
// find the closed port refused and fail their rooms at once).
func (d *Daemon) rollback(rb *rollback) {
	if rb.ingest != nil {
		rb.ingest.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), rollbackPeers)
	if err := d.peers.dropAll(ctx); err != nil {
		d.log.Warn("rollback: decode peers still loading past the deadline", "err", err)
	}
	cancel()
	d.links.retireAll()
	d.xfers.pool.Store(nil)
	d.mu.Lock()
	d.pool, d.ingest = nil, nil
	d.replay = rb.replay
	d.mu.Unlock()
	if rb.pool != nil {
		rb.pool.Close()
	}
	for _, id := range rb.regs {
		_ = rb.agent.Deregister(id)
	}
	d.counters.activationsRolledBack.Add(1)
	d.log.Warn("activation failed and was rolled back: the rank is not live", "decode_agents_dropped", true)
}
