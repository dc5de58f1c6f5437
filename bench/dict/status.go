package dict

import (
	"github.com/kvxfer/kvxfer/kv"
)

// writer says which goroutine writes a status. Upstream does not care; Fixed
// lets only the sender's creation insert a room.
type writer uint8

const (
	bySender writer = iota
	byBootstrap
	byWorker
)

// update is update_status (rule 1).
//
// Upstream (NIXL L637-641 over common L250-265): if the current value is
// Failed, return (sticky, unless NonStickyFailed); then, reading the dict
// again, an absent room takes any status but Failed, Failed overwrites, and
// anything else merges with max. Each read and write is its own atomic
// operation, so another goroutine's write can land between them: the window
// the UpdateBetweenReadAndWrite hook opens.
//
// Fixed: one atomic read-modify-write; Success and Failed are both absorbing;
// only the sender's creation may insert a room.
func (e *Engine) update(id uint64, s kv.Status, w writer) {
	if e.fixed {
		e.status.apply(id, func(cur kv.Status, ok bool) (kv.Status, bool) {
			switch {
			case !ok:
				return s, s != kv.StatusFailed && w == bySender
			case cur.Terminal():
				return cur, false
			case s == kv.StatusFailed:
				return kv.StatusFailed, true
			}
			return max(cur, s), true
		})
		return
	}
	if cur, ok := e.status.get(id); ok && cur == kv.StatusFailed && !e.cfg.NonStickyFailed {
		return
	}
	e.hooks.at(Event{Point: UpdateBetweenReadAndWrite, Room: id, Status: s})
	cur, ok := e.status.get(id)
	switch {
	case !ok:
		if s != kv.StatusFailed {
			e.status.set(id, s)
		}
	case s == kv.StatusFailed:
		e.status.set(id, kv.StatusFailed)
	default:
		e.status.set(id, max(cur, s))
	}
}

// check is NIXL's check_status (rule 2): request_status.get(room,
// WaitingForInput). The default makes a cleared room look live to a worker.
func (e *Engine) check(id uint64) kv.Status {
	if st, ok := e.status.get(id); ok {
		return st
	}
	return kv.StatusWaitingForInput
}

// record is record_failure (failure_records under failure_lock: one operation).
func (e *Engine) record(id uint64, why kv.Reason, msg string) {
	e.failures.set(id, failure{reason: why, msg: msg})
}
