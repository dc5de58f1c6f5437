package actors

import (
	"testing"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// The shard's admission rules: the live-room cap first, then the decode
// agent's share for rooms a transfer info would create; an Open is charged to
// nobody.
func TestShardAdmitRules(t *testing.T) {
	lim := limits{rooms: 4, peer: 2}
	ti := func(agent string) room.Msg { return room.TransferInfo{Agent: agent, Required: 1} }
	for _, tc := range []struct {
		name  string
		msg   room.Msg
		live  int
		peers map[string]int
		want  refusal
	}{
		{"open under the cap", room.Open{}, 3, nil, admitted},
		{"open at the cap", room.Open{}, 4, nil, roomCap},
		{"open when one agent holds its share", room.Open{}, 2, map[string]int{"d": 2}, admitted},
		{"info under both", ti("d"), 1, map[string]int{"d": 1}, admitted},
		{"info at the agent's share", ti("d"), 2, map[string]int{"d": 2}, peerShare},
		{"another agent's info", ti("e"), 2, map[string]int{"d": 2}, admitted},
		{"info at the cap", ti("e"), 4, map[string]int{"d": 2}, roomCap},
		{"cap before share", ti("d"), 4, map[string]int{"d": 2}, roomCap},
	} {
		if got := lim.admit(tc.msg, tc.live, func(a string) int { return tc.peers[a] }); got != tc.want {
			t.Errorf("%s: admit = %d, want %d", tc.name, got, tc.want)
		}
	}
	if l := shardLimits(10, 3, 4); l.rooms != 3 || l.peer != 1 {
		t.Fatalf("shardLimits(10, 3, 4) = %+v", l)
	}
}

// cap+k transfer infos for unknown rooms: cap rooms live, k refused and
// counted, each refused room Failed/room_cap with decode told at once. Once the
// flood's rooms are cleared, honest rooms (and a refused Open's room, opened
// again) are served.
func TestEngineRoomCapRefusesFloodThenServes(t *testing.T) {
	const roomCap, n = 8, 40
	f := newFixture(t, &transfersDouble{}, func(c *Config) { c.Shards = 2; c.RoomCap = roomCap; c.PeerRoomCap = roomCap })
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(1000 + i)
		f.eng.TransferInfo(ids[i], info("flood", 2, 1))
	}
	f.settle(ids...)
	st := f.eng.Stats()
	if st.RoomCap != roomCap || st.LiveRooms != roomCap || st.RefusedRoomCap != n-roomCap || st.RefusedPeerShare != 0 {
		t.Fatalf("after %d infos: %+v", n, st)
	}
	var live, refused []uint64
	for _, id := range ids {
		switch r := f.poll(id); {
		case r.Status == kv.StatusFailed && r.Reason == kv.ReasonRoomCap:
			refused = append(refused, id)
			if ns := f.notices.Of(id); len(ns) != 1 || ns[0].Kind != room.FailureStatus || ns[0].Reason != kv.ReasonRoomCap {
				t.Fatalf("refused room %d: notices %+v", id, ns)
			}
		case r.Status == kv.StatusWaitingForInput: // as upstream before the sender exists
			live = append(live, id)
		default:
			t.Fatalf("room %d: %v/%v", id, r.Status, r.Reason)
		}
	}
	if len(live) != roomCap || len(refused) != n-roomCap {
		t.Fatalf("%d live, %d refused", len(live), len(refused))
	}

	// While full, an honest Open is refused too: its polls say why.
	const honest = 5000
	f.eng.Open(honest)
	if r := f.poll(honest); r.Status != kv.StatusFailed || r.Reason != kv.ReasonRoomCap {
		t.Fatalf("open at the cap: %v/%v", r.Status, r.Reason)
	}
	if f.eng.Stats().RefusedRoomCap != n-roomCap+1 {
		t.Fatalf("refused open not counted: %+v", f.eng.Stats())
	}

	// The flood's live rooms go (the scheduler clears them).
	for _, id := range live {
		f.eng.Clear(id)
	}
	f.settle(live...)
	if st := f.eng.Stats(); st.LiveRooms != 0 {
		t.Fatalf("after clearing: %+v", st)
	}
	// The scheduler opening a room whose info was refused fails it at once:
	// decode was told.
	f.eng.Open(refused[0])
	if r := f.poll(refused[0]); r.Status != kv.StatusFailed || r.Reason != kv.ReasonRoomCap {
		t.Fatalf("open of a refused decode room: %v/%v", r.Status, r.Reason)
	}
	f.eng.Clear(refused[0])
	// Honest rooms are served again, the refused Open's room included.
	for _, id := range []uint64{honest, honest + 1, honest + 2} {
		f.eng.Open(id)
		f.eng.TransferInfo(id, info("d", 2, 1))
		f.eng.Init(id, 2, 0)
		f.eng.Send(id, []int32{1, 2}, nil)
		f.waitStatus(id, kv.StatusSuccess)
	}
}

// One decode agent's transfer infos create at most its share of the rooms;
// another agent and the scheduler still get theirs, and the share frees up as
// the agent's rooms retire.
func TestEnginePeerShare(t *testing.T) {
	f := newFixture(t, &transfersDouble{}, func(c *Config) { c.Shards = 1; c.RoomCap = 100; c.PeerRoomCap = 4 })
	var flood []uint64
	for id := uint64(1); id <= 20; id++ {
		f.eng.TransferInfo(id, info("flood", 2, 1))
		flood = append(flood, id)
	}
	f.eng.TransferInfo(100, info("honest", 2, 1))
	f.eng.Open(200)
	f.settle(append(flood, 100, 200)...)
	st := f.eng.Stats()
	if st.LiveRooms != 4+2 || st.RefusedPeerShare != 16 || st.RefusedRoomCap != 0 {
		t.Fatalf("share 4: %+v", st)
	}
	if r := f.poll(100); r.Status != kv.StatusWaitingForInput {
		t.Fatalf("honest agent's room: %v/%v", r.Status, r.Reason)
	}
	if r := f.poll(5); r.Status != kv.StatusFailed || r.Reason != kv.ReasonRoomCap {
		t.Fatalf("room beyond the share: %v/%v", r.Status, r.Reason)
	}
	// Rooms the scheduler opened first are charged to nobody: the agent's
	// info joins them whatever its share.
	f.eng.TransferInfo(200, info("flood", 2, 1))
	for _, id := range flood[:4] {
		f.eng.Clear(id)
	}
	f.settle(flood[:4]...)
	for id := uint64(50); id < 54; id++ {
		f.eng.TransferInfo(id, info("flood", 2, 1))
	}
	f.eng.TransferInfo(54, info("flood", 2, 1))
	f.settle(50, 51, 52, 53, 54, 200)
	if r := f.poll(200); r.Status != kv.StatusWaitingForInput {
		t.Fatalf("opened room with the agent's info: %v/%v", r.Status, r.Reason)
	}
	if st := f.eng.Stats(); st.LiveRooms != 4+2 || st.RefusedPeerShare != 17 {
		t.Fatalf("after the share freed up: %+v", st)
	}
}
