package sched_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/daemon"
	"github.com/kvxfer/kvxfer/emul/decode"
	"github.com/kvxfer/kvxfer/emul/sched"
	"github.com/kvxfer/kvxfer/emul/workload"
)

// TestSchedulerAgainstKvxferdAndDecode runs the scheduler emulator against an
// in-process kvxferd and the decode emulator with an abort-heavy workload in
// the ack protocol, over the shared-memory ring and table and over
// request/reply: every room must end as its plan implies on both sides,
// with nothing pinned and every decode byte verified.
func TestSchedulerAgainstKvxferdAndDecode(t *testing.T) {
	for _, path := range []sched.Path{sched.PathShm, sched.PathReqRep} {
		t.Run(string(path), func(t *testing.T) { schedulerAgainstKvxferdAndDecode(t, path) })
	}
}

// schedulerAgainstKvxferdAndDecode is one run over path: the shared-memory
// ring and table, or request/reply.
func schedulerAgainstKvxferdAndDecode(t *testing.T, path sched.Path) {
	dir, err := os.MkdirTemp("", "kvxs") // ipc paths are limited to 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	d, err := daemon.Start(daemon.Config{HostIP: "127.0.0.1", ServeBootstrap: true,
		ControlEndpoint: "ipc://" + filepath.Join(dir, "ctl.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	}()
	wl := workload.Default(7)
	wl.AbortShare, wl.DummyShare, wl.PrefixShare = 0.4, 0.2, 0.2
	const rooms = 300

	dc := decode.DefaultConfig()
	dc.Bootstrap, dc.Workload, dc.Rooms, dc.Concurrency = d.BootstrapAddr(), wl, rooms, 16
	dc.Release, dc.WaitingTimeout, dc.TopologyRetry, dc.TopologyAttempts = decode.Release0521, 20*time.Second, 10*time.Millisecond, 1000
	dec, err := decode.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()

	sh := dc.Shape // both sides must agree on the page geometry (equal TP)
	done := make(chan *decode.Summary, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		if err := dec.Start(ctx); err != nil {
			t.Error(err)
			done <- nil
			return
		}
		done <- dec.Run(ctx)
	}()
	results, sum, err := sched.Run(sched.Config{Control: d.ControlEndpoint(), Workload: wl, Rooms: rooms,
		Concurrency: 16, Grace: 60 * time.Second, Shape: sh, Path: path})
	if err != nil {
		t.Fatal(err)
	}
	ds := <-done
	if ds == nil {
		t.FailNow()
	}
	if len(results) != rooms || sum.Pinned != 0 || len(sum.Unexpected) != 0 {
		t.Fatalf("scheduler: %d results, %d pinned, unexpected %v", len(results), sum.Pinned, sum.Unexpected)
	}
	for _, r := range results {
		p := workload.Config(wl).Plan(indexOf(wl, r.Room, rooms))
		switch {
		case p.Abort == workload.AbortNone && r.Status.String() != "Success":
			t.Fatalf("room %d without an abort plan ended %v/%v", r.Room, r.Status, r.Reason)
		case p.Abort.ByPrefill() && r.Status.String() != "Failed":
			t.Fatalf("room %d aborted by the scheduler ended %v", r.Room, r.Status)
		}
	}
	if ds.WrongBytes != 0 || ds.AuxErrors != 0 || ds.PagesHeld != 0 || ds.Unexpected != 0 || ds.Rooms != rooms {
		t.Fatalf("decode summary: %+v", ds)
	}
}

func indexOf(wl workload.Config, room uint64, n int) int {
	for i := range n {
		if wl.Plan(i).Room == room {
			return i
		}
	}
	return -1
}
