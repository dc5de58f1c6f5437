package room

import "github.com/kvxfer/kvxfer/kv"

// Creates reports whether msg, naming a room that has neither a machine nor a
// tombstone, creates the room. The first message naming a room from any side
// does — the sender's Open, decode's TransferInfo or ABORT, a client Abort, a
// Fail — so an ABORT that comes before the sender is remembered. Anything else
// (a chunk, a completion, a deadline, a clear) for an unknown room is dropped.
func Creates(msg Msg) bool {
	switch msg.(type) {
	case Open, TransferInfo, DecodeAbort, Abort, Fail:
		return true
	}
	return false
}

// UnknownReply answers a poll for a room nobody named: Failed. Upstream's
// default of WaitingForInput is what let cleared rooms look live to workers.
var UnknownReply = kv.Reply{Status: kv.StatusFailed, Reason: kv.ReasonInvalidRequest}
