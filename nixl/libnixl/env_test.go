package libnixl

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
)

// These tests need no NIXL: they cover how the backend and the library are
// chosen before anything is loaded.

func TestEnvParams(t *testing.T) {
	t.Setenv(EnvBackendParams, "")
	if m, err := envParams(); err != nil || len(m) != 0 {
		t.Fatalf("unset: %v %v", m, err)
	}
	t.Setenv(EnvBackendParams, `{"num_threads": "8", "ucx_error_handling_mode": "none"}`)
	m, err := envParams()
	if err != nil || m["num_threads"] != "8" || m["ucx_error_handling_mode"] != "none" || len(m) != 2 {
		t.Fatalf("parsed %v, %v", m, err)
	}
	for _, bad := range []string{`{"num_threads": 8}`, `[1]`, `not json`} {
		t.Setenv(EnvBackendParams, bad)
		if _, err := envParams(); !errors.Is(err, nixl.ErrInvalid) {
			t.Fatalf("%s: %v, want ErrInvalid (SGLang takes strings only)", bad, err)
		}
	}
}

func TestFindExplicit(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, libName)
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{lib, dir} {
		if got, err := Find(p); err != nil || got != lib {
			t.Fatalf("Find(%q) = %q, %v", p, got, err)
		}
	}
	t.Setenv(EnvLibrary, dir)
	if got, err := Find(""); err != nil || got != lib {
		t.Fatalf("Find via $%s = %q, %v", EnvLibrary, got, err)
	}
	t.Setenv(EnvLibrary, filepath.Join(dir, "nowhere"))
	t.Setenv(EnvPython, filepath.Join(dir, "no-python"))
	t.Setenv("PATH", dir) // no python3 either
	if got, err := Find(""); err == nil {
		if !strings.HasPrefix(got, "/opt/nvidia/") {
			t.Fatalf("Find with nothing installed = %q", got)
		}
	} else if !strings.Contains(err.Error(), EnvLibrary) {
		t.Fatalf("error should say how to fix it: %v", err)
	}
}

func TestNewBadName(t *testing.T) {
	if _, err := New("", Options{}); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("empty name: %v", err)
	}
}
