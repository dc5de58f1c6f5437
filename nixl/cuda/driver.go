package cuda

import (
	"errors"
	"fmt"
)

// HandleSize is the size of a CUipcMemHandle / cudaIpcMemHandle_t.
const HandleSize = 64

// Handle is an exported CUDA IPC memory handle: opaque bytes that name one
// device allocation (its base) to other processes on the same host.
type Handle [HandleSize]byte

// HandleOf copies b into a Handle; b must be HandleSize bytes.
func HandleOf(b []byte) (Handle, error) {
	var h Handle
	if len(b) != HandleSize {
		return h, fmt.Errorf("cuda: an IPC handle is %d bytes, got %d", HandleSize, len(b))
	}
	copy(h[:], b)
	return h, nil
}

// Driver is the set of CUDA driver entry points kvxfer uses. Device pointers
// are uint64 (CUdeviceptr); dev is a device ordinal as this process sees it
// (after CUDA_VISIBLE_DEVICES). Implementations: the real driver (Open, Lazy)
// and cudafake.
type Driver interface {
	// DeviceCount is cuDeviceGetCount (after cuInit).
	DeviceCount() (int, error)
	// IpcOpen maps an exported allocation into dev's primary context
	// (cuIpcOpenMemHandle, lazy peer access) and returns its base.
	IpcOpen(dev int, h Handle) (uint64, error)
	// IpcClose unmaps a pointer IpcOpen returned (cuIpcCloseMemHandle).
	IpcClose(dev int, ptr uint64) error
	// IpcGet exports the allocation whose base is ptr (cuIpcGetMemHandle).
	IpcGet(dev int, ptr uint64) (Handle, error)
	// AddressRange is the allocation containing ptr (cuMemGetAddressRange).
	AddressRange(dev int, ptr uint64) (base, size uint64, err error)
	// PointerDevice is the device that holds ptr's memory
	// (cuPointerGetAttribute DEVICE_ORDINAL).
	PointerDevice(dev int, ptr uint64) (int, error)
	// CopyDtoD copies n bytes on one device (cuMemcpyDtoD); it returns once
	// the bytes have landed.
	CopyDtoD(dev int, dst, src, n uint64) error
	// CopyPeer copies n bytes between devices (cuMemcpyPeer); it returns once
	// the bytes have landed.
	CopyPeer(dstDev int, dst uint64, srcDev int, src uint64, n uint64) error
	// CopyDtoH copies len(dst) bytes from the device to host memory.
	CopyDtoH(dev int, dst []byte, src uint64) error
	// CopyHtoD copies src to the device.
	CopyHtoD(dev int, dst uint64, src []byte) error
	// Alloc and Free are cuMemAlloc and cuMemFree (tests and the GPU check).
	Alloc(dev int, n uint64) (uint64, error)
	Free(dev int, ptr uint64) error
	// Memset sets n bytes to v (cuMemsetD8).
	Memset(dev int, ptr uint64, v byte, n uint64) error
}

// CUresult values kvxfer tells apart.
const (
	ErrInvalidValue    = 1
	ErrOutOfMemory     = 2
	ErrNotInitialized  = 3
	ErrDeinitialized   = 4
	ErrNoDevice        = 100
	ErrInvalidDevice   = 101
	ErrInvalidContext  = 201
	ErrMapFailed       = 205
	ErrAlreadyMapped   = 208
	ErrPeerUnsupported = 217
	ErrInvalidHandle   = 400
	ErrNotFound        = 500
	ErrIllegalAddress  = 700
	ErrNotSupported    = 801
)

var codeNames = map[int]string{
	ErrInvalidValue: "CUDA_ERROR_INVALID_VALUE", ErrOutOfMemory: "CUDA_ERROR_OUT_OF_MEMORY",
	ErrNotInitialized: "CUDA_ERROR_NOT_INITIALIZED", ErrDeinitialized: "CUDA_ERROR_DEINITIALIZED",
	ErrNoDevice: "CUDA_ERROR_NO_DEVICE", ErrInvalidDevice: "CUDA_ERROR_INVALID_DEVICE",
	ErrInvalidContext: "CUDA_ERROR_INVALID_CONTEXT", ErrMapFailed: "CUDA_ERROR_MAP_FAILED",
	ErrAlreadyMapped: "CUDA_ERROR_ALREADY_MAPPED", ErrPeerUnsupported: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	ErrInvalidHandle: "CUDA_ERROR_INVALID_HANDLE", ErrNotFound: "CUDA_ERROR_NOT_FOUND",
	ErrIllegalAddress: "CUDA_ERROR_ILLEGAL_ADDRESS", ErrNotSupported: "CUDA_ERROR_NOT_SUPPORTED",
}

// Error is a failed driver call: the entry point and its CUresult.
type Error struct {
	Op   string // e.g. "cuIpcOpenMemHandle"
	Code int
	Name string // cuGetErrorName, or ours when the driver has none
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%d)", e.Op, e.Name, e.Code)
}

// NewError builds an Error, naming the code from our table when name is "".
func NewError(op string, code int, name string) *Error {
	if name == "" {
		if name = codeNames[code]; name == "" {
			name = "CUDA_ERROR"
		}
	}
	return &Error{Op: op, Code: code, Name: name}
}

// Code is the CUresult inside err (0 when err is not an *Error).
func Code(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// ErrNoGPU wraps every failure that means this process cannot use a GPU at
// all: no driver library, no device, a driver that does not initialize.
var ErrNoGPU = errors.New("cuda: this process has no GPU access")
