package decode

import (
	"fmt"

	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// The decode side of SGLang's staging path (heterogeneous-TP MHA with
// SGLANG_DISAGG_STAGING_BUFFER=1; common/staging_buffer.py StagingAllocator,
// staging_handler.py handle_staging_req and _free_and_send_watermark). A real
// decode scatters each staged chunk from its ring into its KV pages with GPU
// kernels on its own CUDA streams; the emulator instead checks the chunk's
// region in the ring byte for byte against the logical pattern of the
// room's (layer, K/V, page, token, head, byte), then frees the region and
// reports the new watermark. Its expected bytes and region sizes come from
// the decode rank's own view (which prefill ranks write it and which heads
// each owns), never from the prefill's planner.

// StagingRing is decode's staging ring allocator: regions are handed out
// head to tail, wrapping (a new round) when one does not fit before the end;
// the watermark (round, tail) is the oldest region still held, and prefill
// may write a region of round r only once round r-1 is freed past its end.
type StagingRing struct {
	// EmptyNewRound is 0.5.23's rule: a ring emptied by a free starts a new
	// round at offset 0 (watermark (round, 0)); 0.5.18 keeps its head and
	// reports (round, head).
	EmptyNewRound bool
	Size          int64
	head          int64
	round         int64
	next          int
	allocs        map[int][3]int64 // id -> offset, size, round
	order         []int
	wmRound       int64
	wmTail        int64
	byChunk       map[[2]uint64]chunkAlloc // (room, chunk_idx) -> allocation
	oversized     map[[2]uint64]bool
}

type chunkAlloc struct {
	id                 int
	offset, round, end int64
	pages              int
}

// NewStagingRing is an empty ring of size bytes.
func NewStagingRing(size int64) *StagingRing {
	return &StagingRing{Size: size, allocs: map[int][3]int64{}, byChunk: map[[2]uint64]chunkAlloc{}, oversized: map[[2]uint64]bool{}}
}

func (g *StagingRing) assign(n int64) (id int, off, round int64, ok bool) {
	if n > g.Size || n < 0 {
		return 0, 0, 0, false
	}
	if n <= g.Size-g.head {
		off = g.head
		g.head += n
	} else {
		g.round++
		off, g.head = 0, n
	}
	id = g.next
	g.next++
	g.allocs[id] = [3]int64{off, n, g.round}
	g.order = append(g.order, id)
	return id, off, g.round, true
}

func (g *StagingRing) free(id int) {
	if _, ok := g.allocs[id]; !ok {
		return
	}
	delete(g.allocs, id)
	for len(g.order) > 0 {
		if _, held := g.allocs[g.order[0]]; held {
			break
		}
		g.order = g.order[1:]
	}
	if len(g.allocs) == 0 {
		if g.EmptyNewRound {
			g.round++
			g.head = 0
		}
		g.wmRound, g.wmTail = g.round, g.head
	} else if len(g.order) > 0 {
		a := g.allocs[g.order[0]]
		g.wmRound, g.wmTail = a[2], a[0]
	}
}

// Watermark is the ring's current (round, tail).
func (g *StagingRing) Watermark() (round, tail int64) { return g.wmRound, g.wmTail }

// StagingView is what one decode rank knows of a room's staging: the heads
// each prefill writer sends it (in writer order), its own layers and page
// geometry.
type StagingView struct {
	// Writers are the global KV heads of each writer's block, in block order:
	// for prefill TP > decode TP the prefill ranks feeding this rank (each
	// sends every head it holds), else one writer sending this rank's heads.
	Writers [][]int
	// Layers are the model layers of decode's K buffers (V has the same).
	Layers    []int
	Page      int // tokens per page
	HeadBytes int // bytes per head per token
}

// NewStagingView derives the writers of decode rank drank (of dtp) against a
// prefill of ptp ranks, with heads total KV heads: each rank's heads are its
// contiguous share (one replicated head when ranks outnumber heads).
func NewStagingView(heads, ptp, dtp, drank int, layers []int, page, headBytes int) StagingView {
	owned := func(t, r int) []int {
		if t <= heads {
			n := heads / t
			out := make([]int, n)
			for i := range out {
				out[i] = r*n + i
			}
			return out
		}
		return []int{r / (t / heads)}
	}
	v := StagingView{Layers: layers, Page: max(page, 1), HeadBytes: headBytes}
	if ptp > dtp {
		k := ptp / dtp
		for w := range k {
			v.Writers = append(v.Writers, owned(ptp, drank*k+w))
		}
	} else {
		v.Writers = [][]int{owned(dtp, drank)}
	}
	return v
}

// ChunkBytes is the size of a chunk's region: every writer's heads × tokens
// × head bytes, for K and V of every layer.
func (v *StagingView) ChunkBytes(pages int) int64 {
	h := 0
	for _, w := range v.Writers {
		h += len(w)
	}
	return int64(pages*v.Page) * int64(h) * int64(v.HeadBytes) * int64(len(v.Layers)) * 2
}

// HandleReq is handle_staging_req: allocate (once per room and chunk) the
// region of a STAGING_REQ and answer with its STAGING_RSP (offset -2 when the
// chunk can never fit the ring).
func (g *StagingRing) HandleReq(v *StagingView, req *wire.StagingReq) *wire.StagingRsp {
	key := [2]uint64{req.Room, uint64(req.ChunkIdx)}
	rsp := &wire.StagingRsp{Room: req.Room, ChunkIdx: int64(req.ChunkIdx), SessionID: req.SessionID}
	if a, ok := g.byChunk[key]; ok {
		rsp.Offset, rsp.Round, rsp.End = a.offset, a.round, a.end
		return rsp
	}
	if g.oversized[key] {
		rsp.Offset, rsp.End = wire.AllocOversized, -1
		return rsp
	}
	need := v.ChunkBytes(req.ChunkPages)
	id, off, round, ok := g.assign(need)
	if !ok {
		g.oversized[key] = true
		rsp.Offset, rsp.End = wire.AllocOversized, -1
		return rsp
	}
	g.byChunk[key] = chunkAlloc{id: id, offset: off, round: round, end: off + need, pages: req.ChunkPages}
	rsp.Offset, rsp.Round, rsp.End = off, round, off+need
	return rsp
}

// Release frees a room's chunk region after it was checked and returns the
// WATERMARK decode then sends to every prefill rank of its rooms.
func (g *StagingRing) Release(room uint64, chunkIdx int, session string) (*wire.Watermark, error) {
	key := [2]uint64{room, uint64(chunkIdx)}
	a, ok := g.byChunk[key]
	if !ok {
		return nil, fmt.Errorf("staging: room %d chunk %d holds no region", room, chunkIdx)
	}
	delete(g.byChunk, key)
	g.free(a.id)
	r, t := g.Watermark()
	return &wire.Watermark{Round: r, Tail: t, SessionID: session}, nil
}

// Region is the allocation of a room's chunk: offset, end and page count.
func (g *StagingRing) Region(room uint64, chunkIdx int) (off, end int64, pages int, ok bool) {
	a, ok := g.byChunk[[2]uint64{room, uint64(chunkIdx)}]
	return a.offset, a.end, a.pages, ok
}

// WrongStagedBytes counts the bytes of region (a chunk's region of the ring)
// that do not hold room r's pages [pageStart, pageStart+pages): writer
// blocks in order, each K layers then V layers, each [token, head, byte].
// A region of the wrong size counts every byte wrong.
func (v *StagingView) WrongStagedBytes(region []byte, r uint64, pageStart, pages int) int {
	if int64(len(region)) != v.ChunkBytes(pages) {
		return max(len(region), 1)
	}
	bad, k := 0, 0
	tokens := pages * v.Page
	for _, heads := range v.Writers {
		for _, isV := range []bool{false, true} {
			for _, layer := range v.Layers {
				for i := range tokens {
					j, tok := pageStart+i/v.Page, i%v.Page
					for _, g := range heads {
						for x := range v.HeadBytes {
							if region[k] != kvmem.LogicalPattern(r, layer, isV, j, tok, g, x) {
								bad++
							}
							k++
						}
					}
				}
			}
		}
	}
	return bad
}
