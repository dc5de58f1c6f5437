package peer

import "time"

// State is where a peer is in its life.
type State uint8

const (
	Absent  State = iota // never registered (or forgotten)
	Loading              // an incarnation's NIXL metadata is being loaded
	Ready                // loaded, probes answered
	Suspect              // loaded, the last probe was not answered: writes are held
	Fenced               // lost to an outage: its infos fail their rooms; probed until it comes back
	Gone                 // dropped (lost, replaced, refused); a registration starts a new incarnation
	Closed               // shutdown: absorbing
)

var stateNames = [...]string{"absent", "loading", "ready", "suspect", "fenced", "gone", "closed"}

func (s State) String() string { return stateNames[s] }

// Live says whether the state has a loaded incarnation (writes may go to it).
func (s State) Live() bool { return s == Ready || s == Suspect }

// Endpoint is a decode's PULL endpoint.
type Endpoint struct {
	IP   string
	Port int
}

// Config are the rules' parameters (durations are only ever armed, never
// measured: the machine has no clock).
type Config struct {
	// Liveness off: no probes, a lost link drops the peer at once.
	NoLiveness bool
	// Interval between probes; SafeAfter is the shortest outage after which
	// decode may have failed its rooms; Budget the outage after which it
	// has; FenceHold how long a fenced endpoint must answer before the peer
	// is loaded again from its last registration.
	Interval, SafeAfter, Budget, FenceHold time.Duration
	// MaxQueued and MaxQueuedBytes bound the transfer infos queued while an
	// incarnation loads (0: no bound).
	MaxQueued, MaxQueuedBytes int
}

// DeadlineKind names one of the machine's timers; each has its own generation.
type DeadlineKind uint8

const (
	ProbeTick   DeadlineKind = iota // the next periodic probe
	Outage                          // SafeAfter, then Budget, since the last answer
	FenceHoldUp                     // a fenced endpoint has answered this long
	numKinds
)

var kindNames = [...]string{"probe", "outage", "fence_hold"}

func (k DeadlineKind) String() string { return kindNames[k] }

// ProbeResult is what one probe found.
type ProbeResult uint8

const (
	ProbeOK          ProbeResult = iota
	ProbeRefused                 // nothing listens: decode's process is gone
	ProbeUnreachable             // no answer in time
)

var probeNames = [...]string{"ok", "refused", "unreachable"}

func (r ProbeResult) String() string { return probeNames[r] }
