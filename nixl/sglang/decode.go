package sglang

import (
	"encoding/binary"

	"github.com/kvxfer/kvxfer/nixl"
)

// TransferStatus is decode's per-room completion state (SGLang's
// TransferStatus plus update_transfer_status), fed with parsed notifications.
// The zero value expects one sender and no state.
type TransferStatus struct {
	// Required is decode's required_prefill_response_num (0 means 1).
	Required int
	// ExpectState is set when decode sent state indices for the room.
	ExpectState bool

	receivedKVs map[int]map[int]struct{} // sender -> chunk ids
	expectedKVs map[int]int              // sender -> expected chunk count
	numExpected int                      // 0 = not set yet (Python None)
	receivedAux bool
	stateFrom   map[int]struct{}
	parts       map[[2]int]map[int]struct{} // (sender, chunk) -> part ids
}

func (s *TransferStatus) setExpected() {
	if s.numExpected == 0 {
		s.numExpected = max(s.Required, 1)
	}
}

func (s *TransferStatus) trackKV(sender, chunk int, isLast bool) {
	if s.receivedKVs == nil {
		s.receivedKVs = map[int]map[int]struct{}{}
		s.expectedKVs = map[int]int{}
	}
	set := s.receivedKVs[sender]
	if set == nil {
		set = map[int]struct{}{}
		s.receivedKVs[sender] = set
	}
	set[chunk] = struct{}{}
	if isLast {
		s.expectedKVs[sender] = chunk + 1
		s.setExpected()
	}
}

// Apply records one notification for this room (the room field is not checked).
func (s *TransferStatus) Apply(n Notif) {
	switch n.Tag {
	case TagKV:
		if n.NumParts > 0 {
			// A split chunk counts once every part has arrived: one part's
			// notification proves only that part's bytes landed.
			if s.parts == nil {
				s.parts = map[[2]int]map[int]struct{}{}
			}
			k := [2]int{n.Sender, n.Chunk}
			if s.parts[k] == nil {
				s.parts[k] = map[int]struct{}{}
			}
			s.parts[k][n.Part] = struct{}{}
			if len(s.parts[k]) < n.NumParts {
				return
			}
		}
		s.trackKV(n.Sender, n.Chunk, n.IsLast)
	case TagAux, TagAuxNoKV:
		s.receivedAux = true
		if n.Tag == TagAuxNoKV {
			if s.expectedKVs == nil {
				s.receivedKVs = map[int]map[int]struct{}{}
				s.expectedKVs = map[int]int{}
			}
			s.expectedKVs[n.Sender] = n.KVChunks
		}
		s.setExpected()
	case TagState:
		if s.stateFrom == nil {
			s.stateFrom = map[int]struct{}{}
		}
		s.stateFrom[n.Sender] = struct{}{}
	}
}

// Done is decode's is_done: aux received, the sender count known, state from
// every sender when expected, an expected count from every sender, and exactly
// that many distinct chunks received from each.
func (s *TransferStatus) Done() bool {
	if s.numExpected == 0 || !s.receivedAux {
		return false
	}
	if s.ExpectState && len(s.stateFrom) < s.numExpected {
		return false
	}
	if len(s.expectedKVs) < s.numExpected {
		return false
	}
	for sender, want := range s.expectedKVs {
		if len(s.receivedKVs[sender]) != want {
			return false
		}
	}
	return true
}

// Checker tracks many rooms, like decode's transfer_statuses (a defaultdict:
// a notification for an unknown room creates a default status).
type Checker struct {
	rooms map[uint64]*TransferStatus
}

// NewChecker returns an empty checker.
func NewChecker() *Checker { return &Checker{rooms: map[uint64]*TransferStatus{}} }

// Expect declares a room's required sender count and whether it expects state
// (what decode knows from its bootstrap info and send_metadata).
func (c *Checker) Expect(room uint64, required int, expectState bool) {
	st := c.Status(room)
	st.Required, st.ExpectState = required, expectState
}

// Status returns the room's status, creating it.
func (c *Checker) Status(room uint64) *TransferStatus {
	st := c.rooms[room]
	if st == nil {
		st = &TransferStatus{}
		c.rooms[room] = st
	}
	return st
}

// Forget drops a room's status (decode clears it with the request).
func (c *Checker) Forget(room uint64) { delete(c.rooms, room) }

// Feed parses one notification and applies it to its room.
func (c *Checker) Feed(msg string) (Notif, error) {
	n, err := ParseNotif(msg)
	if err != nil {
		return n, err
	}
	c.Status(n.Room).Apply(n)
	return n, nil
}

// Done reports whether the room is complete.
func (c *Checker) Done(room uint64) bool {
	st := c.rooms[room]
	return st != nil && st.Done()
}

// AuxRoomItemLen is the size of one bootstrap_room aux item (u64×8).
const AuxRoomItemLen = 64

// CheckAuxRoom applies decode's metadata gate to the last aux buffer (the
// bootstrap_room buffer, as decode's memory holds it): slot 0 of item auxIdx is
// the room as u64 little endian. Zero means the aux bytes have not landed;
// anything else but room is the "bootstrap_room mismatch" corruption. Both are
// ErrInvalid-wrapped errors.
func CheckAuxRoom(roomBuf []byte, itemLen uint64, auxIdx int, room uint64) error {
	off := itemLen * uint64(auxIdx)
	if auxIdx < 0 || itemLen < 8 || off+8 > uint64(len(roomBuf)) || off+8 < off {
		return nixl.Errorf(nixl.ErrInvalid, "sglang aux room check: slot %d of %d-byte items outside %d bytes", auxIdx, itemLen, len(roomBuf))
	}
	got := binary.LittleEndian.Uint64(roomBuf[off:])
	switch got {
	case room:
		return nil
	case 0:
		return nixl.Errorf(nixl.ErrInvalid, "sglang aux room check: slot %d still 0 (aux not landed), want room %d", auxIdx, room)
	}
	return nixl.Errorf(nixl.ErrInvalid, "sglang aux room check: bootstrap_room mismatch: slot %d holds %d, want %d", auxIdx, got, room)
}
