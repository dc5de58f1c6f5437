// Package workload is the one workload model of kvxfer's drivers: the room plan
// (Plan: pages, chunks, prefix hit, decode ranks, abort, arrival) and the abort
// vocabulary (Phase × Source = AbortKind) shared by the prefill scheduler
// emulator (emul/sched), the decode emulator (emul/decode), the demo built from
// them, and the bench driver (bench/workload, whose Spec draws these plans).
//
// The emulators run in separate processes and never talk to each other: they
// agree on every room only because each derives it from the same (seed, index)
// with the pure functions here (Config.Plan). Change the rule and both sides
// change together; the rule is written out in docs/emulators.md so that an
// emulator in another language can reproduce it.
package workload
