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
