// Package testrig is what kvxfer's tests share to wait and to run processes:
// Eventually, a wait that always has a deadline and names what it waited for
// when it fails, and Proc, a child process (kvxferd, a decode emulator, the
// scheduler emulator) whose output goes to a log file, that dies with the test
// binary and is stopped by the test's cleanup.
//
// It imports only the standard library, so that any package's tests, the
// transport's internal ones included, can use it without an import cycle.
// The prefill scheduler's memory, which needs the control API, is in
// testrig/schedmem.
package testrig
