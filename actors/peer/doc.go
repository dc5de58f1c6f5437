// Package peer holds the rules of one decode peer (one agent name) as a plain
// state machine, as package room does for a transfer room.
//
// A Machine has no goroutines, no clock and no I/O. Every input is a message
// passed to Step (a registration, a replayed one, a NIXL load's result, a
// probe's result, a link event, a write to post, a transfer info, a failed
// transfer with its incarnation, a deadline, shutdown) and every consequence
// comes back as data in Effects: load or release the NIXL metadata of one
// incarnation, dial or close the link, probe, post or fail held writes, route
// or fail transfer infos, fail the incarnation's rooms peer_lost, persist or
// forget the registration, arm a deadline. The actor that owns a Machine only
// executes those effects, in one place; slow ones (the NIXL load, the probe,
// file writes) run off the actor and come back as messages.
//
// Each registration the machine accepts starts an incarnation (a number that
// only grows). What is loaded, posted and failed is named by incarnation,
// never by agent name alone, so a late result of an old incarnation cannot
// touch the new one, and a peer coming back never inherits the rooms of the
// incarnation before it. At most one load is in flight: a registration that
// arrives while a superseded load is still out waits for its result (which
// is released) before its own load starts.
//
// The machine also watches its decode: it asks for a probe every Interval
// (a ProbeTick deadline), or at once when the link is lost or a write waits
// for a confirmation; a probe's result carries the time it came back, so an
// outage is measured from the last answer. While suspect its writes are held
// (the one queue of held writes, named by ID), past SafeAfter or Budget it is
// fenced, and a fenced peer whose endpoint answers for FenceHold is loaded
// again from its last registration.
//
// A staged write (a chunk into decode's staging ring) is held by the machine,
// with the other held writes and ended with them, until a Writable names it; a Withdraw of its room ends it unwritten, and
// every end of the incarnation fails it. Which regions are writable is the
// actor's to decide (it keeps them); the machine only orders and ends.
//
// The transition table is in machine.go; explorer_test.go walks every
// ordering of a bounded set of peer events and checks the invariants after
// every step.
package peer
