package kv

// Transfer is one chunk for one decode agent: the pool turns it into NIXL
// requests (KV, then on the last chunk state and aux) and reports one XferDone.
type Transfer struct {
	Room     uint64
	Seq      uint32
	Agent    string
	Chunk    int // chunk id: counts the room's sent chunks from 0
	Last     bool
	SrcPages []int32
	DstPages []int32
	// Set on the last chunk only.
	SrcAux, DstAux     int
	SrcState, DstState [][]int32
	// HoldSignal (last chunk only, Config.HoldCompletion): post the writes
	// without their notifications and hand the notifications back in
	// XferDone.Signal, so the room sends them only if it is still live once
	// every write completed (invariant 10).
	HoldSignal bool
	// PageStart is the chunk's first page in the room's page list (after
	// decode's prefix): SGLang's index_slice.start, which staged writes name.
	PageStart int
	// Staged is set by the transport, never by the room's rules: the decode
	// staging-ring region the chunk's KV goes to instead of its pages
	// (SGLang's staging path; daemon/staging.go).
	Staged *StagedRegion
}

// StagedRegion is a chunk's region of decode's staging ring: its grid slot
// and STAGING_RSP's offset.
type StagedRegion struct {
	ChunkIdx int
	Offset   int64
}

// NoKV reports whether this is a last chunk without pages (decode's prefix
// covered everything), which SGLang signals with the aux_nokv notification.
func (t *Transfer) NoKV() bool { return len(t.SrcPages) == 0 }

// DoneFunc reports the end of one posted Transfer: fail is ReasonNone on
// success; signal is the notifications held back from a HoldSignal transfer's
// writes (nil otherwise).
type DoneFunc func(fail Reason, signal [][]byte)
