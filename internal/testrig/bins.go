package testrig

import (
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// RepoRoot is the repository's root directory (found from this file's
// path, so it holds in every package's test binary).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// BinDir is where the built commands are: $KVXFER_BIN, else bin/ at the
// repository root. It fails the test, telling how to build them (hint: the
// make target), when one of names is missing.
func BinDir(t testing.TB, hint string, names ...string) string {
	t.Helper()
	dir := os.Getenv("KVXFER_BIN")
	if dir == "" {
		dir = filepath.Join(RepoRoot(), "bin")
	}
	dir, _ = filepath.Abs(dir)
	for _, b := range names {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("%s missing in %s: run %s (it builds bin/)", b, dir, hint)
		}
	}
	return dir
}

// FreePort returns a TCP port nothing listens on at host now.
func FreePort(t testing.TB, host string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
