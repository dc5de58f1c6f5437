// Package dict ports SGLang's dict-based NIXL prefill manager (NixlKVManager in
// prefill mode plus its NixlKVSender objects, spec §2.3, §5.2, §6 and §7) to Go,
// so the actor engine can be benchmarked against the design it replaces and the
// races that pin rooms upstream can be replayed on demand.
//
// One Engine type carries two variants, because the honest comparison is the
// difference between them and nothing else:
//
//   - Upstream follows spec §7 rules 1–13 exactly, bugs included: shared maps
//     whose single operations are atomic (the GIL) but whose read-modify-write
//     sequences are not, a bootstrap goroutine fed by a channel that stands in
//     for the PULL socket, N transfer workers with per-room FIFO queues, no
//     bootstrap timeout, no tombstones, and decode never told of a failure.
//     Config.NonStickyFailed restores the pre-#30352 status rule.
//   - Fixed is the best repair that keeps the dicts (§7 "fixed" variant, the
//     later upstream and mooncake): sticky terminals with atomic status
//     updates, worker skip and enqueue refusal for absent or failed rooms, no
//     status inserts from the bootstrap goroutine or workers, tombstones with a
//     TTL, the bootstrap timeout, and decode told only once in-flight writes
//     drained.
//
// Hooks at named points let tests widen a race window deterministically: a hook
// may block its goroutine until the test has delivered the input that races it.
package dict
