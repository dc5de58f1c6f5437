package peer

import "time"

// Effects is everything one Step asks the actor to do, in this order: release
// (an old incarnation leaves NIXL and the pool), fail the rooms, fail the held
// writes, close the link, forget the stored registration; then load, dial,
// persist, route the infos, post the writes, probe, arm the deadlines; notes
// last. Each effect that names an incarnation applies to that one only.
type Effects struct {
	// Release takes incarnation Release out of the pool and NIXL (0: none).
	Release uint64
	// FailRooms: every room of the incarnation that ended fails with Reason.
	FailRooms bool
	Reason    string
	// Fail are the held writes to fail peer_lost; Post those to post now;
	// Withdrawn the staged writes of a failed room, never posted.
	Fail, Post, Withdrawn []uint64
	CloseLink             bool
	Forget                bool // the stored registration goes

	// Load starts loading incarnation Load.Inc (off the actor; LoadDone).
	Load *Load
	Dial bool
	// Persist keeps the registration of the incarnation now ready.
	Persist any
	// Apply are the infos to route to their rooms now, in order (queued ones
	// first); FailInfos fail their rooms before the rooms see them (fenced),
	// and Refuse fail them at once (the loading queue is full, or shutdown).
	Apply, FailInfos, Refuse []Info
	// Probe asks for one probe now (ProbeResult comes back as Probed).
	Probe bool
	// Arms replaces the armed timer of each kind named.
	Arms []Arm
	// Notes are what happened, for counters and logs.
	Notes []Note
}

// Load is one incarnation's NIXL load.
type Load struct {
	Inc      uint64
	Reg      any
	Replay   bool
	Restored bool // loaded again from the fence's registration
}

// Arm (re)arms the timer of Kind: it fires Deadline{Kind, Gen} After from now.
// After 0 disarms it (the generation moves on, so a late fire is stale).
type Arm struct {
	Kind  DeadlineKind
	After time.Duration
	Gen   uint32
}

// Note is one event worth counting or logging.
type Note uint8

const (
	NoteRegistered   Note = iota // an incarnation is ready
	NoteDuplicate                // a registration ignored: first wins
	NoteRejected                 // refused before or by its load
	NoteReturned                 // the same agent from the same endpoint (or restored)
	NoteReplayFailed             // a replayed registration no longer loads: forgotten quietly
	NoteLost                     // the decode was lost (rooms fail peer_lost)
	NoteFenced                   // ... to an outage: fenced
	NoteDropped                  // dropped on the daemon's word or replaced
	NoteQueueRefused             // an info refused: the loading queue is full
	NoteFencedInfo               // an info of a fenced peer failed its room
	NoteStale                    // a late message of an old incarnation, absorbed
)

var noteNames = [...]string{"registered", "duplicate", "rejected", "returned", "replay_failed", "lost", "fenced",
	"dropped", "queue_refused", "fenced_info", "stale"}

func (n Note) String() string { return noteNames[n] }

func (fx *Effects) note(n Note) { fx.Notes = append(fx.Notes, n) }

// Has says whether fx carries note n.
func (fx *Effects) Has(n Note) bool {
	for _, x := range fx.Notes {
		if x == n {
			return true
		}
	}
	return false
}
