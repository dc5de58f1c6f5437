// Package mailbox is a protoactor mailbox that allocates nothing per message.
//
// protoactor's lock-free mailbox (actor.UnboundedLockfree) allocates a queue
// node for every message and a closure every time an idle mailbox is
// scheduled; its ring mailbox (actor.Unbounded) allocates the closure too.
// A room is an actor that lives for a handful of messages, so those were a
// third of the engine's allocations per room. This mailbox keeps its user
// messages in two slices that swap: senders append to one under a mutex (a
// mutex held for an append, as a channel's; no state of the actor is behind
// it), the actor's run drains the other without it, and both keep their
// capacity. Its run function is bound once.
//
// Semantics are protoactor's defaultMailbox's: system messages before user
// messages, SuspendMailbox and ResumeMailbox handled by the mailbox, a yield
// (runtime.Gosched) every Dispatcher.Throughput messages, a panic escalated
// to the invoker with the message that raised it, and the idle/running
// hand-off that never leaves a posted message unscheduled. protoactor's
// actor.MessageBatch is not unpacked (nothing here sends one).
package mailbox
