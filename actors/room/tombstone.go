package room

import "github.com/kvxfer/kvxfer/kv"

// Tombstone is what is kept of a retired room: enough to absorb late messages of
// its incarnation, to answer a late poll, and to fail a sender that is opened
// after the room already failed (an ABORT that came before the sender).
type Tombstone struct {
	Room   uint64
	Status kv.Status
	Reason kv.Reason
	Opened bool
	// Poisoned: the drain deadline expired, so a write may still land in
	// decode's pages; a late ABORT gets no ACK.
	Poisoned bool
}

// Tombstone returns the compact form of a retired machine.
func (m *Machine) Tombstone() Tombstone {
	return Tombstone{Room: m.room, Status: m.status, Reason: m.reason, Opened: m.opened, Poisoned: m.drainExpired}
}

// FromTombstone rebuilds a retired machine so that a late message can be
// stepped through the same rules as a live one.
func FromTombstone(cfg *Config, t Tombstone) *Machine {
	return &Machine{cfg: cfg, room: t.Room, phase: retired, status: t.Status, reason: t.Reason, opened: t.Opened, drainExpired: t.Poisoned}
}
