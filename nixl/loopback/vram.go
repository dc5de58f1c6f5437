package loopback

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/cuda"
)

// VRAM is a loopback agent with a VRAM mode: device memory registered as
// VRAM is copied with the CUDA driver (cuMemcpyDtoD on one device,
// cuMemcpyPeer between devices) instead of copy(), so the whole GPU path
// (CUDA IPC import, NIXL-shaped registration, prepared lists, WRITE,
// notification after the bytes) runs on one host without RDMA hardware.
//
// Everything else is the embedded *Agent: host memory, VRAM-labelled host
// memory (what the plain loopback calls VRAM), notifications, faults. A VRAM
// registration is device memory when the plain agent cannot register it
// (it is not loopback shared memory); it is then checked with the driver
// (the device holding it, its allocation) and, when the driver can export it,
// published in the metadata with its CUDA IPC handle. Memory this process
// imported itself (the scheduler's KV, opened by kvxferd) cannot be
// re-exported and stays local: the source of WRITEs. A peer's device regions
// are opened at LoadPeer (once per handle) and closed at DropPeer and Close;
// a handle that does not open fails LoadPeer, never a later transfer.
//
// Device requests complete on their own goroutine: copies (each ending in a
// context synchronize), then the notification through the plain agent's
// socket, then Done. Transfers mixing a device list with a host list are
// refused (ErrInvalid); NIXL's UCX backend moves those, this mode does not.
type VRAM struct {
	*Agent
	drv cuda.Driver
	im  *cuda.Importer

	mu     sync.Mutex
	closed bool
	seq    uint64
	regs   map[nixl.RegID][]*vregion
	peers  map[string]*vpeer
	lists  map[nixl.ListID]*vlist
	xfers  map[nixl.XferID]*vxfer
	wg     sync.WaitGroup
	copyMu sync.RWMutex // held for reading by copies, for writing while handles close
}

var _ nixl.Agent = (*VRAM)(nil)

// vbit marks the ids the VRAM layer hands out (the plain agent's are small).
const vbit = 1 << 62

// vregion is one device region: where its bytes are in this process (ptr)
// for the address its owner uses (addr).
type vregion struct {
	dev   int
	addr  uint64
	len   uint64
	ptr   uint64
	h     cuda.Handle
	off   uint64 // from the allocation base, when exportable
	share bool   // exportable: published in the metadata
}

func (r *vregion) covers(d nixl.Desc) bool {
	a := uint64(d.Addr)
	return d.DevID == uint64(r.dev) && a >= r.addr && a+d.Len >= a && a+d.Len <= r.addr+r.len
}

type vpeer struct {
	name    string
	blob    []byte
	regions []*vregion
	imports []*cuda.Import
	dropped bool
}

type vdesc struct {
	dev int
	ptr uint64
	len uint64
}

type vlist struct {
	peer  *vpeer // nil: local
	descs []vdesc
}

type vseg struct {
	srcDev, dstDev int
	src, dst, n    uint64
}

type vxfer struct {
	peer     *vpeer
	segs     []vseg
	notif    []byte
	hasNotif bool
	state    nixl.State
	err      error
	epoch    uint64
}

// NewVRAM creates a loopback agent in VRAM mode over drv (cuda.Lazy in
// kvxferd: a process that never registers device memory never loads libcuda).
func NewVRAM(name string, opt Options, drv cuda.Driver) (*VRAM, error) {
	a, err := New(name, opt)
	if err != nil {
		return nil, err
	}
	return &VRAM{
		Agent: a, drv: drv, im: cuda.NewImporter(drv),
		regs: map[nixl.RegID][]*vregion{}, peers: map[string]*vpeer{},
		lists: map[nixl.ListID]*vlist{}, xfers: map[nixl.XferID]*vxfer{},
	}, nil
}

// Driver is the CUDA driver the agent copies with.
func (v *VRAM) Driver() cuda.Driver { return v.drv }

func (v *VRAM) next() uint64 { v.seq++; return vbit | v.seq }

func mine[T ~uint64](id T) bool { return uint64(id)&vbit != 0 }

