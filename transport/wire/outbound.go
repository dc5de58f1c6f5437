package wire

import (
	"math"

	"github.com/kvxfer/kvxfer/kv"
)

// KVStatus is the later variant's prefill->decode status push (§9.2):
// [b"KV_STATUS", room, str(int(status)), prefill_rank, reason_utf8]. Only send it to a
// decode known to run the listener thread; a baseline decode never reads it.
type KVStatus struct {
	Room        uint64
	Status      kv.Status
	PrefillRank int // SGLang's _prefill_unique_rank(), not the notification sender id
	Reason      string
}

// Kind implements Outbound.
func (*KVStatus) Kind() Kind { return KindKVStatus }

// Encode implements Outbound.
func (m *KVStatus) Encode() [][]byte {
	return [][]byte{[]byte(TagKVStatus), utoa(m.Room), intb(int(m.Status)), intb(m.PrefillRank), []byte(m.Reason)}
}

func decodeKVStatus(frames [][]byte) (*KVStatus, error) {
	f := &fields{kind: KindKVStatus, frames: frames}
	m := &KVStatus{}
	var err error
	if m.Room, err = f.roomAt(1); err != nil {
		return nil, err
	}
	st, err := f.int(2, "status", int64(kv.StatusFailed), int64(kv.StatusSuccess))
	if err != nil {
		return nil, err
	}
	m.Status = kv.Status(st)
	if m.PrefillRank, err = f.nonNeg(3, "prefill_rank"); err != nil {
		return nil, err
	}
	if f.has(4) {
		if m.Reason, err = utf8String(f.raw(4)); err != nil {
			return nil, f.bad(4, "reason", err)
		}
	}
	return m, nil
}

// AbortAck tells decode that no write for an aborted room is outstanding any more, so it
// may release the room's pages: [b"ABORT_ACK", room, prefill_rank] (SGLang 0.5.20/0.5.21),
// or with the ABORT's generation as a 4th frame (0.5.22+, HasGen).
type AbortAck struct {
	Room        uint64
	PrefillRank int
	Generation  uint64
	HasGen      bool
}

// Kind implements Outbound.
func (*AbortAck) Kind() Kind { return KindAbortAck }

// Encode implements Outbound.
func (m *AbortAck) Encode() [][]byte {
	if m.HasGen {
		return [][]byte{[]byte(TagAbortAck), utoa(m.Room), intb(m.PrefillRank), utoa(m.Generation)}
	}
	return [][]byte{[]byte(TagAbortAck), utoa(m.Room), intb(m.PrefillRank)}
}

func decodeAbortAck(frames [][]byte) (*AbortAck, error) {
	f := &fields{kind: KindAbortAck, frames: frames}
	m := &AbortAck{}
	var err error
	if m.Room, err = f.roomAt(1); err != nil {
		return nil, err
	}
	if m.PrefillRank, err = f.nonNeg(2, "prefill_rank"); err != nil {
		return nil, err
	}
	if f.has(3) {
		g, err := f.int(3, "generation", 0, math.MaxInt64)
		if err != nil {
			return nil, err
		}
		m.Generation, m.HasGen = uint64(g), true
	}
	return m, nil
}

// StagingReq is prefill's staging allocation request
// [b"STAGING_REQ", room, chunk_idx, chunk_pages, session_id(, requester_pp_rank)]
// (§4.3d, staging.go). SGLang's NIXL prefill never sends the pp rank (HasPPRank false);
// decode then answers every prefill endpoint of the room.
type StagingReq struct {
	Room       uint64
	ChunkIdx   int
	ChunkPages int
	SessionID  string
	PPRank     int
	HasPPRank  bool
}

// Kind implements Outbound.
func (*StagingReq) Kind() Kind { return KindStagingReq }

// Encode implements Outbound.
func (m *StagingReq) Encode() [][]byte {
	out := [][]byte{[]byte(TagStagingReq), utoa(m.Room), intb(m.ChunkIdx), intb(m.ChunkPages), []byte(m.SessionID)}
	if m.HasPPRank {
		out = append(out, intb(m.PPRank))
	}
	return out
}

func decodeStagingReq(frames [][]byte) (*StagingReq, error) {
	f := &fields{kind: KindStagingReq, frames: frames}
	m := &StagingReq{}
	var err error
	if m.Room, err = f.roomAt(1); err != nil {
		return nil, err
	}
	if m.ChunkIdx, err = f.nonNeg(2, "chunk_idx"); err != nil {
		return nil, err
	}
	v, err := f.int(3, "chunk_pages", 0, math.MaxInt64)
	if err != nil {
		return nil, err
	}
	m.ChunkPages = int(v)
	if m.SessionID, err = f.ascii(4, "session_id"); err != nil {
		return nil, err
	}
	if f.has(5) {
		if m.PPRank, err = f.nonNeg(5, "requester_pp_rank"); err != nil {
			return nil, err
		}
		m.HasPPRank = true
	}
	return m, nil
}
