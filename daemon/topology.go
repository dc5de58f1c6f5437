package daemon

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// Topology is what this prefill rank's KV pool says about its place in the
// model, beyond the rank layout (Config.Rank): the numbers SGLang's prefill
// reads from its KVArgs to serve decodes of another TP size or PP layout
// (docs/sglang-compat.md, topologies).
type Topology struct {
	// KVHeadNum is this rank's KV heads (kv_args.kv_head_num, MHA) and
	// TotalKVHeads the model's (total_kv_head_num; 0: KVHeadNum × tp size).
	// Needed for decodes of another TP size (head slicing); without them such
	// a decode is refused at registration.
	KVHeadNum, TotalKVHeads int
	// StartLayer is this PP stage's first model layer (prefill_start_layer).
	StartLayer int
	// KVLayerIDs is the model layer of each registered KV buffer
	// (kv_layer_ids; empty for plain pools): with a decode's ids they pair
	// buffers by layer, which a PP stage needs to write a whole-model decode.
	KVLayerIDs []int
	// AllCPRanks: every CP rank transfers its share
	// (SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER). Off, a CP rank other than
	// 0 is a dummy sender: its rooms succeed without a decode (cpDummyEngine).
	AllCPRanks bool
}

// ParseLayerIDs reads "0,1,2,3" (or "") into layer ids.
func ParseLayerIDs(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("layer id %q: not a layer number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// applyTopology fills the local geometry's topology fields from the config.
func (d *Daemon) applyTopology(local *sglang.Local) error {
	t := d.cfg.Topology
	r := d.cfg.Rank
	local.TPRank = r.TPRank
	local.PageSize = d.cfg.PageSize
	local.PPSize = r.PPSize
	local.StartLayer = t.StartLayer
	local.KVHeadNum, local.TotalKVHeads = t.KVHeadNum, t.TotalKVHeads
	local.KVLayerIDs = t.KVLayerIDs
	if n := len(t.KVLayerIDs); n > 0 && n != len(local.KV.Ptrs) {
		return fmt.Errorf("-kv-layer-ids has %d ids for %d KV buffers", n, len(local.KV.Ptrs))
	}
	return nil
}

// peerTopology adds what a decode's registration says about its place in the
// model to the peer geometry: its TP rank, layer ids, DCP size, and the
// release whose prefill rules apply (0.5.23's differ for PP + MLA).
func peerTopology(g *sglang.PeerGeometry, r *wire.Registration, dialect wire.Dialect) {
	g.TPRank = r.DecodeTPRank
	g.KVLayerIDs = r.KVLayerIDs
	g.DCPSize = r.DCPSize
	g.StateItemLens = r.StateItemLens
	if dialect == wire.Dialect0523 {
		g.Rules = sglang.Rules0523
	}
}

// cpDummyAgent is the agent of the transfer info a dummy CP rank's rooms get.
const cpDummyAgent = "kvxferd-dummy-cp-rank"

// dummyCP says this rank is one of SGLang's dummy CP ranks
// (CommonKVManager.is_dummy_cp_rank): context parallel, not CP rank 0, and
// not every CP rank transferring (SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER).
// Decode pulls from CP rank 0 only, so no decode ever sends this rank a
// transfer info.
func (d *Daemon) dummyCP() bool {
	r := d.cfg.Rank
	return r.CPSize > 1 && r.CPRank != 0 && !d.cfg.Topology.AllCPRanks
}

// cpDummyEngine is the control API's engine on a dummy CP rank. As SGLang's
// sender does there (WaitingForInput at once, Success after the last chunk,
// nothing sent), every room the scheduler opens gets a dummy transfer info of
// its own: the room needs no decode, transfers nothing, and succeeds when its
// last chunk is sent. Everything else is the engine's.
type cpDummyEngine struct{ ctlEngine }

func (e cpDummyEngine) Open(roomID uint64) { openDummy(e.Engine, roomID, nil) }

func (e cpDummyEngine) OpenTraced(roomID uint64, traceparent string) {
	openDummy(e.Engine, roomID, &traceparent)
}

// dummyOpener is what opens a room: the engine, or a batch of it.
type dummyOpener interface {
	Open(roomID uint64)
	OpenTraced(roomID uint64, traceparent string)
	TransferInfo(roomID uint64, ti room.TransferInfo)
}

// openDummy opens a room (traced when traceparent is set) and gives it its
// dummy transfer info.
func openDummy(o dummyOpener, roomID uint64, traceparent *string) {
	if traceparent != nil {
		o.OpenTraced(roomID, *traceparent)
	} else {
		o.Open(roomID)
	}
	o.TransferInfo(roomID, room.TransferInfo{Agent: cpDummyAgent, Required: 1, Dummy: true})
}

// NewRecordBatch is the engine's batch with the same dummy transfer info
// after each open.
func (e cpDummyEngine) NewRecordBatch() control.RecordBatch { return dummyBatch{e.Engine.NewBatch()} }

// dummyBatch is cpDummyEngine's open for a batch of records.
type dummyBatch struct{ *actors.Batch }

func (b dummyBatch) Open(roomID uint64) { openDummy(b.Batch, roomID, nil) }

func (b dummyBatch) OpenTraced(roomID uint64, traceparent string) {
	openDummy(b.Batch, roomID, &traceparent)
}

// controlEngine is the engine the control API drives.
func (d *Daemon) controlEngine(eng *actors.Engine) control.Engine {
	if d.dummyCP() {
		return cpDummyEngine{ctlEngine{eng}}
	}
	return ctlEngine{eng}
}
