package nixl

import (
	"fmt"
	"unsafe"
)

// MemKind is the memory segment type of a registration or a descriptor list.
// It mirrors nixl_mem_t: every descriptor in one list has the same kind.
type MemKind uint8

const (
	// DRAM is host memory (devID 0).
	DRAM MemKind = iota
	// VRAM is device memory; devID is the GPU index. The loopback backend treats it
	// as host memory with a VRAM label, which is what SGLang tests do.
	VRAM
)

func (k MemKind) String() string {
	switch k {
	case DRAM:
		return "DRAM"
	case VRAM:
		return "VRAM"
	}
	return fmt.Sprintf("MemKind(%d)", uint8(k))
}

// Valid reports whether k is a known kind.
func (k MemKind) Valid() bool { return k == DRAM || k == VRAM }

// Op is the transfer direction, seen from the initiator (nixl_xfer_op_t).
type Op uint8

const (
	// Write copies local descriptors into the remote ones (what SGLang prefill uses).
	Write Op = iota + 1
	// Read copies remote descriptors into the local ones.
	Read
)

func (o Op) String() string {
	switch o {
	case Write:
		return "WRITE"
	case Read:
		return "READ"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Desc is one contiguous piece of memory (nixlBasicDesc): an address as the owning
// process sees it, a length and a device id (GPU index for VRAM, 0 for DRAM).
type Desc struct {
	Addr  uintptr
	Len   uint64
	DevID uint64
}

// End is Addr+Len, the first byte after the descriptor.
func (d Desc) End() uint64 { return uint64(d.Addr) + d.Len }

// Covers reports whether o lies entirely inside d (NIXL's covers()): same device
// and [o.Addr, o.End()) within [d.Addr, d.End()).
func (d Desc) Covers(o Desc) bool {
	return d.DevID == o.DevID && o.Addr >= d.Addr && o.End() <= d.End() && o.End() >= uint64(o.Addr)
}

// DescOf returns the descriptor of a byte slice's backing memory. The memory must
// not be Go heap when it is registered (cgo forbids C keeping Go pointers; the
// loopback backend requires its own shared mappings).
func DescOf(b []byte, dev uint64) Desc {
	if len(b) == 0 {
		return Desc{DevID: dev}
	}
	return Desc{Addr: uintptr(unsafe.Pointer(unsafe.SliceData(b))), Len: uint64(len(b)), DevID: dev}
}

// RegID names one Register call; Deregister undoes it.
type RegID uint64

// ListID names a prepared descriptor list (nixlDlistH).
type ListID uint64

// XferID names a transfer request (nixlXferReqH).
type XferID uint64

// State is a transfer request's state as getXferStatus reports it.
type State int8

const (
	// Done is terminal success: the bytes have landed and the notification (if any) was sent.
	Done State = 0
	// InProgress means posted and not finished (NIXL_IN_PROG).
	InProgress State = 1
	// Failed is terminal failure (any negative nixl_status_t). Bytes may or may not have landed.
	Failed State = -1
	// Idle means made but never posted (NIXL_ERR_NOT_POSTED); it can be posted or released.
	Idle State = 2
)

func (s State) String() string {
	switch s {
	case Done:
		return "Done"
	case InProgress:
		return "InProgress"
	case Failed:
		return "Failed"
	case Idle:
		return "Idle"
	}
	return fmt.Sprintf("State(%d)", int8(s))
}

// Terminal reports whether a request in state s may be released or re-posted.
func (s State) Terminal() bool { return s != InProgress }

// Status is one entry of a batched Poll: the state and, when Failed, why.
type Status struct {
	State State
	Err   error
}

// Notif is one received notification: the sending agent's name and the message.
type Notif struct {
	Peer string
	Msg  string
}
