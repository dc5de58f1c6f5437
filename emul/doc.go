// Package emul is the home of kvxfer's peer emulators: stand-ins for the SGLang
// processes on either side of kvxferd, so that the daemon can be exercised end
// to end (make demo, tests) without SGLang, Python or GPUs.
//
//   - emul/workload: the one workload model: the room plan (pages, chunks,
//     prefix hits, dummy ranks, the abort's phase and source) that both
//     emulators derive from the same (seed, index), so two processes agree on
//     every room without talking to each other; the bench driver
//     (bench/workload) plays the same plans and abort vocabulary;
//   - emul/sched: SGLang's prefill scheduler driving kvxferd over the control
//     API (open, init, chunked sends, batched polls, clear, failure_exception,
//     prefill-side aborts) over prefill memory it registers;
//   - emul/decode: an SGLang decode rank (bootstrap queries, registration,
//     transfer infos, completion rule, ABORT, heartbeat), verifying every byte
//     kvxfer writes into its memory; its page free list is the decode-side
//     page model.
//
// cmd/kvxfer-sched, cmd/kvxfer-decode and cmd/kvxfer-demo (make demo) are thin
// commands over these packages. docs/emulators.md describes the flags, the
// workload rule and the summary.
package emul
