package room

import "time"

// Effects is everything one Step asks the wrapper to do, in this order: post the
// transfers, publish the status, answer the poll, send the notices, arm the
// deadline (replacing the armed one), retire.
type Effects struct {
	Posts []Transfer

	// Published is set when the status visible to the scheduler changed.
	Published bool
	Status    Status
	Reason    Reason

	// Reply answers a Poll.
	Reply *Reply

	Notices []Notice

	// Arm, when Kind is not NoDeadline, replaces the armed deadline.
	Arm Arm

	// Retire: the room is done; keep only its tombstone.
	Retire bool
	// Revived: a retired room came back to life (an Open for a room that a
	// tombstone remembers); the directory must give it an actor again.
	Revived bool
	// Ignored counts a message the room absorbed without effect (late or
	// duplicate frames, stale deadlines), for metrics.
	Ignored bool
}

// Transfer is one chunk for one decode agent: the pool turns it into NIXL
// requests (KV, then on the last chunk state and aux) and reports one XferDone.
type Transfer struct {
	Room     uint64
	Seq      uint32
	Agent    string
	Chunk    int // chunk id: counts the room's sent chunks from 0
	Last     bool
	SrcPages []int32
	DstPages []int32
	// Set on the last chunk only.
	SrcAux, DstAux     int
	SrcState, DstState [][]int32
}

// NoKV reports whether this is a last chunk without pages (decode's prefix
// covered everything), which SGLang signals with the aux_nokv notification.
func (t *Transfer) NoKV() bool { return len(t.SrcPages) == 0 }

// Reply is the answer to a Poll.
type Reply struct {
	Status    Status
	Reason    Reason
	PrefixLen int // decode_prefix_len from the transfer infos (pop_decode_prefix_len)
}

// NoticeKind is a message for decode, sent only when decode speaks the "ack"
// protocol version (spec §9.2): KV_STATUS with a failure, or ABORT_ACK.
type NoticeKind uint8

const (
	FailureStatus NoticeKind = iota + 1
	AbortAck
)

// Notice is a message for one decode endpoint, emitted only once no posted write
// for the room is outstanding (or the drain deadline expired: DrainExpired).
type Notice struct {
	Kind         NoticeKind
	To           Endpoint
	Reason       Reason
	DrainExpired bool
}

// Arm asks the wrapper to fire Deadline{Gen} after After.
type Arm struct {
	Kind  DeadlineKind
	Gen   uint32
	After time.Duration
}
