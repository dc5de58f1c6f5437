package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
)

func TestWatchParent(t *testing.T) {
	var ppid, looks atomic.Int64
	ppid.Store(42)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := watchParent(context.Background(), 42, time.Millisecond, func() int { looks.Add(1); return int(ppid.Load()) }, log)
	// Three looks at a live parent: the watcher decided twice not to stop.
	testrig.Eventually(t, 10*time.Second, "three looks at the parent", func() bool { return looks.Load() >= 3 })
	if ctx.Err() != nil {
		t.Fatal("done while the parent lives")
	}
	ppid.Store(1) // re-parented to init: the starter died
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("not done after the parent died")
	}

	// Already re-parented at start (the starter died before we looked).
	ctx = watchParent(context.Background(), 7, time.Hour, func() int { return 1 }, log)
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("not done at once")
	}

	// The outer context ending stops the watcher.
	outer, cancel := context.WithCancel(context.Background())
	ctx = watchParent(outer, 7, time.Millisecond, func() int { return 7 }, log)
	cancel()
	<-ctx.Done()
}

// SIGKILL of a multi-threaded scheduler: the parent-death signal arrives when
// the forking thread exits, while getppid still names the exiting process;
// its leader is a zombie by then, and that counts as gone.
func TestParentGone(t *testing.T) {
	const parent = 42
	live := func() int { return parent }
	for _, tc := range []struct {
		name  string
		ppid  func() int
		state byte
		err   error
		gone  bool
	}{
		{"re-parented", func() int { return 1 }, 'S', nil, true},
		{"parent running", live, 'R', nil, false},
		{"parent sleeping", live, 'S', nil, false},
		{"leader a zombie, threads exiting", live, 'Z', nil, true},
		{"parent dead", live, 'X', nil, true},
		{"no /proc entry", live, 0, os.ErrNotExist, true},
	} {
		got := parentGone(parent, tc.ppid, func(pid int) (byte, error) {
			if pid != parent {
				t.Fatalf("state of %d asked, want %d", pid, parent)
			}
			return tc.state, tc.err
		})
		if got != tc.gone {
			t.Errorf("%s: gone %v, want %v", tc.name, got, tc.gone)
		}
	}
	if st, err := procState(os.Getpid()); err != nil || st != 'R' && st != 'S' {
		t.Fatalf("our own state %q, %v", st, err)
	}
}
