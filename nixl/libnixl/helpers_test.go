package libnixl_test

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
)

var (
	seq      atomic.Int64
	findOnce sync.Once
	libPath  string
	findErr  error
)

// TestMain pins UCX to transports every CPU-only box has (loopback tcp,
// shared memory and cma, self) unless the caller chose otherwise. UCX's own
// error signal handlers stay at their default (TestGoPanicsRecover).
func TestMain(m *testing.M) {
	setDefault("UCX_TLS", "tcp,self,sm")
	setDefault("NIXL_LOG_LEVEL", "WARN")
	os.Exit(m.Run())
}

func setDefault(k, v string) {
	if _, ok := os.LookupEnv(k); !ok {
		os.Setenv(k, v)
	}
}

// newAgent returns a fresh agent or skips the test when NIXL cannot be found
// or loaded here (CI without the wheel).
func newAgent(t testing.TB, prefix string) *libnixl.Agent {
	t.Helper()
	return newAgentOpts(t, prefix, libnixl.Options{})
}

// newAgentOpts is newAgent with options (Path is filled in).
func newAgentOpts(t testing.TB, prefix string, o libnixl.Options) *libnixl.Agent {
	t.Helper()
	findOnce.Do(func() { libPath, findErr = libnixl.Find("") })
	if findErr != nil {
		t.Skipf("NIXL not available: %v", findErr)
	}
	o.Path = libPath
	a, err := libnixl.New(fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1)), o)
	if err != nil {
		t.Skipf("NIXL could not start: %v", err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return a
}

func alloc(t testing.TB, ag nixl.Agent, n int) []byte {
	t.Helper()
	b, err := ag.(*libnixl.Agent).Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pair is two fresh agents in this process, each with one registered buffer
// of n bytes (src on a, dst on c), c loaded into a as peer, and a channel
// that a's OnProgress wakes (one buffered signal).
type pair struct {
	a, c     *libnixl.Agent
	src, dst []byte
	peer     string
	woke     chan struct{}
}

func newPair(t testing.TB, prefix string, n int) *pair {
	t.Helper()
	p := &pair{a: newAgent(t, prefix+"-a"), c: newAgent(t, prefix+"-c"), woke: make(chan struct{}, 1)}
	p.src, p.dst = alloc(t, p.a, n), alloc(t, p.c, n)
	if _, err := p.a.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(p.src, 0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.c.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(p.dst, 0)}); err != nil {
		t.Fatal(err)
	}
	md, _ := p.c.LocalMetadata()
	var err error
	if p.peer, err = p.a.LoadPeer(md); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.a.OnProgress(func() {
		select {
		case p.woke <- struct{}{}:
		default:
		}
	}))
	return p
}

// whole is a request's descriptor list: all of b.
func whole(b []byte) []nixl.Desc { return []nixl.Desc{nixl.DescOf(b, 0)} }
