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
	View Reply
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
	Fail Reason
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
	// HoldSignal (last chunk only, Config.HoldCompletion): post the writes
	// without their notifications and hand the notifications back in
	// XferDone.Signal, so the room sends them only if it is still live once
	// every write completed (invariant 10).
	HoldSignal bool
	// PageStart is the chunk's first page in the room's page list (after
	// decode's prefix): SGLang's index_slice.start, which staged writes name.
	PageStart int
	// Staged is set by the transport, never by the room's rules: the decode
	// staging-ring region the chunk's KV goes to instead of its pages
	// (SGLang's staging path; daemon/staging.go).
	Staged *StagedRegion
}

// StagedRegion is a chunk's region of decode's staging ring: its grid slot
// and STAGING_RSP's offset.
type StagedRegion struct {
	ChunkIdx int
	Offset   int64
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
	To           Endpoint
	Reason       Reason
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

// DoneFunc reports the end of one posted Transfer: fail is ReasonNone on
// success; signal is the notifications held back from a HoldSignal transfer's
// writes (nil otherwise).
type DoneFunc func(fail Reason, signal [][]byte)
