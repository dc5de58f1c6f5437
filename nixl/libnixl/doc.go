// Package libnixl implements nixl.Agent over the real NIXL library.
//
// It loads libnixl_capi.so (the C API NIXL builds for its Rust bindings and
// ships in the nixl-cu12/nixl-cu13 wheels) with dlopen at run time and calls it
// through function pointers declared here, so building kvxfer needs neither
// NIXL nor its headers; only New fails when the library is absent. See Find
// for how the library is located and docs/libnixl.md for the thread model,
// the error mapping and the limits.
//
// Every NIXL call runs on one owner goroutine locked to its OS thread; the
// agent is created with NIXL's progress thread on and NIXL_THREAD_SYNC_STRICT.
// Because the C API folds most NIXL statuses into one BACKEND code, the agent
// keeps its own request and peer state and enforces nixl.Agent's rules (one
// post in flight, release only when terminal, stale handles after DropPeer)
// before NIXL is called; a BACKEND failure after which NIXL no longer knows
// the peer is reported as nixl.ErrRemoteDisconnect.
package libnixl
