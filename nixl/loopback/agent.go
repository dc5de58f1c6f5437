package loopback

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/nixl"
)

// Options tune an agent. The zero value is fine.
type Options struct {
	// Workers is the size of the copy worker pool (default 2).
	Workers int
	// Dir is the root of the namespace: the agent's private directory is
	// created in Dir/kvxfer-<euid> (default root /dev/shm, else os.TempDir()),
	// and LoadPeer accepts only peers whose segments are in that same
	// namespace, so agents that exchange metadata must share Dir.
	Dir string
	// Clock reads the time that injected latency is measured on (default the
	// real, monotonic clock). Nothing is scheduled on it: a delayed request
	// completes when polled at or after its due time.
	Clock clock.Clock
	// NotifyTimeout bounds how long a notification waits in a peer's
	// outbox for room in its receive queue (default 10 s). A live peer's
	// reader drains its queue in microseconds; one that takes none for
	// this long (a stopped or hung process) is marked disconnected, and
	// its waiting requests and later sends fail (outbox.go). Nobody else
	// waits for it meanwhile.
	NotifyTimeout time.Duration
}

// DefaultNotifyTimeout is Options.NotifyTimeout's default.
const DefaultNotifyTimeout = 10 * time.Second

// region is one registered region, local or a peer's, with its bytes located in
// a mapping of this process: m.data[off : off+len].
type region struct {
	kind nixl.MemKind
	dev  uint64
	addr uint64 // as the owner sees it
	len  uint64
	m    *mapping
	off  uint64
	reg  nixl.RegID // local only
}

func (r *region) covers(d nixl.Desc) bool {
	a := uint64(d.Addr)
	return d.DevID == r.dev && a >= r.addr && a+d.Len >= a && a+d.Len <= r.addr+r.len
}

// peer is a loaded remote agent.
type peer struct {
	name     string
	blob     []byte
	sock     *net.UnixAddr
	maps     []*mapping
	regions  []*region
	disconnd bool // set when a send failed or a disconnect was injected; guarded by Agent.mu
	// out is the socket notifications to the peer go out on: connected to
	// the peer's on the first send (dialOut), closed when the peer is
	// dropped or the agent closes.
	out   atomic.Pointer[net.UnixConn]
	outMu sync.Mutex // dialOut and closeOut
	shut  bool       // closeOut ran; under outMu
	// ob is the notifications waiting for the peer's queue (outbox.go);
	// obMu is held for a send to it, so that they keep their order.
	obMu sync.Mutex
	ob   outbox
}

// Agent is the loopback nixl.Agent. Create it with New; Close it when done.
type Agent struct {
	name string
	ns   string // the namespace (Root/kvxfer-<euid>), see namespace.go
	dir  string // this agent's directory in ns
	conn *net.UnixConn

	// mu guards everything below except what copyMu and the queue guard.
	mu       sync.RWMutex // Poll reads under RLock; a worker finishing a request is a writer, so spinning pollers cannot starve it
	closed   bool
	seq      uint64
	allocs   map[uint64]*mapping // by base address
	regs     map[nixl.RegID][]*region
	peers    map[string]*peer
	lists    map[nixl.ListID]*plist
	xfers    map[nixl.XferID]*xfer
	faults   map[string]Fault
	inflight int
	dues     dueHeap // delayed posts by due time (stale entries dropped lazily)

	clk  clock.Clock
	base time.Time

	notifyTimeout time.Duration
	datagrams     atomic.Uint64 // notification datagrams sent

	wakers nixl.Wakers // OnProgress

	// copyMu is held for reading while a worker copies bytes, and for writing
	// while any mapping is unmapped, so a copy never touches unmapped memory.
	copyMu sync.RWMutex

	q       queue
	workers sync.WaitGroup
	drains  sync.WaitGroup // outbox drains (outbox.go)

	nmu         sync.Mutex
	notifs      []nixl.Notif
	notifWakers nixl.Wakers // OnNotif
	reader      sync.WaitGroup
}

var _ nixl.Agent = (*Agent)(nil)

