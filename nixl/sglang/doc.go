// Package sglang builds NIXL transfers exactly as SGLang's NIXL prefill does
// (protocol spec §5.2), formats and parses its notification strings (§5.3), and
// re-implements decode's completion rule (TransferStatus.is_done) so that tests
// and fake decode peers can judge what the prefill produced.
//
// Geometry is plain data (pointers, item lengths, slot counts) taken from the
// local KV pool and from a decode peer's registration frame; every function
// here is pure over it. The transfer pool owns the nixl.Agent: it prepares the
// lists once (PrepLocalKV, PrepPeerKV), asks a Planner for the requests of a
// chunk, and makes, posts and polls them (MakeReq helps with the first step).
package sglang
