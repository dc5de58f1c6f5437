package dict

import (
	"time"

	"github.com/kvxfer/kvxfer/kv"
)

// The fixed variant's repairs (spec §7 "fixed"). Several of them race a write
// from one goroutine against a read from another; each such pair is ordered
// write-then-read on both sides (a store-buffer pattern over mutexes, which are
// sequentially consistent), so at least one side sees the other.

// tomb remembers a room that is gone (cleared) or was never there (ABORT
// before its sender), until its TTL.
type tomb struct {
	until   time.Time
	aborted bool // a decode ABORT for a room not yet opened: fail its Open
	status  kv.Status
	reason  kv.Reason
}

func (e *Engine) tombstoned(id uint64) bool {
	t, ok := e.tombs.get(id)
	return ok && e.clk.Now().Before(t.until)
}

// openFixed inserts Bootstrapping, then reads the tombstone (the ABORT handler
// writes it, then reads the status), then promotes the room if every transfer
// info came before the sender (the bootstrap goroutine stored them, then read
// the status).
func (e *Engine) openFixed(id uint64) {
	if t, ok := e.tombs.get(id); ok && !t.aborted {
		e.tombs.pop(id) // a new incarnation of a cleared room id
	}
	e.update(id, kv.StatusBootstrapping, bySender)
	if t, ok := e.tombs.get(id); ok && t.aborted {
		e.tombs.pop(id)
		e.fail(id, kv.ReasonDecodeAbort, "Aborted by decode-side abort notification.", nil, nil)
		return
	}
	if inner, ok := e.infos.get(id); ok && complete(inner) {
		e.update(id, kv.StatusWaitingForInput, bySender)
	}
}

// mayEnqueue refuses chunks for absent or failed rooms (mooncake's
// add_transfer_request).
func (e *Engine) mayEnqueue(id uint64) bool {
	st, ok := e.status.get(id)
	return ok && st != kv.StatusFailed
}

// clearFixed pops the status first (so a worker recording an error for a room
// it still saw present finds it gone and cleans up after itself), then the
// rest, and leaves a tombstone that absorbs late transfer infos.
func (e *Engine) clearFixed(id uint64) {
	st, had := e.status.pop(id)
	f, _ := e.failures.pop(id)
	e.exceptions.pop(id)
	e.prefix.pop(id)
	e.infos.pop(id)
	if t, ok := e.tombs.get(id); ok && t.aborted {
		return
	}
	if !had {
		st = kv.StatusFailed
	}
	e.tombs.set(id, tomb{until: e.clk.Now().Add(e.cfg.TombstoneTTL), status: st, reason: f.reason})
}

// pollFixed: the bootstrap timeout for a sender still Bootstrapping (as
// mooncake's poll), and Failed rather than a live-looking default for a room
// with no status (a tombstone answers with the room's outcome).
func (e *Engine) pollFixed(id uint64, hasSender bool, born time.Time) kv.Reply {
	st, ok := e.status.get(id)
	if !ok {
		if t, ok := e.tombs.get(id); ok && !t.aborted {
			return kv.Reply{Status: t.status, Reason: t.reason}
		}
		return kv.Reply{Status: kv.StatusFailed, Reason: kv.ReasonInvalidRequest}
	}
	if st == kv.StatusBootstrapping && hasSender && e.clk.Now().Sub(born) >= e.cfg.BootstrapTimeout {
		e.fail(id, kv.ReasonBootstrapTimeout, "Bootstrap timeout", nil, nil)
		st, _ = e.status.get(id)
	}
	return e.reply(id, st)
}

// decodeAbortFixed: a known room that is not terminal fails, and decode gets
// its ABORT_ACK once the room's writes drained; a Success or Failed room acks
// as soon as nothing is in flight; an unknown room gets a tombstone (its Open
// will fail) and an ACK at once.
func (e *Engine) decodeAbortFixed(id uint64, from kv.Endpoint) {
	if _, ok := e.status.get(id); !ok {
		e.tombs.set(id, tomb{until: e.clk.Now().Add(e.cfg.TombstoneTTL), aborted: true,
			status: kv.StatusFailed, reason: kv.ReasonDecodeAbort})
		if _, ok := e.status.get(id); !ok {
			e.ackWhenDrained(id, from)
			return
		}
		// Open inserted the room meanwhile; it may or may not have seen the
		// tombstone, so fail it here too (fail is idempotent).
	}
	e.fail(id, kv.ReasonDecodeAbort, "Aborted by decode-side abort notification.", nil, &from)
}

// fail is the fixed variant's one way to fail a room: an atomic transition to
// Failed (never from Success, never inserting), then the records, then the
// drain bookkeeping that tells decode once nothing is in flight.
func (e *Engine) fail(id uint64, why kv.Reason, msg string, err error, ackTo *kv.Endpoint) {
	changed := false
	e.status.apply(id, func(cur kv.Status, ok bool) (kv.Status, bool) {
		if !ok || cur.Terminal() {
			return cur, false
		}
		changed = true
		return kv.StatusFailed, true
	})
	if !changed {
		if ackTo != nil {
			e.ackWhenDrained(id, *ackTo)
		}
		return
	}
	if err != nil {
		e.exceptions.set(id, err)
	}
	e.record(id, why, msg)
	if !e.status.has(id) { // cleared meanwhile: nobody will pop these
		e.exceptions.pop(id)
		e.failures.pop(id)
	}
	e.markFailed(id, why, ackTo)
}

// dropOrphan: a worker found no status for its room (mooncake pops
// transfer_infos for an absent room).
func (e *Engine) dropOrphan(id uint64) {
	e.infos.pop(id)
	e.prefix.pop(id)
}

// armSweep schedules the sweeper: it expires tombstones, and transfer infos
// whose room never got a sender within the bootstrap timeout (the decode came
// but the request never reached this prefill, or a late info slipped past a
// clear's tombstone).
func (e *Engine) armSweep() {
	e.omu.Lock()
	defer e.omu.Unlock()
	if e.stopped.Load() {
		return
	}
	e.sweeper = e.clk.AfterFunc(e.cfg.SweepInterval, func() {
		e.sweep()
		e.armSweep()
	})
}

func (e *Engine) sweep() {
	now := e.clk.Now()
	e.tombs.deleteIf(func(_ uint64, t tomb) bool { return !now.Before(t.until) })
	for id := range e.infos.snapshot() {
		e.sweepOrphan(id, now)
	}
	for id := range e.prefix.snapshot() {
		e.sweepOrphan(id, now)
	}
	e.omu.Lock()
	for id := range e.orphans {
		if e.status.has(id) || (!e.infos.has(id) && !e.prefix.has(id)) {
			delete(e.orphans, id)
		}
	}
	e.omu.Unlock()
}

func (e *Engine) sweepOrphan(id uint64, now time.Time) {
	if e.status.has(id) {
		return
	}
	e.omu.Lock()
	seen, ok := e.orphans[id]
	if !ok {
		e.orphans[id] = now
	}
	e.omu.Unlock()
	if ok && now.Sub(seen) >= e.cfg.BootstrapTimeout && !e.status.has(id) {
		e.dropOrphan(id)
		e.omu.Lock()
		delete(e.orphans, id)
		e.omu.Unlock()
	}
}
