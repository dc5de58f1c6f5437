package wire

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The staging path (spec §4.3d; SGLang common/staging_handler.py, nixl/conn.py
// send_kvcache_staged): heterogeneous-TP MHA with SGLANG_DISAGG_STAGING_BUFFER=1 on
// both sides. Prefill asks decode for a region of decode's staging ring per chunk
// (STAGING_REQ), decode answers with the region (STAGING_RSP) and, as it frees regions,
// with its ring watermark (WATERMARK); prefill writes each chunk's head slices into
// the region and signals it: a "stg" NIXL notification on the write (0.5.18 to 0.5.22)
// or a CHUNK_READY message once the write is done (0.5.23).

// TagChunkReady is 0.5.23's staged-chunk signal (prefill -> decode).
const TagChunkReady = "CHUNK_READY"

// AllocOversized is STAGING_RSP's offset when the chunk can never fit decode's ring
// (StagingAllocator.ALLOC_OVERSIZED).
const AllocOversized = -2

// ChunkReady is 0.5.23's [b"CHUNK_READY", room, chunk_idx, page_start, num_pages,
// writer_id, prefill_rank] (common/conn.py send_chunk_ready), sent to the chunk's decode
// endpoint after its staged write is DONE. writer_id is the decode agent name (the
// session id); prefill_rank is _prefill_unique_rank(). Decode reads frames 1 to 5 only.
type ChunkReady struct {
	Room                uint64
	ChunkIdx, PageStart int
	NumPages            int
	WriterID            string
	PrefillRank         int
}

// Kind implements Outbound.
func (*ChunkReady) Kind() Kind { return KindChunkReady }

// Encode implements Outbound.
func (m *ChunkReady) Encode() [][]byte {
	return [][]byte{[]byte(TagChunkReady), utoa(m.Room), intb(m.ChunkIdx), intb(m.PageStart),
		intb(m.NumPages), []byte(m.WriterID), intb(m.PrefillRank)}
}

func decodeChunkReady(frames [][]byte) (*ChunkReady, error) {
	f := &fields{kind: KindChunkReady, frames: frames}
	m := &ChunkReady{}
	var err error
	if m.Room, err = f.roomAt(1); err != nil {
		return nil, err
	}
	for i, x := range []struct {
		dst  *int
		name string
	}{{&m.ChunkIdx, "chunk_idx"}, {&m.PageStart, "page_start"}, {&m.NumPages, "num_pages"}} {
		if *x.dst, err = f.nonNeg(2+i, x.name); err != nil {
			return nil, err
		}
	}
	if m.WriterID, err = f.ascii(5, "writer_id"); err != nil {
		return nil, err
	}
	if f.has(6) { // decode does not read it; tolerate its absence like decode
		if m.PrefillRank, err = f.nonNeg(6, "prefill_rank"); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// StgNotif is the NIXL notification on a staged write, 0.5.18 to 0.5.22:
// "{room}_stg_{chunk_id}_{is_last}_{sender}_{chunk_idx}_{page_start}_{num_pages}_{agent}".
// chunk_id counts the room's enqueued chunks (as in "_kv_"), sender is
// pp_rank·tp_size + engine_rank, chunk_idx the staging-grid index, and agent the
// decode agent name; decode splits at most 8 times, so the agent may hold '_'.
type StgNotif struct {
	Room                          uint64
	ChunkID                       int
	IsLast                        bool
	Sender                        int
	ChunkIdx, PageStart, NumPages int
	Agent                         string
}

// AppendStgNotif appends n's notification string to b.
func AppendStgNotif(b []byte, n *StgNotif) []byte {
	b = strconv.AppendUint(b, n.Room, 10)
	b = append(b, "_stg_"...)
	b = strconv.AppendInt(b, int64(n.ChunkID), 10)
	if n.IsLast {
		b = append(b, "_1_"...)
	} else {
		b = append(b, "_0_"...)
	}
	for _, v := range []int{n.Sender, n.ChunkIdx, n.PageStart, n.NumPages} {
		b = strconv.AppendInt(b, int64(v), 10)
		b = append(b, '_')
	}
	return append(b, n.Agent...)
}

// String formats the notification.
func (n *StgNotif) String() string { return string(AppendStgNotif(nil, n)) }

// ErrBadStgNotif wraps every ParseStgNotif failure.
var ErrBadStgNotif = errors.New("bad stg notification")

// ParseStgNotif parses a "stg" notification the way SGLang's decode does
// (split("_", 8), every number a decimal int), but strictly: numbers are canonical
// non-negative decimals that fit an int, is_last is "0" or "1", and the agent name is
// present.
func ParseStgNotif(s string) (*StgNotif, error) {
	bad := func(why string) (*StgNotif, error) {
		return nil, fmt.Errorf("%w %q: %s", ErrBadStgNotif, clip([]byte(s)), why)
	}
	f := strings.SplitN(s, "_", 9)
	if len(f) != 9 {
		return bad("need 9 fields")
	}
	if f[1] != "stg" {
		return bad("tag is not stg")
	}
	room, err := strconv.ParseUint(f[0], 10, 63)
	if err != nil || !canonical(f[0]) {
		return bad("room")
	}
	n := &StgNotif{Room: room, Agent: f[8]}
	switch f[3] {
	case "0":
	case "1":
		n.IsLast = true
	default:
		return bad("is_last")
	}
	for _, x := range []struct {
		i   int
		dst *int
	}{{2, &n.ChunkID}, {4, &n.Sender}, {5, &n.ChunkIdx}, {6, &n.PageStart}, {7, &n.NumPages}} {
		i, dst := x.i, x.dst
		v, err := strconv.ParseInt(f[i], 10, 32)
		if err != nil || v < 0 || !canonical(f[i]) {
			return bad(fmt.Sprintf("field %d", i))
		}
		*dst = int(v)
	}
	if n.Agent == "" {
		return bad("empty agent name")
	}
	return n, nil
}

// canonical: digits only, no leading zero (so String(Parse(s)) == s).
func canonical(s string) bool {
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// WatermarkReady is is_watermark_ready: may prefill write decode's staging region
// that ends at end and was handed out in ring round round, given decode's latest
// watermark (wmRound, wmTail) for the session? Round 0 never overlaps an older
// allocation; a later round needs the previous round freed past end.
func WatermarkReady(round, end, wmRound, wmTail int64) bool {
	if round <= 0 {
		return true
	}
	prev := round - 1
	return prev < wmRound || (prev == wmRound && end <= wmTail)
}

// WatermarkAfter reports whether (round, tail) is newer than (pr, pt), the only
// update handle_watermark_msg keeps (a tuple comparison).
func WatermarkAfter(round, tail, pr, pt int64) bool {
	return round > pr || (round == pr && tail > pt)
}
