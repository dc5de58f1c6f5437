package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// MemKind is a NIXL memory kind of one decode KV buffer (registration msg[17]).
type MemKind string

const (
	MemVRAM MemKind = "VRAM"
	MemDRAM MemKind = "DRAM"
)

// Registration is a decode rank's KV-args registration (§4.3a; upstream
// KVArgsRegisterInfo.from_zmq): frames [GUARD, "None", msg[1..18]] at the baseline, plus
// msg[19..22] in the later variant (§9.2). The decoder applies every upstream fallback,
// so callers never see "absent": the fields below are always usable as they are.
type Registration struct {
	DecodeIP      string     // msg[1]  decode local_ip
	DecodePort    int        // msg[2]  decode PULL port
	AgentName     string     // msg[3]  decode NIXL agent name (key of the peer table)
	AgentMetadata []byte     // msg[4]  opaque, for add_remote_agent; aliases the frame
	KVDataPtrs    []uint64   // msg[5]
	AuxDataPtrs   []uint64   // msg[6]
	StateDataPtrs [][]uint64 // msg[7]  absent/empty -> empty
	GPUID         int        // msg[8]
	DecodeTPSize  int        // msg[9]  decode attn_tp_size
	DecodeTPRank  int        // msg[10] decode engine_rank
	DstKVItemLen  int        // msg[11] kv_item_lens[0]

	StateItemLens     [][]uint32 // msg[12] absent/empty -> empty
	StateDimPerTensor [][]uint32 // msg[13] absent/empty -> empty
	// msg[14] (8-byte u64; any other length reads as 0, as upstream) and msg[15] (ASCII).
	// Both zero means the decode has no staging buffer.
	StagingBasePtr   uint64
	StagingTotalSize int64
	// msg[16] dst_num_slots; HasDstNumSlots false (absent or empty) means "use prefill's".
	DstNumSlots    int
	HasDstNumSlots bool
	// msg[17]: one kind per KV pointer; absent/empty -> all VRAM.
	KVMemKinds []MemKind
	// msg[18]: one item length per KV pointer; absent/empty -> DstKVItemLen for each.
	KVItemLens []uint64

	// Later variant (§9.2). HasLayerInfo is true when msg[19..] were present and parsed;
	// otherwise the fields hold the baseline meaning (empty ids, dcp 1/0).
	HasLayerInfo  bool
	StateLayerIDs [][]uint32 // msg[19] pack_int_lists "I"
	KVLayerIDs    []uint32   // msg[20] concatenated u32
	DCPSize       int        // msg[21] absent/empty -> 1
	DCPRank       int        // msg[22] absent/empty -> 0
	// LayerInfoErr is set when frames from msg[19] on exist but do not parse as the §9.2
	// layout (other forks put other data there). They are then ignored, as a baseline
	// prefill ignores trailing frames, and the registration itself is still accepted.
	LayerInfoErr error

	// SGLang 0.5.23: msg[23] state_data_lens, pack_int_lists "Q" (empty -> none).
	HasStateDataLens bool
	StateDataLens    [][]uint64

	// Frames is the number of frames after GUARD as received: it tells the
	// decode's release apart (DialectOf).
	Frames int
}

// Kind implements Inbound.
func (*Registration) Kind() Kind { return KindRegistration }

const (
	regBaselineFrames = 19 // msg[0..18]
	regLaterFrames    = 23 // msg[0..22]
	regRequiredFrames = 12 // msg[0..11] are indexed unconditionally upstream
)

