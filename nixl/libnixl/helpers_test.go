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
	findOnce.Do(func() { libPath, findErr = libnixl.Find("") })
	if findErr != nil {
		t.Skipf("NIXL not available: %v", findErr)
	}
	a, err := libnixl.New(fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1)), libnixl.Options{Path: libPath})
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
