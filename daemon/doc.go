// Package daemon is kvxferd: one prefill rank's transfer process. It wires the
// actor engine, the NIXL transfer pool, the decode-facing transport (bootstrap
// registration, the ZMQ PULL socket, PUSH links for KV_STATUS and ABORT_ACK)
// and the scheduler-facing control API, and shuts them down in order.
//
// Lifecycle: Start brings up the engine, the control API and (when hosted) the
// bootstrap HTTP server. The rank goes live — ZMQ socket bound, PUT /route
// sent — once the scheduler has registered its KV and aux memory over the
// control API (or a Go caller called Activate): a decode can only register
// after the route exists, so no registration can arrive before the memory it
// targets is known.
package daemon
