package actors

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/room"
)

// Messages between the Engine, the directory shards and the room actors.

// envelope carries one room message; answers, when the message is a Poll, go
// to answers[index].
type envelope struct {
	room    uint64
	msg     room.Msg
	answers chan<- pollAnswer
	index   int
	sync    bool // a Poll the room itself answers (PollSync)
}

type pollBatch struct {
	rooms   []uint64
	index   []int
	answers chan<- pollAnswer
	sync    bool
}

type pollAnswer struct {
	index int
	reply room.Reply
}

// broadcast goes to every live room of a shard (PeerLost, shutdown).
type broadcast struct{ msg room.Msg }

// retired is a room actor telling its shard that only a tombstone is left.
type retired struct {
	tomb room.Tombstone
	pid  *actor.PID
}

// xferDone and deadline go straight from the pool and the timers to a room.
type xferDone struct {
	seq    uint32
	fail   room.Reason
	signal [][]byte
}

type deadline struct{ gen uint32 }

type sweep struct{}

type statsReq struct{ reply chan<- any }

// dumpReq asks a shard to have up to limit rooms describe themselves (a
// RoomInfo each) on reply; the shard also sends how many it asked (dumpCount).
type dumpReq struct {
	limit int
	reply chan<- any
}

type dumpCount int

// describe asks a room for its RoomInfo; the room answers on reply.
type describe struct{ reply chan<- any }

// view is a room telling its shard what a poll would answer now, and how many
// routed messages it has handled (seen). The shard answers polls from it while
// nothing it routed to the room is still unhandled, so a poll stays ordered
// after the caller's earlier messages without a trip through the room.
type view struct {
	pid   *actor.PID
	room  uint64
	seen  uint32
	reply room.Reply
}
