// Package room holds the rules of one transfer room as a plain state machine.
//
// A Machine has no goroutines, no clock and no I/O. Every input is a message
// passed to Step, and every consequence comes back as data in Effects: transfers
// to post, a status to publish, a poll answer, notices for decode, a deadline to
// arm, "retire me". The actor that wraps a Machine (package actors) only executes
// those effects. This is the split etcd-io/raft makes between raft.Step and
// raft.Node, and it is what lets the rules be tested exhaustively: the explorer in
// explorer_test.go walks every causally valid ordering of a bounded message set and
// checks the room invariants of the architecture after every step.
//
// The published status (kv.Status) is SGLang's KVPoll (Failed 0 … Success 4),
// because the prefill scheduler all-reduces polls with MIN. Terminal statuses
// are absorbing. The transition table is in machine.go.
package room
