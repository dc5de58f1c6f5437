// Package actors runs every transfer room as a protoactor-go actor over the pure
// state machine in package room. It owns the directory shards that create rooms on
// the first message naming them (each on an actor of its own, reused for a later
// room once it retired) and keep their tombstones, the timers that turn deadlines
// into messages, and the Engine API the rest of kvxfer calls.
//
// Nothing in this package shares a map or takes a lock: each shard owns its map,
// each room owns its state, and all input arrives as mailbox messages.
package actors