// New creates an agent named name, its directory, its notification socket and
// its worker pool.
func New(name string, opt Options) (*Agent, error) {
	if name == "" || len(name) > maxStr {
		return nil, nixl.Errorf(nixl.ErrInvalid, "loopback: agent name length %d", len(name))
	}
	root := opt.Dir
	if root == "" {
		root = shmRoot()
	}
	ns, err := namespace(root)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(ns, agentPrefix)
	if err != nil {
		return nil, nixl.Errorf(nixl.ErrBackend, "loopback: %v", err)
	}
	if err := os.Chmod(dir, dirMode); err != nil {
		os.RemoveAll(dir)
		return nil, nixl.Errorf(nixl.ErrBackend, "loopback: %v", err)
	}
	addr := &net.UnixAddr{Name: filepath.Join(dir, "notif.sock"), Net: "unixgram"}
	conn, err := net.ListenUnixgram("unixgram", addr)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nixl.Errorf(nixl.ErrBackend, "loopback: listen %s: %v", addr.Name, err)
	}
	a := &Agent{
		name: name, ns: ns, dir: dir, conn: conn,
		allocs: map[uint64]*mapping{}, regs: map[nixl.RegID][]*region{},
		peers: map[string]*peer{}, lists: map[nixl.ListID]*plist{},
		xfers: map[nixl.XferID]*xfer{}, faults: map[string]Fault{},
	}
	a.clk = opt.Clock
	if a.clk == nil {
		a.clk = clock.Real{}
	}
	a.base = a.clk.Now()
	a.notifyTimeout = opt.NotifyTimeout
	if a.notifyTimeout <= 0 {
		a.notifyTimeout = DefaultNotifyTimeout
	}
	a.q.init()
	n := opt.Workers
	if n <= 0 {
		n = 2
	}
	a.workers.Add(n)
	for range n {
		go a.worker()
	}
	a.reader.Add(1)
	go a.readNotifs()
	return a, nil
}

// Name implements nixl.Agent.
func (a *Agent) Name() string { return a.name }

// Dir is the agent's private directory (region files and socket) inside the
// namespace; removed by Close.
func (a *Agent) Dir() string { return a.dir }

func (a *Agent) nextID() uint64 { a.seq++; return a.seq }

// Alloc returns n bytes of shared memory (a mapped file in the agent's
// directory), zeroed, suitable for Register. It stays valid until Free or Close.
func (a *Agent) Alloc(n int) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, nixl.ErrClosed
	}
	m, err := createMapping(filepath.Join(a.dir, fmt.Sprintf("m%d", a.nextID())), n)
	if err != nil {
		return nil, err
	}
	a.allocs[m.base()] = m
	return m.data[:n:n], nil
}

// Attach maps an existing shared-memory file that another process created (the
// prefill scheduler's KV pool, named over the control API) so that it can be
// registered like an allocation. The file is checked first (OpenAttachable:
// regular, ours, writable by no one else, not a symlink). It is outside the
// namespace, so peers cannot load it: attached memory is the local side of
// transfers only. Free unmaps it but leaves the file to its owner. Should the
// owner truncate it, transfers touching the lost pages fail; the process lives.
func (a *Agent) Attach(path string) ([]byte, error) {
	f, size, err := OpenAttachable(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return a.attachMapped(f, uint64(size))
}

// AttachFile maps an open memory file another process allocated and passed
// (a sealed memfd: it can neither shrink nor grow, so the guarded copies never
// meet a lost page) so that it can be registered like an allocation. The
// caller keeps f; the mapping outlives it.
func (a *Agent) AttachFile(f *os.File) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, nixl.Errorf(nixl.ErrInvalid, "attach %s: %v", f.Name(), err)
	}
	if !st.Mode().IsRegular() || st.Size() <= 0 {
		return nil, nixl.Errorf(nixl.ErrInvalid, "attach %s: not a non-empty regular file", f.Name())
	}
	return a.attachMapped(f, uint64(st.Size()))
}

func (a *Agent) attachMapped(f *os.File, size uint64) ([]byte, error) {
	m, err := mapShared(f, size)
	if err != nil {
		return nil, err
	}
	m.attached = true
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		a.copyMu.Lock()
		m.unmap()
		a.copyMu.Unlock()
		return nil, nixl.ErrClosed
	}
	a.allocs[m.base()] = m
	return m.data, nil
}

