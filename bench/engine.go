package bench

import (
	"context"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/bench/dict"
	"github.com/kvxfer/kvxfer/kv"
)

// Engine is what the prefill scheduler and the decode ingest call: SGLang's
// NixlKVSender methods keyed by room, plus the decode frames that concern a
// room. The actor engine already has exactly this surface.
type Engine interface {
	// Open: the scheduler created the sender.
	Open(room uint64)
	// Init: sender.init(numPages, auxIndex).
	Init(room uint64, numPages, auxIndex int)
	// Send: sender.send(pages, state), one chunk.
	Send(room uint64, pages []int32, state [][]int32)
	// Poll: sender.poll() for a batch of rooms; out is reused.
	Poll(rooms []uint64, out []kv.Reply) []kv.Reply
	// Abort: sender.abort(), a client abort.
	Abort(room uint64)
	// Clear: the scheduler is done with a terminal room.
	Clear(room uint64)
	// TransferInfo: one decode agent's transfer-info frame.
	TransferInfo(room uint64, ti room.TransferInfo)
	// DecodeAbort: decode's ABORT frame.
	DecodeAbort(room uint64, from kv.Endpoint)
	// Close stops the engine.
	Close(ctx context.Context) error
}

var (
	_ Engine = (*actors.Engine)(nil)
	_ Engine = (*dict.Engine)(nil)
)
