package peer

import "time"

// Msg is one input to a peer's machine.
type Msg interface{ isMsg() }

// Register is a registration frame of the agent from decode (Replay: read
// back from the state file before the socket is read).
type Register struct {
	From   Endpoint
	Replay bool
	// Rejected is set when the registration is refused before any load (its
	// release is not supported, the peer table is full): the reason.
	Rejected string
	// Reg is the registration itself, carried opaquely to Load and Persist.
	Reg any
	// Epoch, when set, numbers the incarnation it starts (a daemon-wide
	// counter, so a transfer can name the incarnation current when it was
	// posted); 0 takes the next number.
	Epoch uint64
	// Confirm: every write of the incarnation waits for a probe begun after
	// it (a decode behind a link that can be cut).
	Confirm bool
}

// LoadDone is the result of the Load of incarnation Inc.
type LoadDone struct {
	Inc uint64
	Err string // "" : loaded
	// At is when it came back (the outage of a decode is measured from
	// here until its first probe is answered).
	At time.Time
}

// Probed is the result of the probe the machine asked for, read At (the
// clock's time when it came back: outages are measured from the last answer).
type Probed struct {
	Result ProbeResult
	At     time.Time
	// Began, when set, is how many Write messages the peer had stepped
	// when the probe began (its connect, not its request): it confirms
	// every write stepped by then. 0: the writes queued when it was asked
	// for.
	Began uint64
}

// LinkLost: the link's monitor saw its TCP connection to decode close.
type LinkLost struct{}

// Write asks to post a transfer (ID) planned at incarnation Inc (one planned
// before the current incarnation fails); Confirm posts it only after a probe
// begun after it was answered.
type Write struct {
	ID      uint64
	Inc     uint64
	Confirm bool
	// Payload is the write itself, carried opaquely: the machine names it
	// by ID in Post and Fail.
	Payload any
	// Staged: a chunk into decode's staging ring; it waits until a Writable
	// names it (its region answered, the watermark past it), or fails with
	// its incarnation, or is withdrawn with its Room.
	Staged bool
	Room   uint64
}

// Writable releases, in the order named, the staged writes whose regions may
// be written now (the executor decides from decode's STAGING_RSP and
// WATERMARK); a released write then goes as any other (held while suspect).
// IDs the machine does not hold waiting are ignored.
type Writable struct{ IDs []uint64 }

// Withdraw ends the staged writes of Room still waiting for their region (the
// room failed: decode may reuse its regions); they are never posted.
type Withdraw struct{ Room uint64 }

// Staging is a staging frame of the agent's decode (STAGING_RSP, WATERMARK)
// or the end of a staged write (its slot is forgotten): the machine changes
// nothing for it; the executor applies Payload while the peer is live.
type Staging struct{ Payload any }

// Info is a transfer info of the agent for a room.
type Info struct {
	Room  uint64
	Abort bool // an ABORT of the room (queued in order with the infos)
	Size  int  // bytes it holds while queued (Config.MaxQueuedBytes)
	// Payload is the frame itself, carried opaquely to the effect.
	Payload any
}

// XferFailed: a transfer posted at incarnation Inc (or, with daemon-wide
// epochs, while the epoch was Inc) failed peer_lost (the NIXL connection to
// the agent is lost). It ends the current incarnation unless that one began
// after the transfer was posted.
type XferFailed struct{ Inc uint64 }

// Deadline fires the armed timer of Kind with generation Gen. Epoch, when
// set, numbers the incarnation a restore it starts takes (as Register.Epoch).
type Deadline struct {
	Kind  DeadlineKind
	Gen   uint32
	Epoch uint64
}

// Drop forgets the peer on the daemon's word (a rolled-back activation,
// another agent took the endpoint): KeepState keeps its stored registration.
type Drop struct {
	Why       string
	KeepState bool
}

// Lost and Back are the daemon's word about a peer, outside its own probes:
// Lost drops the peer, fenced when Fence (an outage decode has given its
// rooms up over); Back ends a fence, loading the peer again from its last
// registration when Alive, else forgetting it (another agent registered at
// its endpoint: whatever the fenced one had is past).
type Lost struct {
	Why   string
	Fence bool
}

type Back struct {
	Alive bool
	Epoch uint64 // as Register.Epoch, for the incarnation a restore starts
}

// Shutdown ends the peer for good.
type Shutdown struct{}

func (Register) isMsg()   {}
func (LoadDone) isMsg()   {}
func (Probed) isMsg()     {}
func (LinkLost) isMsg()   {}
func (Write) isMsg()      {}
func (Info) isMsg()       {}
func (XferFailed) isMsg() {}
func (Deadline) isMsg()   {}
func (Drop) isMsg()       {}
func (Shutdown) isMsg()   {}
func (Lost) isMsg()       {}
func (Back) isMsg()       {}
func (Writable) isMsg()   {}
func (Withdraw) isMsg()   {}
func (Staging) isMsg()    {}