// decodeRegistration parses frames [GUARD, "None", ...].
func decodeRegistration(frames [][]byte) (*Registration, error) {
	f := &fields{kind: KindRegistration, frames: frames, base: 1}
	if err := f.need(regRequiredFrames-1, "dst_kv_item_len"); err != nil {
		return nil, err
	}
	r := &Registration{Frames: len(frames) - 1}
	var err error
	if r.DecodeIP, err = f.ascii(1, "endpoint"); err != nil {
		return nil, err
	}
	if r.DecodePort, err = f.port(2, "dst_port"); err != nil {
		return nil, err
	}
	if r.AgentName, err = f.ascii(3, "agent_name"); err != nil {
		return nil, err
	}
	r.AgentMetadata = f.raw(4)
	if r.KVDataPtrs, err = f.u64s(5, "dst_kv_ptrs"); err != nil {
		return nil, err
	}
	if r.AuxDataPtrs, err = f.u64s(6, "dst_aux_ptrs"); err != nil {
		return nil, err
	}
	if f.present(7) {
		if r.StateDataPtrs, err = UnpackIntLists[uint64](f.raw(7)); err != nil {
			return nil, f.bad(7, "dst_state_data_ptrs", err)
		}
	}
	if r.GPUID, err = f.nonNeg(8, "gpu_id"); err != nil {
		return nil, err
	}
	if r.DecodeTPSize, err = f.nonNeg(9, "decode_tp_size"); err != nil {
		return nil, err
	}
	if r.DecodeTPRank, err = f.nonNeg(10, "decode_tp_rank"); err != nil {
		return nil, err
	}
	if r.DstKVItemLen, err = f.nonNeg(11, "dst_kv_item_len"); err != nil {
		return nil, err
	}
	if f.present(12) {
		if r.StateItemLens, err = UnpackIntLists[uint32](f.raw(12)); err != nil {
			return nil, f.bad(12, "dst_state_item_lens", err)
		}
	}
	if f.present(13) {
		if r.StateDimPerTensor, err = UnpackIntLists[uint32](f.raw(13)); err != nil {
			return nil, f.bad(13, "dst_state_dim_per_tensor", err)
		}
	}
	if f.has(14) && len(f.raw(14)) == 8 {
		r.StagingBasePtr = binary.LittleEndian.Uint64(f.raw(14))
	}
	if f.present(15) {
		if r.StagingTotalSize, err = f.int(15, "staging_total_size", 0, math.MaxInt64); err != nil {
			return nil, err
		}
	}
	if f.present(16) {
		if r.DstNumSlots, err = f.nonNeg(16, "dst_num_slots"); err != nil {
			return nil, err
		}
		r.HasDstNumSlots = true
	}
	if r.KVMemKinds, err = decodeMemKinds(f, len(r.KVDataPtrs)); err != nil {
		return nil, err
	}
	if f.present(18) {
		if r.KVItemLens, err = f.u64s(18, "dst_kv_item_lens"); err != nil {
			return nil, err
		}
		if len(r.KVItemLens) != len(r.KVDataPtrs) {
			return nil, f.bad(18, "dst_kv_item_lens", fmt.Errorf("%d item lens for %d kv ptrs", len(r.KVItemLens), len(r.KVDataPtrs)))
		}
	} else {
		r.KVItemLens = make([]uint64, len(r.KVDataPtrs))
		for i := range r.KVItemLens {
			r.KVItemLens[i] = uint64(r.DstKVItemLen)
		}
	}
	r.DCPSize = 1
	if f.has(19) {
		if err := decodeLayerInfo(f, r); err != nil {
			r.StateLayerIDs, r.KVLayerIDs, r.DCPSize, r.DCPRank = nil, nil, 1, 0
			r.LayerInfoErr = err
		} else {
			r.HasLayerInfo = true
		}
	}
	if f.has(23) && r.HasLayerInfo {
		// kvxfer does not use the lengths; a frame that does not parse is
		// ignored like a bad layer-info tail, and Frames still counts it.
		if !f.present(23) {
			r.HasStateDataLens = true
		} else if lens, err := UnpackIntLists[uint64](f.raw(23)); err == nil {
			r.HasStateDataLens = true
			if len(lens) > 0 {
				r.StateDataLens = lens
			}
		}
	}
	return r, nil
}

