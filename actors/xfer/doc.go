// Package xfer is the NIXL transfer actor pool: N actors that turn a room's
// Transfer into SGLang-exact NIXL requests, post them, poll their completion
// (NIXL has no completion callback) with an adaptive back-off, release them
// only once terminal, and report one completion per Transfer back to the room.
//
// A request that never completes is never released: after QuarantineAfter its
// job is moved to a slowly polled quarantine list and counted. The room has
// failed by its own no-progress and drain deadlines long before.
package xfer
