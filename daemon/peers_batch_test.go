package daemon

import (
	"reflect"
	"testing"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// A run of transfer infos handed over at once (TransferInfos, the ingest's
// BatchSink path) is treated info by info exactly as TransferInfo treats it,
// in order: infos of an agent still loading are queued (in arrival order, up
// to the queue's cap, then refused: transfer_error), a fenced agent's room
// fails peer_lost before it sees the info, any other info reaches its room.
// The same run through the per-info path gives the same rooms, queue and
// counters.
func TestTransferInfosMatchesPerInfo(t *testing.T) {
	type outcome struct {
		replies         []room.Reply
		queued          []uint64
		fenced, refused int64
	}
	run := func(perInfo bool) outcome {
		d := startDaemon(t, wire.DialectUnknown)
		p := d.peers
		p.mu.Lock()
		loading := &peerEntry{reg: &wire.Registration{AgentName: "loading"}}
		p.byAgent["loading"] = loading
		p.fenced["fenced"] = fenceEntry{}
		p.mu.Unlock()
		var run []*wire.TransferInfo
		var ids []uint64
		for i := range 12 {
			id := uint64(7000 + i)
			agent := [...]string{"loading", "fenced", "other"}[i%3]
			run = append(run, &wire.TransferInfo{Room: id, AgentName: agent, DecodeIP: "127.0.0.1", DecodePort: 9,
				DstKVIndices: []int32{1, 2}, RequiredDstInfoNum: 1})
			ids = append(ids, id)
		}
		// The queue holds one more info, then refuses.
		p.mu.Lock()
		for range maxQueuedFrames - 1 {
			loading.queue = append(loading.queue, queuedFrame{info: &wire.TransferInfo{Room: 1}})
		}
		p.mu.Unlock()
		if perInfo {
			for _, ti := range run {
				p.TransferInfo(ti)
			}
		} else {
			p.TransferInfos(run)
		}
		out := outcome{replies: d.eng.PollSync(ids, nil)}
		p.mu.Lock()
		for _, q := range loading.queue[maxQueuedFrames-1:] {
			out.queued = append(out.queued, q.info.Room)
		}
		// Not loaded for real: nothing may apply these after the test.
		loading.queue, p.queued = nil, 0
		delete(p.byAgent, "loading")
		p.mu.Unlock()
		c := d.Counters()
		out.fenced, out.refused = c["fenced_transfer_infos"], c["queued_frames_refused"]
		return out
	}
	want, got := run(true), run(false)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("batched %+v\nper info %+v", got, want)
	}
	// What the per-info path does (so the comparison cannot pass vacuously).
	if !reflect.DeepEqual(want.queued, []uint64{7000}) || want.refused != 3 || want.fenced != 4 {
		t.Fatalf("per info: queued %v, refused %d, fenced %d", want.queued, want.refused, want.fenced)
	}
	for i, r := range want.replies {
		id := 7000 + i
		switch i % 3 {
		case 0:
			if i == 0 && r != room.UnknownReply { // queued: no room saw it yet
				t.Fatalf("room %d (queued): %+v", id, r)
			}
			if i > 0 && (r.Status != room.Failed || r.Reason != room.ReasonTransferError) {
				t.Fatalf("room %d (queue full): %+v", id, r)
			}
		case 1:
			if r.Status != room.Failed || r.Reason != room.ReasonPeerLost {
				t.Fatalf("room %d (fenced): %+v", id, r)
			}
		case 2:
			if r.Status != room.WaitingForInput {
				t.Fatalf("room %d (applied): %+v", id, r)
			}
		}
	}
}
