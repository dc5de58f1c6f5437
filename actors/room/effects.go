package room

import (
	"time"

	"github.com/kvxfer/kvxfer/kv"
)

// Effects is everything one Step asks the wrapper to do, in this order: post the
// transfers, publish the status, answer the poll, send the notices, arm the
// deadline (replacing the armed one), retire.
type Effects struct {
	Posts []kv.Transfer

	// Published is set when the status visible to the scheduler changed.
	Published bool
	Status    kv.Status
	Reason    kv.Reason

	// Reply answers a Poll.
	Reply *kv.Reply

	Notices []Notice

	// Arm, when Kind is not NoDeadline, replaces the armed deadline.
	Arm Arm

	// Withdraw: the room failed with transfers in flight. A transport that
	// still holds some of them unstarted (a staged chunk waiting for its
	// region) may drop them instead of writing for a failed room; it still
	// reports an XferDone for each.
	Withdraw bool

	// Retire: the room is done; keep only its tombstone.
	Retire bool
	// Revived: a retired room came back to life (an Open for a room that a
	// tombstone remembers); the directory must give it an actor again.
	Revived bool
	// Ignored counts a message the room absorbed without effect (late or
	// duplicate frames, stale deadlines), for metrics.
	Ignored bool

	// What the outside sees of the step besides what it must do: the
	// directory view, the scheduler's status table and telemetry read it.

	// View is what a poll of the room answers after the step.
	View kv.Reply
	// Info: the step was a decode transfer info that reached the live room
	// (used or not).
	Info InfoSeen
	// Done: the step was the completion of a transfer that reached the live
	// room (one it had posted or not).
	Done DoneSeen
	// Tomb is the room's tombstone, when Retire is set.
	Tomb Tombstone
}

// InfoSeen is a transfer info a live room received: its agent and
// required_dst_info_num.
type InfoSeen struct {
	Seen     bool
	Agent    string
	Required int
}

// DoneSeen is a transfer completion a live room received: its sequence number
// and failure (ReasonNone: success).
type DoneSeen struct {
	Seen bool
	Seq  uint32
	Fail kv.Reason
}

// NoticeKind is a message for decode. The room emits every notice its rules
// call for; the transport sends each in the form the decode's SGLang release
// reads (or not at all where that release reads nothing).
type NoticeKind uint8

const (
	// FailureStatus: KV_STATUS "0" with the reason.
	FailureStatus NoticeKind = iota + 1
	// AbortAck: ABORT_ACK, echoing the ABORT's generation when it had one.
	AbortAck
	// Completion: the room succeeded; decode may complete it. Carries the held
	// completion notifications for that agent (Signal), and becomes KV_STATUS
	// "4" for releases that complete on it.
	Completion
)

func (k NoticeKind) String() string {
	switch k {
	case FailureStatus:
		return "status"
	case AbortAck:
		return "ack"
	case Completion:
		return "done"
	}
	return "notice?"
}

// Notice is a message for one decode endpoint, emitted only once no posted write
// for the room is outstanding (or the drain deadline expired: DrainExpired).
type Notice struct {
	Kind         NoticeKind
	To           kv.Endpoint
	Reason       kv.Reason
	DrainExpired bool

	// AbortAck: the ABORT's generation (SGLang 0.5.22+), echoed when HasGen.
	Gen    uint64
	HasGen bool

	// Completion: the decode agent, and the NIXL notifications the pool held
	// back from its last chunk's writes (nil when they were not held).
	Agent  string
	Signal [][]byte
}

// Arm asks the wrapper to fire Deadline{Gen} after After.
type Arm struct {
	Kind  DeadlineKind
	Gen   uint32
	After time.Duration
}
