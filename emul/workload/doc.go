// Package workload is the room plan shared by the decode emulator and the
// prefill-side scheduler emulator. Both run in separate processes and never talk
// to each other: they agree on every room only because each derives it from the
// same (seed, index) with the pure functions here. Change the rule and both sides
// change together; the rule is written out in docs/emulators.md so that an
// emulator in another language can reproduce it.
package workload
