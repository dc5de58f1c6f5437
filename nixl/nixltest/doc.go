// Package nixltest is the conformance suite for nixl.Agent backends. A backend's
// test calls Run with a function that builds two connected-to-nothing agents;
// the suite registers memory, exchanges metadata, moves bytes and checks every
// NIXL rule the Agent interface documents. Fault-injection cases run only when
// the backend provides Pair.Inject.
package nixltest
