package room

import (
	"fmt"
	"strconv"
	"time"
)

// Status is SGLang's KVPoll. The numeric values are part of the contract: the
// scheduler all-reduces polls with MIN, so Failed must stay 0.
type Status uint8

const (
	Failed          Status = 0
	Bootstrapping   Status = 1
	WaitingForInput Status = 2
	Transferring    Status = 3
	Success         Status = 4
)

// Terminal reports whether s is Success or Failed; both are absorbing.
func (s Status) Terminal() bool { return s == Failed || s == Success }

func (s Status) String() string {
	switch s {
	case Failed:
		return "Failed"
	case Bootstrapping:
		return "Bootstrapping"
	case WaitingForInput:
		return "WaitingForInput"
	case Transferring:
		return "Transferring"
	case Success:
		return "Success"
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

// Reason says why a room failed. It travels to the scheduler, to decode where the
// protocol allows, to metrics and to the trace (as error.type).
type Reason uint8

const (
	ReasonNone Reason = iota
	ReasonDecodeAbort
	ReasonClientAbort
	ReasonBootstrapTimeout
	ReasonWaitingTimeout
	ReasonTransferTimeout
	ReasonTransferError
	ReasonPeerLost
	ReasonInvalidRequest
	ReasonInternalError
	ReasonShutdown
	// ReasonPeerRejected: the decode agent's registration was rejected (an
	// SGLang release kvxferd does not serve, or a layout it cannot check).
	ReasonPeerRejected
	// ReasonRoomCap: kvxferd refused to create the room: its live-room cap, or
	// the decode agent's share of it, was reached (actors.Config.RoomCap).
	ReasonRoomCap
	// ReasonClientLost: the scheduler that opened the room over the
	// shared-memory control path was lost (its process exited, it detached
	// with the room open, or it sent a record that does not decode).
	ReasonClientLost
	// ReasonTransferProcessLost: a previous kvxferd of this rank held the room
	// and was lost; the scheduler names such rooms to its successor (control op
	// lost), which fails them so that their decodes hear of it.
	ReasonTransferProcessLost
	numReasons
)

var reasonNames = [numReasons]string{
	ReasonNone:                "",
	ReasonDecodeAbort:         "decode_abort",
	ReasonClientAbort:         "client_abort",
	ReasonBootstrapTimeout:    "bootstrap_timeout",
	ReasonWaitingTimeout:      "waiting_timeout",
	ReasonTransferTimeout:     "transfer_timeout",
	ReasonTransferError:       "transfer_error",
	ReasonPeerLost:            "peer_lost",
	ReasonInvalidRequest:      "invalid_request",
	ReasonInternalError:       "internal_error",
	ReasonShutdown:            "shutdown",
	ReasonPeerRejected:        "peer_rejected",
	ReasonRoomCap:             "room_cap",
	ReasonClientLost:          "client_lost",
	ReasonTransferProcessLost: "transfer_process_lost",
}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

// Reasons lists every failure reason (ReasonNone excluded), for metrics and tests.
func Reasons() []Reason {
	out := make([]Reason, 0, numReasons-1)
	for r := ReasonNone + 1; r < numReasons; r++ {
		out = append(out, r)
	}
	return out
}

// ParseReason is the inverse of Reason.String.
func ParseReason(s string) (Reason, error) {
	for r := ReasonNone + 1; r < numReasons; r++ {
		if reasonNames[r] == s {
			return r, nil
		}
	}
	return ReasonNone, fmt.Errorf("room: unknown failure reason %q", s)
}

// DeadlineKind names the one deadline a phase waits under.
type DeadlineKind uint8

const (
	NoDeadline DeadlineKind = iota
	BootstrapDeadline
	WaitingDeadline
	TransferDeadline
	DrainDeadline
	LingerDeadline
)

func (k DeadlineKind) String() string {
	return [...]string{"none", "bootstrap", "waiting", "transfer", "drain", "linger"}[k]
}

// Config holds the deadlines. Zero values are not allowed; use DefaultConfig.
type Config struct {
	// Bootstrap bounds the time until the sender exists and every required
	// transfer info arrived (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, 300 s).
	Bootstrap time.Duration
	// Waiting bounds each wait for the scheduler's next chunk once the room is
	// ready (KVXFER_WAITING_TIMEOUT, 300 s: decode gives up after its own 300 s).
	Waiting time.Duration
	// Transfer bounds the time without any transfer completing while transfers
	// are in flight (KVXFER_TRANSFER_TIMEOUT, 60 s).
	Transfer time.Duration
	// Drain bounds how long a failed room waits for posted writes before it tells
	// decode anyway (KVXFER_DRAIN_TIMEOUT, 10 s).
	Drain time.Duration
	// Linger bounds how long a concluded room waits for the scheduler's Clear
	// before it retires to a tombstone, which still answers polls
	// (KVXFER_LINGER_TIMEOUT, 300 s).
	Linger time.Duration

	// HoldCompletion posts the last chunk's writes without their NIXL
	// notifications and sends those (or a success KV_STATUS) only once every
	// write of the room completed while the room was live, so decode never
	// completes a room the scheduler was told failed (invariant 10). Off, the
	// notifications ride on the writes as in SGLang.
	HoldCompletion bool
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		Bootstrap: 300 * time.Second,
		Waiting:   300 * time.Second,
		Transfer:  60 * time.Second,
		Drain:     10 * time.Second,
		Linger:    300 * time.Second,
	}
}

func (c *Config) duration(k DeadlineKind) time.Duration {
	switch k {
	case BootstrapDeadline:
		return c.Bootstrap
	case WaitingDeadline:
		return c.Waiting
	case TransferDeadline:
		return c.Transfer
	case DrainDeadline:
		return c.Drain
	case LingerDeadline:
		return c.Linger
	}
	return 0
}

// Validate rejects non-positive deadlines: a zero deadline would fire at once and
// a negative one would mean "never", which the design forbids.
func (c *Config) Validate() error {
	for k := BootstrapDeadline; k <= LingerDeadline; k++ {
		if c.duration(k) <= 0 {
			return fmt.Errorf("room: %s deadline must be positive, got %v", k, c.duration(k))
		}
	}
	return nil
}

// Endpoint is a decode rank's ZMQ PULL address, as it advertises it in its frames.
type Endpoint struct {
	IP   string
	Port int
}

func (e Endpoint) String() string { return e.IP + ":" + strconv.Itoa(e.Port) }