// Free unmaps and deletes a buffer returned by Alloc. It fails with ErrInvalid
// while any registration lies inside it.
func (a *Agent) Free(b []byte) error {
	if len(b) == 0 {
		return nixl.Errorf(nixl.ErrInvalid, "loopback: free of empty buffer")
	}
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	a.mu.Lock()
	m := a.allocs[base]
	switch {
	case a.closed:
		a.mu.Unlock()
		return nixl.ErrClosed
	case m == nil:
		a.mu.Unlock()
		return nixl.Errorf(nixl.ErrInvalid, "loopback: free of %#x: not an allocation", base)
	case m.regs > 0:
		a.mu.Unlock()
		return nixl.Errorf(nixl.ErrInvalid, "loopback: free of %#x: %d registrations inside", base, m.regs)
	}
	delete(a.allocs, base)
	a.mu.Unlock()
	a.copyMu.Lock()
	err := m.unmap()
	a.copyMu.Unlock()
	if !m.attached {
		os.Remove(m.path)
	}
	return err
}

// findAlloc returns the own allocation containing [addr, addr+n).
func (a *Agent) findAlloc(addr, n uint64) (*mapping, uint64) {
	for _, m := range a.allocs {
		if off, ok := m.contains(addr, n); ok {
			return m, off
		}
	}
	return nil, 0
}

// Register implements nixl.Agent. Regions must lie inside buffers from Alloc.
func (a *Agent) Register(kind nixl.MemKind, descs []nixl.Desc) (nixl.RegID, error) {
	if !kind.Valid() || len(descs) == 0 {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback register: kind %v, %d descriptors", kind, len(descs))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, nixl.ErrClosed
	}
	rs := make([]*region, 0, len(descs))
	for i, d := range descs {
		m, off := a.findAlloc(uint64(d.Addr), d.Len)
		if m == nil || d.Len == 0 {
			return 0, nixl.Errorf(nixl.ErrInvalid, "loopback register: descriptor %d (%#x,+%d) is not inside loopback shared memory", i, d.Addr, d.Len)
		}
		if kind == nixl.DRAM && d.DevID != 0 {
			return 0, nixl.Errorf(nixl.ErrInvalid, "loopback register: DRAM descriptor %d has device %d", i, d.DevID)
		}
		rs = append(rs, &region{kind: kind, dev: d.DevID, addr: uint64(d.Addr), len: d.Len, m: m, off: off})
	}
	id := nixl.RegID(a.nextID())
	for _, r := range rs {
		r.reg = id
		r.m.regs++
	}
	a.regs[id] = rs
	return id, nil
}

// Deregister implements nixl.Agent. Lists and requests already built keep working:
// the memory stays mapped until Free.
func (a *Agent) Deregister(id nixl.RegID) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nixl.ErrClosed
	}
	rs, ok := a.regs[id]
	if !ok {
		return nixl.Errorf(nixl.ErrInvalid, "loopback deregister: unknown registration %d", id)
	}
	for _, r := range rs {
		r.m.regs--
	}
	delete(a.regs, id)
	return nil
}

// localRegions lists the registered regions in a stable order (by RegID).
func (a *Agent) localRegions() []*region {
	ids := make([]nixl.RegID, 0, len(a.regs))
	for id := range a.regs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var out []*region
	for _, id := range ids {
		out = append(out, a.regs[id]...)
	}
	return out
}

// LocalMetadata implements nixl.Agent.
func (a *Agent) LocalMetadata() ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, nixl.ErrClosed
	}
	md := metadata{Name: a.name, Socket: a.conn.LocalAddr().String()}
	fileIdx := map[*mapping]uint16{}
	for _, r := range a.localRegions() {
		fi, ok := fileIdx[r.m]
		if !ok {
			if len(md.Files) >= maxFiles {
				return nil, nixl.Errorf(nixl.ErrInvalid, "loopback metadata: more than %d files", maxFiles)
			}
			fi = uint16(len(md.Files))
			fileIdx[r.m] = fi
			md.Files = append(md.Files, metaFile{Path: r.m.path, Size: uint64(len(r.m.data))})
		}
		md.Regions = append(md.Regions, metaRegion{Kind: r.kind, Dev: r.dev, Addr: r.addr, Len: r.len, File: fi, Off: r.off})
	}
	return md.encode(), nil
}

