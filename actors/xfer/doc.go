// Package xfer is the NIXL transfer actor pool: N actors that turn a room's
// kv.Transfer into SGLang-exact NIXL requests, post them, poll their completion
// (NIXL has no completion callback), release them only once terminal, and
// report one completion per Transfer back to the room.
//
// Waiting: a worker with requests in flight spins, polling through its own
// mailbox (new jobs get in between), for a bounded number of polls without
// progress, or while the agent reports a request due within a millisecond
// (nixl.Dueer), and only while a processor is free (internal/cores): a poll
// that found nothing yields first, and with every core busy the worker parks
// at once, since its spin would take the core from the rooms' work. Then it
// parks: nothing is queued until the agent's wake-up
// (nixl.Waker) says a request changed state, or a timer of at least 1 ms
// fires for the next due time. There is no sub-millisecond timer or sleep.
// An agent that polls its own requests and wakes the worker when one ends
// (nixl.SelfPoller: libnixl, whose every call is a hop onto its owner
// thread) gets no spin: the worker parks after its first poll that found
// nothing done. A job's requests are made and posted in one nixl.InBatch,
// and each poll and the releases it allows in another: one hop each.
//
// Each actor keeps at most Config.MaxInFlight requests posted; later
// transfers wait in its FIFO, and those of a room that failed meanwhile are
// withdrawn (Pool.Withdraw): ended unwritten, so that a failed room drains
// only what was started.
//
// A request that never completes is never released: after QuarantineAfter its
// job is moved to a slowly polled quarantine list and counted. The room has
// failed by its own no-progress and drain deadlines long before. Quarantine
// is decided on Config.Clock alone (the engine's clock), so a fake clock
// drives it deterministically.
package xfer
