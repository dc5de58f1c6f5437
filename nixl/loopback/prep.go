package loopback

import (
	"sort"

	"github.com/kvxfer/kvxfer/nixl"
)

// plist is a prepared descriptor list, stored like NIXL's nixlStrideDesc: runs of
// equal-length descriptors at a constant stride inside one region. "Every slot of
// every layer" is one run per layer, so a list of millions of descriptors costs
// a few hundred runs.
type plist struct {
	peer *peer // nil for the local side
	kind nixl.MemKind
	runs []run
	n    int
}

// run covers list indices [first, first+count): descriptor first+k is
// reg.m.data[off0+k*stride : ...+len].
type run struct {
	first  int
	count  int
	reg    *region
	off0   uint64 // offset in reg.m.data
	len    uint64
	stride uint64
}

// resolver finds the region covering a descriptor, remembering the last hit
// because lists are built region by region.
type resolver struct {
	regions []*region
	last    *region
}

func (rv *resolver) find(kind nixl.MemKind, d nixl.Desc) *region {
	if d.Len == 0 {
		return nil
	}
	if r := rv.last; r != nil && r.kind == kind && r.covers(d) {
		return r
	}
	for _, r := range rv.regions {
		if r.kind == kind && r.covers(d) {
			rv.last = r
			return r
		}
	}
	return nil
}

// buildList resolves descs against regions and compresses them into runs.
func buildList(kind nixl.MemKind, descs []nixl.Desc, regions []*region, side string) (*plist, error) {
	rv := resolver{regions: regions}
	l := &plist{kind: kind, n: len(descs)}
	for i, d := range descs {
		r := rv.find(kind, d)
		if r == nil {
			return nil, nixl.Errorf(nixl.ErrInvalid, "loopback prep: %s descriptor %d (%#x,+%d,dev %d) is not inside a registered %v region", side, i, d.Addr, d.Len, d.DevID, kind)
		}
		off := r.off + (uint64(d.Addr) - r.addr)
		if k := len(l.runs) - 1; k >= 0 {
			cur := &l.runs[k]
			if cur.reg == r && cur.len == d.Len {
				last := cur.off0 + uint64(cur.count-1)*cur.stride
				if cur.count == 1 && off > cur.off0 {
					cur.stride = off - cur.off0
					cur.count++
					continue
				}
				if cur.count > 1 && off > last && off-last == cur.stride {
					cur.count++
					continue
				}
			}
		}
		l.runs = append(l.runs, run{first: i, count: 1, reg: r, off0: off, len: d.Len})
	}
	return l, nil
}

// at returns where list index i lives: the run (for its region) and the offset.
// hint is the run index of the previous lookup; consecutive indices are common.
func (l *plist) at(i int, hint *int) (*run, uint64, bool) {
	if i < 0 || i >= l.n {
		return nil, 0, false
	}
	h := *hint
	if h < 0 || h >= len(l.runs) || i < l.runs[h].first || i >= l.runs[h].first+l.runs[h].count {
		h = sort.Search(len(l.runs), func(k int) bool { return l.runs[k].first+l.runs[k].count > i })
		*hint = h
	}
	r := &l.runs[h]
	return r, r.off0 + uint64(i-r.first)*r.stride, true
}

// Prep implements nixl.Agent.
func (a *Agent) Prep(peerName string, kind nixl.MemKind, descs []nixl.Desc) (nixl.ListID, error) {
	if !kind.Valid() {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback prep: kind %v", kind)
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return 0, nixl.ErrClosed
	}
	var p *peer
	var regions []*region
	side := "local"
	if peerName == "" {
		regions = a.localRegions()
	} else {
		p = a.peers[peerName]
		if p == nil {
			a.mu.Unlock()
			return 0, nixl.Errorf(nixl.ErrPeerUnknown, "loopback prep for %q", peerName)
		}
		regions, side = p.regions, "remote"
	}
	a.mu.Unlock()
	// Resolution runs without the lock: regions are immutable once built.
	l, err := buildList(kind, descs, regions, side)
	if err != nil {
		return 0, err
	}
	l.peer = p
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, nixl.ErrClosed
	}
	id := nixl.ListID(a.nextID())
	a.lists[id] = l
	return id, nil
}

// ReleaseList implements nixl.Agent.
func (a *Agent) ReleaseList(id nixl.ListID) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nixl.ErrClosed
	}
	if _, ok := a.lists[id]; !ok {
		return nixl.Errorf(nixl.ErrInvalid, "loopback release list: unknown list %d", id)
	}
	delete(a.lists, id)
	return nil
}
