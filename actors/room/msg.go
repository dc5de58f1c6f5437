package room

import "github.com/kvxfer/kvxfer/kv"

// Msg is one input to a room. Every input is a message, time included: a
// deadline arrives as Deadline, never as a clock read.
type Msg interface{ msg() }

// Scheduler side (SGLang's NixlKVSender calls).

// Open says the prefill scheduler created the sender for this room.
type Open struct{}

// Init is sender.init(num_kv_indices, aux_index): the page count still to send
// (after decode's prefix) and the prefill metadata-buffer slot.
type Init struct {
	NumPages int
	AuxIndex int
}

// Send is sender.send(page_indices, state_indices): one chunk of prefill pages.
// The slices are not copied; the caller must not modify them afterwards.
type Send struct {
	Pages []int32
	State [][]int32
}

// Poll asks for the published status; the answer comes back in Effects.Reply.
type Poll struct{}

// Abort is the scheduler's sender.abort() (a client abort).
type Abort struct{}

// Clear is sender.clear(): the scheduler is done with the room.
type Clear struct{}

// Decode side (frames from decode ranks, decoded by transport).

// TransferInfo is one decode agent's transfer info frame for this room.
type TransferInfo struct {
	Agent     string
	From      kv.Endpoint // decode's PULL endpoint, for KV_STATUS / ABORT_ACK
	DstPages  []int32
	DstAux    int
	Required  int // required_dst_info_num
	DstState  [][]int32
	PrefixLen int
	Dummy     bool
	// Refused is set when the agent's registration was refused (peer_rejected):
	// the room records where decode is, to tell it, and fails in the same step,
	// so no write can be posted for the info (a post that failed synchronously
	// used to fail the room invalid_request before a separate Fail arrived).
	Refused kv.Reason
}

// DecodeAbort is decode's ABORT frame for this room. Gen is the deferred-release
// generation of SGLang 0.5.22+ (a fifth frame; HasGen false when absent): the
// ABORT_ACK must echo it or decode ignores the ACK.
type DecodeAbort struct {
	From   kv.Endpoint
	Gen    uint64
	HasGen bool
}

// PeerLost says a decode agent is gone (metadata dropped, link dead).
type PeerLost struct{ Agent string }

// Transfer pool and wrapper.

// XferDone reports that transfer Seq of this room ended; Fail is ReasonNone on
// success, else why it failed (ReasonTransferError, ReasonPeerLost, ...).
// Signal is the completion notifications the pool held back from a HoldSignal
// transfer's writes.
type XferDone struct {
	Seq    uint32
	Fail   kv.Reason
	Signal [][]byte
}

// Deadline is the wrapper's timer firing for the deadline armed with Gen.
// Deadlines of older generations are stale and ignored.
type Deadline struct{ Gen uint32 }

// Fail fails the room from outside its rules: engine shutdown, or a panic
// recovered in the wrapper (ReasonInternalError).
type Fail struct{ Reason kv.Reason }

func (Open) msg()         {}
func (Init) msg()         {}
func (Send) msg()         {}
func (Poll) msg()         {}
func (Abort) msg()        {}
func (Clear) msg()        {}
func (TransferInfo) msg() {}
func (DecodeAbort) msg()  {}
func (PeerLost) msg()     {}
func (XferDone) msg()     {}
func (Deadline) msg()     {}
func (Fail) msg()         {}