// decodeMemKinds is upstream _unpack_kv_mem_kinds: empty -> all VRAM, else exactly one
// "VRAM"/"DRAM" per KV pointer, comma separated.
func decodeMemKinds(f *fields, n int) ([]MemKind, error) {
	out := make([]MemKind, n)
	if !f.present(17) {
		for i := range out {
			out[i] = MemVRAM
		}
		return out, nil
	}
	s, err := f.ascii(17, "dst_kv_mem_kinds")
	if err != nil {
		return nil, err
	}
	parts := strings.Split(s, ",")
	if len(parts) != n {
		return nil, f.bad(17, "dst_kv_mem_kinds", fmt.Errorf("%d kinds for %d kv ptrs", len(parts), n))
	}
	for i, p := range parts {
		k := MemKind(p)
		if k != MemVRAM && k != MemDRAM {
			return nil, f.bad(17, "dst_kv_mem_kinds", fmt.Errorf("unsupported memory kind %q", clip([]byte(p))))
		}
		out[i] = k
	}
	return out, nil
}

func decodeLayerInfo(f *fields, r *Registration) error {
	var err error
	if f.present(19) {
		if r.StateLayerIDs, err = UnpackIntLists[uint32](f.raw(19)); err != nil {
			return f.bad(19, "dst_state_layer_ids", err)
		}
	}
	if f.present(20) {
		if r.KVLayerIDs, err = f.u32s(20, "dst_kv_layer_ids"); err != nil {
			return err
		}
	}
	if f.present(21) {
		if r.DCPSize, err = f.nonNeg(21, "dst_dcp_size"); err != nil {
			return err
		}
	}
	if f.present(22) {
		if r.DCPRank, err = f.nonNeg(22, "dst_dcp_rank"); err != nil {
			return err
		}
	}
	return nil
}

// Encode returns the registration as NixlKVReceiver._register_kv_args sends it: 20 frames
// (GUARD + msg[0..18]) at the baseline, 24 when HasLayerInfo (SGLang 0.5.18-0.5.22),
// 25 when HasStateDataLens too (0.5.23).
func (r *Registration) Encode() [][]byte {
	n := regBaselineFrames
	if r.HasLayerInfo {
		n = regLaterFrames + 1
	}
	out := make([][]byte, 0, n+1)
	out = append(out,
		[]byte(TagGuard),
		[]byte(TagNone),
		[]byte(r.DecodeIP),
		intb(r.DecodePort),
		[]byte(r.AgentName),
		append([]byte{}, r.AgentMetadata...),
		packU64s(r.KVDataPtrs),
		packU64s(r.AuxDataPtrs),
		PackIntLists(r.StateDataPtrs),
		intb(r.GPUID),
		intb(r.DecodeTPSize),
		intb(r.DecodeTPRank),
		intb(r.DstKVItemLen),
		PackIntLists(r.StateItemLens),
		PackIntLists(r.StateDimPerTensor),
	)
	if r.StagingBasePtr == 0 && r.StagingTotalSize == 0 {
		out = append(out, []byte{}, []byte{})
	} else {
		out = append(out, packU64s([]uint64{r.StagingBasePtr}), itoa(r.StagingTotalSize))
	}
	if r.HasDstNumSlots {
		out = append(out, intb(r.DstNumSlots))
	} else {
		out = append(out, []byte{})
	}
	kinds := make([]string, len(r.KVMemKinds))
	for i, k := range r.KVMemKinds {
		kinds[i] = string(k)
	}
	out = append(out, []byte(strings.Join(kinds, ",")), packU64s(r.KVItemLens))
	if r.HasLayerInfo {
		out = append(out, PackIntLists(r.StateLayerIDs), packU32s(r.KVLayerIDs), intb(r.DCPSize), intb(r.DCPRank))
		if r.HasStateDataLens {
			if len(r.StateDataLens) == 0 {
				out = append(out, []byte{})
			} else {
				out = append(out, PackIntLists(r.StateDataLens))
			}
		}
	}
	return out
}