// Register implements nixl.Agent. VRAM descriptors outside loopback shared
// memory are device memory, checked with the driver.
func (v *VRAM) Register(kind nixl.MemKind, descs []nixl.Desc) (nixl.RegID, error) {
	id, err := v.Agent.Register(kind, descs)
	if err == nil || kind != nixl.VRAM || len(descs) == 0 || errors.Is(err, nixl.ErrClosed) {
		return id, err
	}
	rs := make([]*vregion, 0, len(descs))
	for i, d := range descs {
		r, derr := v.deviceRegion(d)
		if derr != nil {
			return 0, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM register: descriptor %d (%#x,+%d, GPU %d): %v (as host memory: %v)", i, d.Addr, d.Len, d.DevID, derr, err)
		}
		rs = append(rs, r)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return 0, nixl.ErrClosed
	}
	rid := nixl.RegID(v.next())
	v.regs[rid] = rs
	return rid, nil
}

// deviceRegion checks that d is device memory on d.DevID inside one
// allocation, and exports the allocation when the driver lets it.
func (v *VRAM) deviceRegion(d nixl.Desc) (*vregion, error) {
	a := uint64(d.Addr)
	if d.Len == 0 || a+d.Len < a || d.DevID > 1<<16 {
		return nil, fmt.Errorf("empty or overflowing")
	}
	dev := int(d.DevID)
	on, err := v.drv.PointerDevice(dev, a)
	if err != nil {
		return nil, fmt.Errorf("not device memory: %w", err)
	}
	if on != dev {
		return nil, fmt.Errorf("wrong device: the memory is on GPU %d", on)
	}
	base, size, err := v.drv.AddressRange(dev, a)
	if err != nil {
		return nil, err
	}
	if a+d.Len > base+size {
		return nil, fmt.Errorf("runs past its allocation (%#x,+%d)", base, size)
	}
	r := &vregion{dev: dev, addr: a, len: d.Len, ptr: a, off: a - base}
	if h, err := v.drv.IpcGet(dev, base); err == nil {
		r.h, r.share = h, true
	}
	return r, nil
}

// Deregister implements nixl.Agent.
func (v *VRAM) Deregister(id nixl.RegID) error {
	if !mine(id) {
		return v.Agent.Deregister(id)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nixl.ErrClosed
	}
	if _, ok := v.regs[id]; !ok {
		return nixl.Errorf(nixl.ErrInvalid, "loopback VRAM deregister: unknown registration %d", id)
	}
	delete(v.regs, id)
	return nil
}

// LocalMetadata implements nixl.Agent: the plain blob, wrapped with the
// exportable device regions when there are any.
func (v *VRAM) LocalMetadata() ([]byte, error) {
	inner, err := v.Agent.LocalMetadata()
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	var rs []vramMetaRegion
	for _, id := range sortedIDs(v.regs) {
		for _, r := range v.regs[id] {
			if r.share {
				rs = append(rs, vramMetaRegion{Dev: uint32(r.dev), Addr: r.addr, Len: r.len, Off: r.off, H: r.h})
			}
		}
	}
	if len(rs) == 0 {
		return inner, nil
	}
	if len(rs) > maxVRAMRegion {
		return nil, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM metadata: %d device regions", len(rs))
	}
	return encodeVRAMMeta(inner, rs), nil
}

func sortedIDs(m map[nixl.RegID][]*vregion) []nixl.RegID {
	ids := make([]nixl.RegID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
	return ids
}

// LoadPeer implements nixl.Agent. A peer's device regions are opened here
// (CUDA IPC, once per handle); any that does not open fails the load.
func (v *VRAM) LoadPeer(blob []byte) (string, error) {
	if !isVRAMMeta(blob) {
		return v.Agent.LoadPeer(blob)
	}
	inner, rs, err := decodeVRAMMeta(blob)
	if err != nil {
		return "", err
	}
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return "", nixl.ErrClosed
	}
	v.mu.Unlock()
	name, err := v.Agent.LoadPeer(inner)
	if err != nil {
		return "", err
	}
	v.mu.Lock()
	if p := v.peers[name]; p != nil {
		v.mu.Unlock()
		if bytes.Equal(p.blob, blob) {
			return name, nil
		}
		return "", nixl.Errorf(nixl.ErrInvalid, "loopback VRAM load peer %q: already loaded with other metadata; drop it first", name)
	}
	v.mu.Unlock()
	p := &vpeer{name: name, blob: bytes.Clone(blob)}
	for i, g := range rs {
		x, err := v.im.Open(g.H[:], g.Off, g.Len, uint64(g.Dev))
		if err != nil {
			for _, x := range p.imports {
				v.im.Close(x)
			}
			v.Agent.DropPeer(name)
			return "", nixl.Errorf(nixl.ErrInvalid, "loopback VRAM load peer %q: device region %d: %v", name, i, err)
		}
		p.imports = append(p.imports, x)
		p.regions = append(p.regions, &vregion{dev: int(g.Dev), addr: g.Addr, len: g.Len, ptr: x.Ptr})
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.peers[name] != nil || v.closed {
		for _, x := range p.imports {
			v.im.Close(x)
		}
		return "", nixl.Errorf(nixl.ErrInvalid, "loopback VRAM load peer %q: loaded concurrently or closed", name)
	}
	v.peers[name] = p
	return name, nil
}

// DropPeer implements nixl.Agent: in-flight device requests to the peer end
// Failed with ErrPeerUnknown; its handles close once no copy uses them.
func (v *VRAM) DropPeer(name string) error {
	v.mu.Lock()
	p := v.peers[name]
	if p != nil {
		delete(v.peers, name)
		p.dropped = true
		for _, x := range v.xfers {
			if x.peer == p && x.state == nixl.InProgress {
				x.state, x.err = nixl.Failed, nixl.Errorf(nixl.ErrPeerUnknown, "loopback VRAM: peer %q dropped while the request was in flight", name)
			}
		}
	}
	v.mu.Unlock()
	if p != nil {
		v.copyMu.Lock()
		for _, x := range p.imports {
			v.im.Close(x)
		}
		v.copyMu.Unlock()
	}
	return v.Agent.DropPeer(name)
}

// Prep implements nixl.Agent. A VRAM list is a device list when its
// descriptors lie in device regions (local, or the peer's imported ones).
func (v *VRAM) Prep(peer string, kind nixl.MemKind, descs []nixl.Desc) (nixl.ListID, error) {
	if kind != nixl.VRAM || len(descs) == 0 {
		return v.Agent.Prep(peer, kind, descs)
	}
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return 0, nixl.ErrClosed
	}
	var regions []*vregion
	var p *vpeer
	if peer == "" {
		for _, id := range sortedIDs(v.regs) {
			regions = append(regions, v.regs[id]...)
		}
	} else if p = v.peers[peer]; p != nil {
		regions = p.regions
	}
	v.mu.Unlock()
	if find(regions, descs[0]) == nil { // not device memory: VRAM-labelled host memory
		return v.Agent.Prep(peer, kind, descs)
	}
	l := &vlist{peer: p, descs: make([]vdesc, len(descs))}
	for i, d := range descs {
		r := find(regions, d)
		if r == nil {
			return 0, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM prep: descriptor %d (%#x,+%d, GPU %d) is not inside a device region", i, d.Addr, d.Len, d.DevID)
		}
		l.descs[i] = vdesc{dev: r.dev, ptr: r.ptr + (uint64(d.Addr) - r.addr), len: d.Len}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return 0, nixl.ErrClosed
	}
	id := nixl.ListID(v.next())
	v.lists[id] = l
	return id, nil
}

func find(rs []*vregion, d nixl.Desc) *vregion {
	for _, r := range rs {
		if r.covers(d) {
			return r
		}
	}
	return nil
}

// ReleaseList implements nixl.Agent.
func (v *VRAM) ReleaseList(id nixl.ListID) error {
	if !mine(id) {
		return v.Agent.ReleaseList(id)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.lists[id]; !ok {
		return nixl.Errorf(nixl.ErrInvalid, "loopback VRAM release list: unknown list %d", id)
	}
	delete(v.lists, id)
	return nil
}

func appendVSeg(segs []vseg, s vseg) []vseg {
	if k := len(segs) - 1; k >= 0 {
		p := &segs[k]
		if p.srcDev == s.srcDev && p.dstDev == s.dstDev && p.src+p.n == s.src && p.dst+p.n == s.dst {
			p.n += s.n
			return segs
		}
	}
	return append(segs, s)
}

func orientV(op nixl.Op, l, r vdesc) vseg {
	if op == nixl.Read {
		return vseg{srcDev: r.dev, src: r.ptr, dstDev: l.dev, dst: l.ptr, n: l.len}
	}
	return vseg{srcDev: l.dev, src: l.ptr, dstDev: r.dev, dst: r.ptr, n: l.len}
}

// Make implements nixl.Agent.
func (v *VRAM) Make(op nixl.Op, local nixl.ListID, li []int32, remote nixl.ListID, ri []int32, notif []byte) (nixl.XferID, error) {
	if !mine(local) && !mine(remote) {
		return v.Agent.Make(op, local, li, remote, ri, notif)
	}
	if !mine(local) || !mine(remote) {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM make: lists %d and %d mix device and host memory; this mode copies device to device only", local, remote)
	}
	if op != nixl.Write && op != nixl.Read {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM make: op %v", op)
	}
	if len(li) != len(ri) || len(li) == 0 || len(notif) > MaxNotifLen {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM make: %d local and %d remote indices, notification of %d bytes", len(li), len(ri), len(notif))
	}
	v.mu.Lock()
	ll, rl := v.lists[local], v.lists[remote]
	switch {
	case ll == nil || rl == nil || ll.peer != nil || rl.peer == nil:
		v.mu.Unlock()
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM make: lists %d, %d are not a local and a remote device list", local, remote)
	case rl.peer.dropped:
		v.mu.Unlock()
		return 0, nixl.Errorf(nixl.ErrPeerUnknown, "loopback VRAM make: list %d was prepared for %q, which has been dropped", remote, rl.peer.name)
	}
	v.mu.Unlock()
	segs := make([]vseg, 0, 16)
	for i := range li {
		if li[i] < 0 || int(li[i]) >= len(ll.descs) || ri[i] < 0 || int(ri[i]) >= len(rl.descs) {
			return 0, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM make: index pair %d (%d of %d, %d of %d) out of range", i, li[i], len(ll.descs), ri[i], len(rl.descs))
		}
		l, r := ll.descs[li[i]], rl.descs[ri[i]]
		if l.len != r.len {
			return 0, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM make: index pair %d length %d local vs %d remote", i, l.len, r.len)
		}
		segs = appendVSeg(segs, orientV(op, l, r))
	}
	return v.add(rl.peer, segs, notif)
}

// Create implements nixl.Agent: device descriptors on both sides make a
// device request; anything else is the plain agent's.
func (v *VRAM) Create(op nixl.Op, lkind nixl.MemKind, local []nixl.Desc, peer string, rkind nixl.MemKind, remote []nixl.Desc, notif []byte) (nixl.XferID, error) {
	if lkind != nixl.VRAM || rkind != nixl.VRAM || len(local) == 0 {
		return v.Agent.Create(op, lkind, local, peer, rkind, remote, notif)
	}
	v.mu.Lock()
	p := v.peers[peer]
	var lregs []*vregion
	for _, id := range sortedIDs(v.regs) {
		lregs = append(lregs, v.regs[id]...)
	}
	v.mu.Unlock()
	if p == nil || find(lregs, local[0]) == nil {
		return v.Agent.Create(op, lkind, local, peer, rkind, remote, notif)
	}
	if len(local) != len(remote) || len(notif) > MaxNotifLen || (op != nixl.Write && op != nixl.Read) {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM create: op %v, %d local and %d remote descriptors", op, len(local), len(remote))
	}
	segs := make([]vseg, 0, len(local))
	for i := range local {
		lr, rr := find(lregs, local[i]), find(p.regions, remote[i])
		if lr == nil || rr == nil || local[i].Len != remote[i].Len {
			return 0, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM create: descriptor %d is not inside device regions on both sides, or lengths differ", i)
		}
		l := vdesc{dev: lr.dev, ptr: lr.ptr + (uint64(local[i].Addr) - lr.addr), len: local[i].Len}
		r := vdesc{dev: rr.dev, ptr: rr.ptr + (uint64(remote[i].Addr) - rr.addr), len: remote[i].Len}
		segs = appendVSeg(segs, orientV(op, l, r))
	}
	return v.add(p, segs, notif)
}

func (v *VRAM) add(p *vpeer, segs []vseg, notif []byte) (nixl.XferID, error) {
	x := &vxfer{peer: p, segs: segs, state: nixl.Idle}
	if notif != nil {
		x.notif, x.hasNotif = bytes.Clone(notif), true
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return 0, nixl.ErrClosed
	}
	id := nixl.XferID(v.next())
	v.xfers[id] = x
	return id, nil
}

// Post implements nixl.Agent.
func (v *VRAM) Post(id nixl.XferID) (nixl.State, error) {
	if !mine(id) {
		return v.Agent.Post(id)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nixl.Failed, nixl.ErrClosed
	}
	x := v.xfers[id]
	switch {
	case x == nil:
		return nixl.Failed, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM post: unknown request %d", id)
	case x.state == nixl.InProgress:
		return nixl.InProgress, nixl.Errorf(nixl.ErrRequestActive, "loopback VRAM post: request %d is in flight", id)
	case x.peer.dropped:
		x.state, x.err = nixl.Failed, nixl.Errorf(nixl.ErrPeerUnknown, "loopback VRAM post: request %d targets dropped peer %q", id, x.peer.name)
		return nixl.Failed, x.err
	}
	x.state, x.err = nixl.InProgress, nil
	x.epoch++
	v.wg.Add(1)
	go v.run(x, x.epoch)
	return nixl.InProgress, nil
}

// run copies, then notifies, then completes one post.
func (v *VRAM) run(x *vxfer, epoch uint64) {
	defer v.wg.Done()
	err := v.copySegs(x)
	if err == nil && x.hasNotif {
		err = v.Agent.SendNotif(x.peer.name, x.notif)
	}
	// Pollers parked on the agent's wake-up (nixl.Waker) learn of device
	// requests too: woken after the state changed, outside every lock.
	defer v.Agent.wake()
	v.mu.Lock()
	defer v.mu.Unlock()
	if x.epoch != epoch || x.state != nixl.InProgress {
		return
	}
	if err != nil {
		x.state, x.err = nixl.Failed, err
		return
	}
	x.state = nixl.Done
}

func (v *VRAM) copySegs(x *vxfer) error {
	v.copyMu.RLock()
	defer v.copyMu.RUnlock()
	v.mu.Lock()
	dropped := x.peer.dropped
	v.mu.Unlock()
	if dropped {
		return nixl.Errorf(nixl.ErrPeerUnknown, "loopback VRAM: peer %q dropped", x.peer.name)
	}
	for _, s := range x.segs {
		var err error
		if s.srcDev == s.dstDev {
			err = v.drv.CopyDtoD(s.srcDev, s.dst, s.src, s.n)
		} else {
			err = v.drv.CopyPeer(s.dstDev, s.dst, s.srcDev, s.src, s.n)
		}
		if err != nil {
			return nixl.Errorf(nixl.ErrBackend, "loopback VRAM copy of %d bytes GPU %d -> GPU %d: %v", s.n, s.srcDev, s.dstDev, err)
		}
	}
	return nil
}

// Poll implements nixl.Agent.
func (v *VRAM) Poll(xs []nixl.XferID, out []nixl.Status) error {
	own := 0
	for _, id := range xs {
		if mine(id) {
			own++
		}
	}
	if own == 0 {
		return v.Agent.Poll(xs, out)
	}
	if len(out) < len(xs) {
		return nixl.Errorf(nixl.ErrInvalid, "loopback VRAM poll: %d results for %d requests", len(out), len(xs))
	}
	var plain []nixl.XferID
	var at []int
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return nixl.ErrClosed
	}
	for i, id := range xs {
		if !mine(id) {
			plain, at = append(plain, id), append(at, i)
			continue
		}
		if x := v.xfers[id]; x != nil {
			out[i] = nixl.Status{State: x.state, Err: x.err}
		} else {
			out[i] = nixl.Status{State: nixl.Failed, Err: nixl.Errorf(nixl.ErrInvalid, "loopback VRAM poll: unknown request %d", id)}
		}
	}
	v.mu.Unlock()
	if len(plain) == 0 {
		return nil
	}
	st := make([]nixl.Status, len(plain))
	if err := v.Agent.Poll(plain, st); err != nil {
		return err
	}
	for k, i := range at {
		out[i] = st[k]
	}
	return nil
}

// Release implements nixl.Agent.
func (v *VRAM) Release(id nixl.XferID) error {
	if !mine(id) {
		return v.Agent.Release(id)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	x := v.xfers[id]
	switch {
	case v.closed:
		return nixl.ErrClosed
	case x == nil:
		return nixl.Errorf(nixl.ErrInvalid, "loopback VRAM release: unknown request %d", id)
	case x.state == nixl.InProgress:
		return nixl.Errorf(nixl.ErrRequestActive, "loopback VRAM release: request %d is in flight", id)
	}
	delete(v.xfers, id)
	return nil
}

// Close implements nixl.Agent: it waits for device copies in flight, closes
// the plain agent, then every imported handle.
func (v *VRAM) Close() error {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return nil
	}
	v.closed = true
	v.mu.Unlock()
	v.wg.Wait()
	err := v.Agent.Close()
	v.copyMu.Lock()
	defer v.copyMu.Unlock()
	return errors.Join(err, v.im.CloseAll())
}
