package testrig

import (
	"testing"
	"time"
)

// Poll is how often Eventually checks its condition: often enough that a
// wait costs little more than the event, seldom enough not to starve the
// code under test on a loaded two-core machine.
const Poll = time.Millisecond

// Eventually waits until cond holds, failing the test after within with a
// message naming what it waited for. The deadline bounds a hang; it decides
// nothing the test checks.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(within, cond) {
		t.Fatalf("waited %v for %s", within, what)
	}
}

// Until waits until cond holds and reports whether it did within the limit,
// for waits whose failure the caller reports itself (a harness returning an
// error, a figure recorded as a result).
func Until(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Poll)
	}
	return true
}
