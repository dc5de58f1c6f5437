package kv

import (
	"fmt"
	"strconv"
)

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
	return ReasonNone, fmt.Errorf("kv: unknown failure reason %q", s)
}
