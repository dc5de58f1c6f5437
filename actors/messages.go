package actors

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// Messages between the Engine, the directory shards and the room actors.

// envelope carries one room message; answers, when the message is a Poll, go
// to answers[index].
//
// Its flags come last, together: 64 bytes (a size class) where each flag
// padded to a word made it 80.
type envelope struct {
	room    uint64
	msg     room.Msg
	answers chan<- pollAnswer
	index   int
	trace   string // an Open's W3C traceparent (Engine.OpenTraced)
	sync    bool   // a Poll the room itself answers (PollSync)
	// bounced: sent back by a room that retired before handling it, for
	// the shard to route to its tombstone (counted in directory.bouncing).
	bounced bool
}

type pollBatch struct {
	rooms   []uint64
	index   []int
	answers chan<- pollAnswer
	sync    bool
}

type pollAnswer struct {
	index int
	reply kv.Reply
}

// broadcast goes to every live room of a shard (PeerLost, shutdown).
type broadcast struct{ msg room.Msg }

// retired is a room actor telling its shard that only a tombstone is left,
// at the time of the step that retired it (the tombstone's TTL runs from
// there: the step's reading of the clock, which the room's record took for
// its retirement, so the shard need not read the clock again).
type retired struct {
	tomb room.Tombstone
	pid  *actor.PID
	at   time.Time
}

// postDone is one posted transfer's completion. Its done function (fn, what
// Transfers.Post gets) records the outcome; a completion inside Post is taken
// by the room when Post returns (no message, and the postDone is reused), a
// later one is sent to the room as this message. state says which: the room
// and the done function each try to move it from postInCall.
type postDone struct {
	lr     *live // the room's shard entry: a room actor serves rooms in turn
	seq    uint32
	fail   kv.Reason
	signal [][]byte
	state  atomic.Uint32
	fn     kv.DoneFunc
}

const (
	postInCall   uint32 = iota // Post has not returned, done not called
	postReturned               // Post returned first: done sends the message
	postSync                   // done was called inside Post
)

// xferDone is a completion the room steps.
type xferDone struct {
	seq    uint32
	fail   kv.Reason
	signal [][]byte
}

// deadline is a room's timer firing.
type deadline struct{}

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

// liveReq asks a shard for its live rooms by status (a LiveRooms on reply).
type liveReq struct{ reply chan<- any }

// abandonReq asks a shard to have every live room hand its Observer record
// over as abandoned (see RoomObserver.Abandoned); like dumpReq, the rooms
// answer abandoned{} each and the shard the count.
type abandonReq struct{ reply chan<- any }

// stopRooms asks a shard (Engine.Close) to stop its live room actors; it
// answers on reply once every room actor it spawned has terminated, retired
// ones included.
type stopRooms struct{ reply chan<- any }

// abandonMsg asks a room to hand its record over as abandoned; it answers
// abandoned{} on reply.
type abandonMsg struct{ reply chan<- any }

type abandoned struct{}

// view is what a room tells its shard, through shared atomics instead of a
// message per change: what a poll would answer now, and how many routed
// messages it has handled. The room writes it; the shard reads it and
// answers polls from it while nothing it routed to the room is unhandled, so
// a poll stays ordered after the caller's earlier messages without a trip
// through the room.
type view struct {
	state  atomic.Uint64 // seen<<32 | status<<8 | reason
	prefix atomic.Int32  // Reply.PrefixLen
	// flags: viewHanded, the record was handed over (Retired or Abandoned,
	// or the shard closed a dead room's story): whoever sets it first owns
	// the record's last call; viewRetired, the room retired: a completion
	// that comes later goes to Observer.LateTransferDone.
	flags atomic.Uint32
}

const (
	viewHanded uint32 = 1 << iota
	viewRetired
)

// hand reports whether the caller is the first to hand the record over.
func (v *view) hand() bool { return v.flags.Or(viewHanded)&viewHanded == 0 }

func packView(seen uint32, r kv.Reply) uint64 {
	return uint64(seen)<<32 | uint64(r.Status)<<8 | uint64(r.Reason)
}

// load returns how many messages the room has handled and its reply; ok is
// false when the reply's PrefixLen does not fit the view (a poll must then
// ask the room).
func (v *view) load() (seen uint32, r kv.Reply, ok bool) {
	st := v.state.Load()
	p := v.prefix.Load()
	return uint32(st >> 32), kv.Reply{Status: kv.Status(st >> 8), Reason: kv.Reason(st), PrefixLen: int(p)}, p != noPrefix
}

// noPrefix marks a PrefixLen outside what the view holds.
const noPrefix = math.MinInt32

func (v *view) store(seen uint32, r kv.Reply) {
	p := int32(noPrefix)
	if r.PrefixLen > noPrefix && r.PrefixLen <= math.MaxInt32 {
		p = int32(r.PrefixLen)
	}
	v.prefix.Store(p) // before state: a reader that sees state sees it
	v.state.Store(packView(seen, r))
}

// LiveRooms counts live rooms by the status a poll answers
// (index kv.Status), and gives the creation time of the oldest that is
// neither Success nor Failed (zero if none), on the engine's clock.
type LiveRooms struct {
	ByStatus          [5]int
	NonTerminal       int
	OldestNonTerminal time.Time
}
