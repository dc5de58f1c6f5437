package libnixl_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
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

// TestBackendFromEnv: with Options empty, the plugin and its parameters come
// from SGLang's variables, as in SGLang.
func TestBackendFromEnv(t *testing.T) {
	b := newAgent(t, "env-target") // skips without NIXL
	t.Setenv(libnixl.EnvBackend, "NOPE")
	if _, err := libnixl.New("env-nope", libnixl.Options{}); err == nil || !strings.Contains(err.Error(), `"NOPE" not available`) {
		t.Fatalf("unknown plugin from the environment: %v", err)
	}
	t.Setenv(libnixl.EnvBackend, "UCX")
	t.Setenv(libnixl.EnvBackendParams, `{"num_threads": "2", "split_batch_size": "4"}`)
	a := newAgent(t, "env-ucx-threads")
	src, dst := alloc(t, a, 1<<20), alloc(t, b, 1<<20)
	pattern(src, 5)
	for _, r := range []struct {
		ag  nixl.Agent
		mem []byte
	}{{a, src}, {b, dst}} {
		if _, err := r.ag.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(r.mem, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	md, _ := b.LocalMetadata()
	peer, err := a.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	var ls, rs []nixl.Desc
	for i := range 16 { // 16 descriptors, so the 2-thread engine splits them
		ls = append(ls, nixl.DescOf(src[i<<16:(i+1)<<16], 0))
		rs = append(rs, nixl.DescOf(dst[(15-i)<<16:(16-i)<<16], 0))
	}
	x, err := a.Create(nixl.Write, nixl.DRAM, ls, peer, nixl.DRAM, rs, []byte("threads"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Post(x); err != nil {
		t.Fatal(err)
	}
	waitAll(t, a, x)
	for i := range 16 {
		if !bytes.Equal(src[i<<16:(i+1)<<16], dst[(15-i)<<16:(16-i)<<16]) {
			t.Fatalf("descriptor %d differs", i)
		}
	}
}
