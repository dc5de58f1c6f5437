// Package bench holds the benchmark suite that compares the actor engine with
// faithful ports of the dict-based design it replaces.
//
// Engine is the scheduler- and decode-facing surface all three engines share:
// the actor engine (package actors) and the two dict-based engines of package
// bench/dict (upstream and fixed), all posting their writes through the same
// actors.Transfers, so every figure compares designs, not harnesses.
//
// Target wraps one engine with the controls a scenario needs (the gate its
// writes go through, a fake clock, hooks, a way to let it settle and to count
// what it leaks), and Races lists the deterministic reproductions of the races
// that pin rooms upstream (spec §6.3), reusable by the benchmark tool.
package bench
