package main

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

func TestWatchParent(t *testing.T) {
	var ppid atomic.Int64
	ppid.Store(42)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := watchParent(context.Background(), 42, time.Millisecond, func() int { return int(ppid.Load()) }, log)
	select {
	case <-ctx.Done():
		t.Fatal("done while the parent lives")
	case <-time.After(20 * time.Millisecond):
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
