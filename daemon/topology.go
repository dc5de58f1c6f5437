package daemon

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvxfer/kvxfer/nixl/sglang"
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
	if dialect == wire.Dialect0523 {
		g.Rules = sglang.Rules0523
	}
}
