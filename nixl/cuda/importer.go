package cuda

import (
	"errors"
	"fmt"
	"sync"
)

// Import is one registered range of an opened IPC handle: the device pointer
// Ptr = Base + Offset, Length bytes long, on device Dev of this process.
type Import struct {
	Dev    int
	Base   uint64 // where the handle's allocation is mapped in this process
	Offset uint64 // of the range from the allocation base, as the exporter sent it
	Length uint64
	Ptr    uint64 // Base + Offset
	h      Handle
	closed bool
}

// opened is one distinct handle mapped into this process.
type opened struct {
	dev  int
	base uint64
	size uint64
	refs int
}

// Importer opens CUDA IPC handles for registration, once per distinct handle
// (reference counted), and refuses at Open what would otherwise fail later as
// a write: no GPU, a device this process does not see, a handle whose memory
// is gone or that CUDA will not map, memory on another device than claimed, a
// range past the end of the allocation. It is safe for concurrent use.
type Importer struct {
	drv Driver

	mu     sync.Mutex
	open   map[Handle]*opened
	closed bool
}

// NewImporter returns an Importer over drv.
func NewImporter(drv Driver) *Importer {
	return &Importer{drv: drv, open: map[Handle]*opened{}}
}

// Driver is the driver the importer uses.
func (im *Importer) Driver() Driver { return im.drv }

// Open maps [offset, offset+length) of the allocation that handle h names
// on device dev. Close the Import when it is no longer registered.
func (im *Importer) Open(handle []byte, offset, length uint64, dev uint64) (*Import, error) {
	h, err := HandleOf(handle)
	if err != nil {
		return nil, err
	}
	if length == 0 || offset+length < offset {
		return nil, fmt.Errorf("cuda: range offset %d + length %d is empty or overflows", offset, length)
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.closed {
		return nil, errors.New("cuda: importer closed")
	}
	o := im.open[h]
	if o == nil {
		if o, err = im.openLocked(h, dev); err != nil {
			return nil, err
		}
		im.open[h] = o
	} else if uint64(o.dev) != dev {
		return nil, fmt.Errorf("cuda: wrong device: this IPC handle's memory is on GPU %d, the registration says GPU %d", o.dev, dev)
	}
	if offset+length > o.size {
		if o.refs == 0 {
			im.closeLocked(h, o)
		}
		return nil, fmt.Errorf("cuda: offset %d + length %d is past the end of the exported allocation (%d bytes)", offset, length, o.size)
	}
	o.refs++
	return &Import{Dev: o.dev, Base: o.base, Offset: offset, Length: length, Ptr: o.base + offset, h: h}, nil
}

// openLocked opens h in dev's context and checks where the memory is.
func (im *Importer) openLocked(h Handle, dev uint64) (*opened, error) {
	n, err := im.drv.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("cuda: no GPU access in kvxferd: %w", err)
	}
	if dev >= uint64(n) {
		return nil, fmt.Errorf("cuda: wrong device: GPU %d, but this process sees %d GPU(s); kvxferd and the scheduler must see the same devices (CUDA_VISIBLE_DEVICES)", dev, n)
	}
	d := int(dev)
	base, err := im.drv.IpcOpen(d, h)
	if err != nil {
		switch Code(err) {
		case ErrInvalidValue, ErrInvalidHandle, ErrMapFailed, ErrNotFound:
			return nil, fmt.Errorf("cuda: stale or foreign IPC handle (the exporting process freed the memory or exited, or the handle is from another host): %w", err)
		case ErrInvalidContext:
			return nil, fmt.Errorf("cuda: the IPC handle cannot be opened in this process (exported by this same process?): %w", err)
		case ErrPeerUnsupported:
			return nil, fmt.Errorf("cuda: wrong device: GPU %d cannot reach the handle's memory (no peer access): %w", dev, err)
		}
		return nil, fmt.Errorf("cuda: opening the IPC handle on GPU %d: %w", dev, err)
	}
	o := &opened{dev: d, base: base}
	fail := func(e error) (*opened, error) {
		if ce := im.drv.IpcClose(d, base); ce != nil {
			e = errors.Join(e, ce)
		}
		return nil, e
	}
	on, err := im.drv.PointerDevice(d, base)
	if err != nil {
		return fail(fmt.Errorf("cuda: querying the device of the imported memory: %w", err))
	}
	if on != d {
		return fail(fmt.Errorf("cuda: wrong device: this IPC handle's memory is on GPU %d, the registration says GPU %d", on, dev))
	}
	rb, size, err := im.drv.AddressRange(d, base)
	if err != nil {
		return fail(fmt.Errorf("cuda: querying the imported allocation: %w", err))
	}
	if rb != base {
		return fail(fmt.Errorf("cuda: the IPC handle maps at %#x inside an allocation at %#x; export the allocation base", base, rb))
	}
	o.size = size
	return o, nil
}

func (im *Importer) closeLocked(h Handle, o *opened) error {
	delete(im.open, h)
	return im.drv.IpcClose(o.dev, o.base)
}

// Close releases one Import; the handle is closed with its last Import.
// Closing an Import twice is a no-op.
func (im *Importer) Close(x *Import) error {
	if x == nil {
		return nil
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	if x.closed || im.closed {
		x.closed = true
		return nil
	}
	x.closed = true
	o := im.open[x.h]
	if o == nil {
		return nil
	}
	if o.refs--; o.refs > 0 {
		return nil
	}
	return im.closeLocked(x.h, o)
}

// CloseAll closes every open handle; later Opens fail. Call it only once no
// copy uses the memory (after the NIXL agent that registered it is closed).
func (im *Importer) CloseAll() error {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.closed = true
	var err error
	for h, o := range im.open {
		err = errors.Join(err, im.closeLocked(h, o))
	}
	return err
}
