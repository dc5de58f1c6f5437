package sglang

// What this package's external tests use and production code does not.

// HeadSlice describes a peer's head slicing (zero when whole pages move).
type HeadSlice struct {
	// HeadsToSend heads per token go from this rank to the peer.
	HeadsToSend int
	// SrcHeadStart and DstHeadStart are the first head on each side.
	SrcHeadStart, DstHeadStart int
	// BytesPerHead is bytes_per_head_slice (decode item len / page / decode heads).
	BytesPerHead int
}

// Slice reports the peer's head slicing; ok is false for whole-page peers.
func (p *Peer) Slice() (h HeadSlice, ok bool) {
	s := p.slice
	if s == nil {
		return HeadSlice{}, false
	}
	return HeadSlice{HeadsToSend: s.heads, BytesPerHead: int(s.bph), SrcHeadStart: s.srcStart, DstHeadStart: s.dstStart}, true
}

// Parts is the number of KV requests per chunk to the peer: 1, or the number
// of memory-kind runs for mixed destinations (each with "_part_i_n").
func (p *Peer) Parts() int { return max(1, len(p.segs)) }
