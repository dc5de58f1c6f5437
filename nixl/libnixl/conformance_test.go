package libnixl_test

import (
	"testing"

	"github.com/kvxfer/kvxfer/nixl/nixltest"
)

// TestConformance runs the backend-neutral suite over real NIXL (UCX, DRAM)
// with two agents in this process. NIXL has no fault injection, so the
// Fault* cases skip; TestPeerGone covers a real disconnect.
func TestConformance(t *testing.T) {
	nixltest.Run(t, func(t *testing.T) nixltest.Pair {
		return nixltest.Pair{A: newAgent(t, "a"), B: newAgent(t, "b"), Alloc: alloc}
	})
}

// TestGoPanicsRecover: with UCX loaded and its default UCX_HANDLE_ERRORS /
// UCX_ERROR_SIGNALS (SEGV among them), a Go nil dereference must still turn
// into a recoverable runtime panic, not a UCX backtrace and abort.
func TestGoPanicsRecover(t *testing.T) {
	newAgent(t, "sig")
	var p *int
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("no panic")
		}
	}()
	_ = *p
}
