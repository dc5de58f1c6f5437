// Package nixl defines the Agent interface that mirrors NIXL's cost structure
// (register once, prepare descriptor lists once per peer, then make, post and poll
// transfers by index lists), its typed errors, and the descriptor types.
//
// Sub-packages:
//   - loopback: a pure-Go backend over shared memory, usable in one process or
//     across processes on one host, with fault injection;
//   - nixltest: the conformance suite every backend must pass;
//   - sglang: SGLang-exact descriptors, the per-chunk transfer planner,
//     notification strings and decode's completion rule.
//
// A libnixl (cgo) backend can implement Agent one call to one nixl_capi_* call;
// see docs/nixl.md.
package nixl
