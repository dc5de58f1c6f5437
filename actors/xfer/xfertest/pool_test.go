package xfertest

import (
	"testing"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

func TestHoldReleaseAndTicks(t *testing.T) {
	g := New()
	var got []kv.Reason
	done := func(f kv.Reason, _ [][]byte) { got = append(got, f) }
	g.Post(kv.Transfer{Room: 1, Chunk: 0}, done) // completes at once
	g.Hold(Room(1))
	g.Post(kv.Transfer{Room: 1, Chunk: 1}, done)
	g.Post(kv.Transfer{Room: 2, Chunk: 0}, done)
	if len(got) != 2 || g.Held(1) != 1 {
		t.Fatalf("completed %v, held %d", got, g.Held(1))
	}
	mark := g.Tick()
	g.Hold(nil)
	g.Post(kv.Transfer{Room: 1, Chunk: 2}, done)
	if n := g.Release(1, kv.ReasonTransferError); n != 1 || got[len(got)-1] != kv.ReasonTransferError {
		t.Fatalf("release: %d, %v", n, got)
	}
	if g.LandedAfter(1, mark) != 1 || g.PostedAfter(1, mark) != 1 {
		t.Fatalf("landed %d posted %d after the mark", g.LandedAfter(1, mark), g.PostedAfter(1, mark))
	}
	if err := g.WaitPosts(1, 3); err != nil {
		t.Fatal(err)
	}
	g.ReleaseAll()
	if g.Held(1) != 0 {
		t.Fatal("still held")
	}
}

func TestNotices(t *testing.T) {
	var n Notices
	n.Notify(1, room.Notice{Kind: room.AbortAck})
	n.Notify(1, room.Notice{Kind: room.FailureStatus})
	if n.Count(1, room.AbortAck) != 1 || len(n.Of(1)) != 2 || len(n.Of(2)) != 0 {
		t.Fatalf("%+v", n.Of(1))
	}
}