// LoadPeer implements nixl.Agent: it maps the peer's region files into this
// process. Only segments a loopback agent created in this agent's namespace
// are accepted (see namespace.go); anything else fails with ErrInvalid before
// a file is opened for writing, and a peer whose directory is gone fails with
// ErrRemoteDisconnect.
func (a *Agent) LoadPeer(blob []byte) (string, error) {
	md, err := decodeMetadata(blob)
	if err != nil {
		return "", err
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return "", nixl.ErrClosed
	}
	if p, ok := a.peers[md.Name]; ok {
		a.mu.Unlock()
		if bytes.Equal(p.blob, blob) {
			return md.Name, nil
		}
		return "", nixl.Errorf(nixl.ErrInvalid, "loopback load peer %q: already loaded with other metadata; drop it first", md.Name)
	}
	a.mu.Unlock()

	p := &peer{name: md.Name, blob: bytes.Clone(blob), sock: &net.UnixAddr{Name: md.Socket, Net: "unixgram"}}
	if err := a.mapPeer(md, p); err != nil {
		for _, m := range p.maps {
			m.unmap()
		}
		return "", fmt.Errorf("loopback load peer %q: %w", md.Name, err)
	}
	for _, g := range md.Regions {
		p.regions = append(p.regions, &region{kind: g.Kind, dev: g.Dev, addr: g.Addr, len: g.Len, m: p.maps[g.File], off: g.Off})
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.peers[md.Name]; ok || a.closed {
		for _, m := range p.maps {
			m.unmap()
		}
		if a.closed {
			return "", nixl.ErrClosed
		}
		return "", nixl.Errorf(nixl.ErrInvalid, "loopback load peer %q: loaded concurrently", md.Name)
	}
	a.peers[md.Name] = p
	return md.Name, nil
}

// mapPeer checks the peer's names, opens its directory, checks its socket and
// maps each of its segments into p.maps.
func (a *Agent) mapPeer(md *metadata, p *peer) error {
	ad, err := peerDir(a.ns, a.dir, md)
	if err != nil {
		return err
	}
	dfd, err := openPeerDir(a.ns, ad)
	if err != nil {
		return err
	}
	defer syscall.Close(dfd)
	dir := filepath.Join(a.ns, ad)
	// The directories on the way are ours and 0700 (checked above), so a
	// path lstat is as good as an fstatat here.
	fi, err := os.Lstat(filepath.Join(dir, sockName))
	if err != nil {
		return nixl.Errorf(nixl.ErrRemoteDisconnect, "loopback: peer socket %s: %v", md.Socket, err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || fi.Mode().Type() != os.ModeSocket || int(st.Uid) != os.Geteuid() {
		return nixl.Errorf(nixl.ErrInvalid, "loopback: peer socket %s is not a socket of ours (%v)", md.Socket, fi.Mode())
	}
	for _, mf := range md.Files {
		f, _, err := openPeerSeg(dfd, dir, filepath.Base(mf.Path), mf.Size)
		if err != nil {
			return err
		}
		m, err := mapShared(f, mf.Size)
		f.Close()
		if err != nil {
			return err
		}
		m.peer = true
		p.maps = append(p.maps, m)
	}
	return nil
}

// DropPeer implements nixl.Agent. In-flight requests to the peer end Failed with
// ErrPeerUnknown; its mappings are unmapped once no copy uses them.
func (a *Agent) DropPeer(name string) error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nixl.ErrClosed
	}
	p, ok := a.peers[name]
	if !ok {
		a.mu.Unlock()
		return nixl.Errorf(nixl.ErrPeerUnknown, "loopback drop peer %q", name)
	}
	delete(a.peers, name)
	a.failInflightLocked(func(x *xfer) bool { return x.peer == p },
		nixl.Errorf(nixl.ErrPeerUnknown, "loopback: peer %q dropped while the request was in flight", name))
	a.mu.Unlock()
	a.wake()
	a.copyMu.Lock()
	for _, m := range p.maps {
		m.unmap()
	}
	a.copyMu.Unlock()
	p.closeOut()
	return nil
}

// Close implements nixl.Agent: it stops the workers and the socket reader, unmaps
// every mapping and removes the agent's directory. It is idempotent.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.mu.Unlock()
	a.wake()
	a.q.close()
	a.workers.Wait()
	err := a.conn.Close()
	a.reader.Wait()
	a.copyMu.Lock()
	for _, p := range a.peers {
		p.closeOut()
		for _, m := range p.maps {
			if e := m.unmap(); e != nil {
				err = errors.Join(err, e)
			}
		}
	}
	for _, m := range a.allocs {
		if e := m.unmap(); e != nil {
			err = errors.Join(err, e)
		}
	}
	a.copyMu.Unlock()
	a.drains.Wait() // their sockets are closed: each ends at its next write
	if e := os.RemoveAll(a.dir); e != nil {
		err = errors.Join(err, e)
	}
	return err
}
