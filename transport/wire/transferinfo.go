package wire

import (
	"math"
)

// TransferInfo is one decode rank's per-room destination (§4.3b; upstream
// TransferInfo.from_zmq): frames [GUARD, room, msg[1..8]] at the baseline, plus msg[9]
// is_dummy in the later variant (§9.2).
type TransferInfo struct {
	Room               uint64  // msg[0], 0 <= room < 2^63
	DecodeIP           string  // msg[1]
	DecodePort         int     // msg[2] decode PULL port (where KV_STATUS/ABORT_ACK go)
	AgentName          string  // msg[3] key into the registration table
	DstKVIndices       []int32 // msg[4] int32 LE page ids; empty for a dummy rank
	DstAuxIndex        int     // msg[5]
	RequiredDstInfoNum int     // msg[6]
	// msg[7] pack_int_lists "i", one list per state component; absent/empty -> empty.
	DstStateIndices [][]int32
	// msg[8] tokens already cached on decode. HasDecodePrefixLen false means upstream's
	// None (frame absent or empty), which behaves as 0 everywhere except IsDummy.
	DecodePrefixLen    int
	HasDecodePrefixLen bool
	// msg[9] (later variant): when HasIsDummy, DummyFlag is authoritative.
	HasIsDummy bool
	DummyFlag  bool
}

// Kind implements Inbound.
func (*TransferInfo) Kind() Kind { return KindTransferInfo }

// IsDummy reports whether this rank gets no data for the room (MLA fan-in, non-authoritative
// CP rank). Baseline rule (upstream is_dummy): no page indices and no decode prefix. An
// empty index list with prefix_len > 0 is a full decode-cache hit: not dummy, aux (and
// state) must still be sent. An explicit msg[9] overrides the rule.
func (t *TransferInfo) IsDummy() bool {
	if t.HasIsDummy {
		return t.DummyFlag
	}
	return len(t.DstKVIndices) == 0 && t.DecodePrefixLen == 0
}

const (
	tiRequiredFrames = 7 // msg[0..6]
	tiBaselineFrames = 9
)

// decodeTransferInfo parses frames [GUARD, room, ...].
func decodeTransferInfo(frames [][]byte, d *Decoder) (*TransferInfo, error) {
	f := &fields{kind: KindTransferInfo, frames: frames, base: 1, strs: d}
	t := &TransferInfo{}
	var err error
	if t.Room, err = f.roomAt(0); err != nil {
		return nil, err
	}
	if err := f.need(tiRequiredFrames-1, "required_dst_info_num"); err != nil {
		return nil, err
	}
	if t.DecodeIP, err = f.ascii(1, "endpoint"); err != nil {
		return nil, err
	}
	if t.DecodePort, err = f.port(2, "dst_port"); err != nil {
		return nil, err
	}
	if t.AgentName, err = f.ascii(3, "agent_name"); err != nil {
		return nil, err
	}
	if t.DstKVIndices, err = f.i32s(4, "dst_kv_indices"); err != nil {
		return nil, err
	}
	if t.DstAuxIndex, err = f.nonNeg(5, "dst_aux_index"); err != nil {
		return nil, err
	}
	if t.RequiredDstInfoNum, err = f.nonNeg(6, "required_dst_info_num"); err != nil {
		return nil, err
	}
	if f.present(7) {
		if t.DstStateIndices, err = UnpackIntLists[int32](f.raw(7)); err != nil {
			return nil, f.bad(7, "dst_state_indices", err)
		}
	}
	if f.present(8) {
		if t.DecodePrefixLen, err = f.nonNeg(8, "decode_prefix_len"); err != nil {
			return nil, err
		}
		t.HasDecodePrefixLen = true
	}
	if f.present(9) {
		v, err := f.int(9, "is_dummy", 0, math.MaxInt64)
		if err != nil {
			return nil, err
		}
		t.HasIsDummy, t.DummyFlag = true, v != 0
	}
	return t, nil
}

// Encode returns the frames NixlKVReceiver.send_metadata sends: 10 (GUARD + msg[0..8]) at
// the baseline, 11 when HasIsDummy. An absent prefix length is sent as b"" (upstream
// decode always sends a number; b"" is how older peers' None reads back).
func (t *TransferInfo) Encode() [][]byte {
	out := make([][]byte, 0, tiBaselineFrames+2)
	out = append(out,
		[]byte(TagGuard),
		utoa(t.Room),
		[]byte(t.DecodeIP),
		intb(t.DecodePort),
		[]byte(t.AgentName),
		packI32s(t.DstKVIndices),
		intb(t.DstAuxIndex),
		intb(t.RequiredDstInfoNum),
		PackIntLists(t.DstStateIndices),
	)
	if t.HasDecodePrefixLen {
		out = append(out, intb(t.DecodePrefixLen))
	} else {
		out = append(out, []byte{})
	}
	if t.HasIsDummy {
		d := []byte("0")
		if t.DummyFlag {
			d = []byte("1")
		}
		out = append(out, d)
	}
	return out
}
