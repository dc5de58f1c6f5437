// Package emul is the home of kvxfer's peer emulators: stand-ins for the SGLang
// processes on either side of kvxferd, so that the daemon can be exercised end
// to end (make demo, tests) without SGLang, Python or GPUs.
//
//   - emul/workload: the deterministic per-room plan that both emulators derive
//     from the same (seed, index), so two processes agree on every room without
//     talking to each other;
//   - emul/decode: an SGLang decode rank (bootstrap queries, registration,
//     transfer infos, completion rule, ABORT, heartbeat), verifying every byte
//     kvxfer writes into its memory.
//
// docs/emulators.md describes the flags, the workload rule and the summary.
package emul
