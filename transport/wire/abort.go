package wire

import (
	"math"
)

// Abort is decode's ABORT notification (§4.3c): [b"ABORT", room, decode_ip, decode_port],
// plus [generation] from SGLang 0.5.22 when decode armed its deferred release. We accept
// 2 to 5 frames (and ignore more), because the room alone is enough to fail it and an
// abort must never be lost to a formatting quirk; a bad generation reads as absent, as in
// SGLang's own parser.
type Abort struct {
	Room uint64
	// The decode endpoint (its PULL socket), where an ABORT_ACK would go (§9.2).
	// HasEndpoint is false when frames 2-3 are absent or unparseable; EndpointErr says why
	// in the latter case. Neither makes the abort itself invalid.
	DecodeIP    string
	DecodePort  int
	HasEndpoint bool
	EndpointErr error
	// Generation is the 5th frame (HasGen); the ABORT_ACK must echo it.
	Generation uint64
	HasGen     bool
}

// Kind implements Inbound.
func (*Abort) Kind() Kind { return KindAbort }

func decodeAbort(frames [][]byte) (*Abort, error) {
	f := &fields{kind: KindAbort, frames: frames}
	a := &Abort{}
	var err error
	if a.Room, err = f.roomAt(1); err != nil {
		return nil, err
	}
	if !f.has(3) {
		if f.has(2) {
			a.EndpointErr = f.fail(3, "decode_port", detail(ErrTooFewFrames, "ip without port"))
		}
		return a, nil
	}
	ip, err := f.ascii(2, "decode_ip")
	if err != nil {
		a.EndpointErr = err
		return a, nil
	}
	port, err := f.port(3, "decode_port")
	if err != nil {
		a.EndpointErr = err
		return a, nil
	}
	a.DecodeIP, a.DecodePort, a.HasEndpoint = ip, port, true
	if f.has(4) {
		if g, err := ParsePyInt(f.raw(4)); err == nil && g >= 0 {
			a.Generation, a.HasGen = uint64(g), true
		}
	}
	return a, nil
}

// Encode returns the frames CommonKVReceiver._send_abort_notification sends (4 frames),
// or only [ABORT, room] when HasEndpoint is false.
func (a *Abort) Encode() [][]byte {
	out := [][]byte{[]byte(TagAbort), utoa(a.Room)}
	if a.HasEndpoint {
		out = append(out, []byte(a.DecodeIP), intb(a.DecodePort))
		if a.HasGen {
			out = append(out, utoa(a.Generation))
		}
	}
	return out
}

// Watermark is decode's staging watermark [b"WATERMARK", round, tail, session_id] (§4.3d).
// kvxfer does not implement staging: callers accept and drop it. Decoding never fails;
// Err records what could not be parsed, for logging.
type Watermark struct {
	Round, Tail int64
	SessionID   string
	Err         error
}

// Kind implements Inbound.
func (*Watermark) Kind() Kind { return KindWatermark }

func decodeWatermark(frames [][]byte) *Watermark {
	f := &fields{kind: KindWatermark, frames: frames}
	w := &Watermark{}
	w.Round, w.Err = f.int(1, "round", math.MinInt64, math.MaxInt64)
	if w.Err == nil {
		w.Tail, w.Err = f.int(2, "tail", math.MinInt64, math.MaxInt64)
	}
	if w.Err == nil {
		w.SessionID, w.Err = f.ascii(3, "session_id")
	}
	return w
}

// Encode implements Inbound.
func (w *Watermark) Encode() [][]byte {
	return [][]byte{[]byte(TagWatermark), itoa(w.Round), itoa(w.Tail), []byte(w.SessionID)}
}

// StagingRsp is decode's staging allocation reply
// [b"STAGING_RSP", room, chunk_idx, offset, round, end, session_id] (§4.3d); offset -2
// means ALLOC_OVERSIZED. Accepted and dropped like Watermark; decoding never fails.
type StagingRsp struct {
	Room                         uint64
	ChunkIdx, Offset, Round, End int64
	SessionID                    string
	Err                          error
}

// Kind implements Inbound.
func (*StagingRsp) Kind() Kind { return KindStagingRsp }

func decodeStagingRsp(frames [][]byte) *StagingRsp {
	f := &fields{kind: KindStagingRsp, frames: frames}
	s := &StagingRsp{}
	s.Room, s.Err = f.roomAt(1)
	ints := []struct {
		dst  *int64
		name string
	}{{&s.ChunkIdx, "chunk_idx"}, {&s.Offset, "offset"}, {&s.Round, "round"}, {&s.End, "end"}}
	for i, x := range ints {
		if s.Err != nil {
			return s
		}
		*x.dst, s.Err = f.int(2+i, x.name, math.MinInt64, math.MaxInt64)
	}
	if s.Err == nil {
		s.SessionID, s.Err = f.ascii(6, "session_id")
	}
	return s
}

// Encode implements Inbound.
func (s *StagingRsp) Encode() [][]byte {
	return [][]byte{[]byte(TagStagingRsp), utoa(s.Room), itoa(s.ChunkIdx), itoa(s.Offset),
		itoa(s.Round), itoa(s.End), []byte(s.SessionID)}
}
