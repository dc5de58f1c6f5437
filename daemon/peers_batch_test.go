package daemon

import (
	"reflect"
	"strconv"
	"testing"

	"github.com/kvxfer/kvxfer/actors/peer"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// A run of transfer infos handed over at once (TransferInfos, the ingest's
// BatchSink path) is treated info by info exactly as TransferInfo treats it:
// infos of an agent still loading wait in its actor (in arrival order), a
// fenced agent's room fails peer_lost before it sees the info, any other
// info reaches its room. The same frames through the per-info path give the
// same rooms, queue and counters.
func TestTransferInfosMatchesPerInfo(t *testing.T) {
	type outcome struct {
		replies []kv.Reply
		queued  int
		fenced  int64
	}
	run := func(perInfo bool) outcome {
		perFrameIngest = perInfo
		defer func() { perFrameIngest = false }()
		d := startDaemonWith(t, func(c *Config) { c.NewAgent = newGatedAgent })
		newScheduler(t, d)
		g := d.agent.(*gatedAgent)

		node, err := kvmem.New("loading-"+strconv.FormatInt(seq.Add(1), 10), decodeShape(false), 0, loopback.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { node.Close() })
		release, entered := g.hold(node.Agent.Name())
		t.Cleanup(release) // before the daemon's shutdown, which waits for the load
		loading := newDecodeOn(t, node, nil, d)
		<-entered
		fenced, other := newDecode(t, d), newDecode(t, d)
		for _, dec := range []*decodeRank{fenced, other} {
			waitFor(t, "registered", func() bool { return peerState(t, d, dec.reg.AgentName).State == "ready" })
		}
		d.peers.actors.SendAt(peer.Endpoint(endpointOf(fenced)), peer.Lost{Why: "unreachable past the budget (test)", Fence: true})
		waitFor(t, "fenced", func() bool { return peerState(t, d, fenced.reg.AgentName).State == "fenced" })

		var ids []uint64
		for i := range 12 {
			id := uint64(7000 + i)
			dec := [...]*decodeRank{loading, fenced, other}[i%3]
			dec.send(t, dec.info(id, []int32{1, 2}, 0, 1))
			ids = append(ids, id)
		}
		waitFor(t, "every info handled", func() bool {
			return peerState(t, d, loading.reg.AgentName).Queued == 4 && d.Counters()["fenced_transfer_infos"] == 4 &&
				d.eng.PollSync(ids[2:3], nil)[0] != room.UnknownReply && d.eng.PollSync(ids[11:], nil)[0] != room.UnknownReply
		})
		return outcome{replies: d.eng.PollSync(ids, nil), queued: peerState(t, d, loading.reg.AgentName).Queued,
			fenced: d.Counters()["fenced_transfer_infos"]}
	}
	want, got := run(true), run(false)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("batched %+v\nper info %+v", got, want)
	}
	for i, r := range want.replies {
		id := 7000 + i
		switch i % 3 {
		case 0:
			if r != room.UnknownReply { // queued: no room saw it yet
				t.Fatalf("room %d (queued): %+v", id, r)
			}
		case 1:
			if r.Status != kv.StatusFailed || r.Reason != kv.ReasonPeerLost {
				t.Fatalf("room %d (fenced): %+v", id, r)
			}
		case 2:
			if r.Status != kv.StatusWaitingForInput {
				t.Fatalf("room %d (applied): %+v", id, r)
			}
		}
	}
}
