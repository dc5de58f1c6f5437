package main

import (
	"strings"
	"testing"
)

// TestBackendMustBeNamed: kvxferd does not pick a NIXL backend for the
// operator; without -nixl-backend (or with an unknown one) it refuses to start,
// before it binds anything.
func TestBackendMustBeNamed(t *testing.T) {
	env := func(string) string { return "" }
	for _, args := range [][]string{nil, {"-nixl-backend", ""}, {"-nixl-backend", "ucx"}} {
		err := run(args, env)
		if err == nil || !strings.Contains(err.Error(), "-nixl-backend") {
			t.Fatalf("run(%q) = %v, want a -nixl-backend error", args, err)
		}
	}
}
