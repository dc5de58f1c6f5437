package daemon

import (
	"encoding/binary"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// FuzzStagingTable drives one staging peer (its machine and its actor's
// staging state, stepped as the actor does) with what decodes control:
// STAGING_RSP and WATERMARK of any values (for asked and unasked slots, this
// agent and another) interleaved with chunks of any page start and length.
// Whatever comes: no panic; only asked slots are filled; a chunk is posted
// only with a region decode answered inside its announced ring (or
// ALLOC_OVERSIZED, which the plan refuses) and only once the watermark allows
// it; every chunk ends exactly once (posted, refused, or failed with the
// dropped agent); a posted chunk's completion sends at most one CHUNK_READY.
// fuzz-smoke: 20000x
func FuzzStagingTable(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 16, 0, 0, 0, 2, 0, 0, 0, 0})
	f.Add([]byte{0, 1, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		var sent int
		s := newStagingHarness(t, StagingConfig{Enabled: true, ChunkedPrefillSize: 3}, func(kv.Endpoint, [][]byte) error {
			sent++
			return nil
		})
		s.s.pageSize = 1
		s.add(&wire.Registration{AgentName: "a", DecodeTPSize: 1, StagingBasePtr: stgBase, StagingTotalSize: 1 << 12}, true)
		s.info(&wire.TransferInfo{Room: 1, AgentName: "a", DstKVIndices: seqPages(0, 9), HasDecodePrefixLen: true}, 1)
		ends := map[int]int{}
		var posts []kv.Transfer
		var dones []kv.DoneFunc
		next := 0
		for len(in) >= 5 {
			op, a, b := in[0]%4, int64(int8(in[1])), int64(binary.LittleEndian.Uint16(in[2:4]))
			c := int64(int8(in[4]))
			in = in[5:]
			switch op {
			case 0:
				agent := "a"
				if c < -100 {
					agent = "b"
				}
				s.frame(&wire.StagingRsp{Room: 1, ChunkIdx: a % 4, Offset: b - 2, Round: c % 3, End: b + c*16, SessionID: agent})
			case 1:
				s.frame(&wire.Watermark{Round: a % 3, Tail: b, SessionID: "a"})
			case 2:
				id, start, n := next, int(uint8(a)%10), int(uint8(c)%4)
				next++
				d := func(kv.Reason, [][]byte) { ends[id]++ }
				s.stage(kv.Transfer{Room: 1, Agent: "a", PageStart: start, SrcPages: seqPages(start, n), DstPages: seqPages(start, n)}, d,
					func(t kv.Transfer, done kv.DoneFunc) {
						if t.Staged == nil {
							panic("posted without a region")
						}
						r, w, ok := s.region(1, int64(t.Staged.ChunkIdx))
						if !ok || !r.Known || r.Offset != t.Staged.Offset || (!w && r.Offset != wire.AllocOversized) {
							panic("posted into a slot not answered or not yet writable")
						}
						posts = append(posts, t)
						dones = append(dones, done)
					})
				if n == 0 {
					ends[id]++ // not staged: the caller posts it
				}
			case 3:
				if len(dones) > 0 {
					before := sent
					dones[0](kv.Reason(uint8(a)%2), nil)
					if sent > before+1 {
						t.Fatal("more than one CHUNK_READY for a write")
					}
					dones = dones[1:]
				}
			}
		}
		for _, p := range posts {
			if o := p.Staged.Offset; o != wire.AllocOversized && (o < 0 || o > 1<<12) {
				t.Fatalf("posted into offset %d, outside the ring", o)
			}
		}
		s.drop()
		for _, d := range dones {
			d(kv.ReasonNone, nil)
		}
		for id := range next {
			if ends[id] != 1 {
				t.Fatalf("chunk %d ended %d times", id, ends[id])
			}
		}
		if st := s.stats(); st.RspRouted > st.ReqsSent || st.HeldNow != 0 {
			t.Fatalf("stats %+v", st)
		}
	})
}
