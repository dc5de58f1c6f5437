package libnixl

import (
	"bytes"

	"github.com/kvxfer/kvxfer/nixl"
)

// Each method below validates on the owner goroutine what NIXL would report
// only as a lossy BACKEND status, then makes the one nixl_capi call it mirrors.

// Register registers regions of one kind with every backend that supports it.
func (a *Agent) Register(kind nixl.MemKind, regions []nixl.Desc) (id nixl.RegID, err error) {
	if !kind.Valid() || len(regions) == 0 {
		return 0, nixl.Errorf(nixl.ErrInvalid, "libnixl Register: kind %v, %d regions", kind, len(regions))
	}
	for _, d := range regions {
		if d.Addr == 0 || d.Len == 0 || d.End() < uint64(d.Addr) {
			return 0, nixl.Errorf(nixl.ErrInvalid, "libnixl Register: bad region %+v", d)
		}
	}
	regions = append([]nixl.Desc(nil), regions...)
	cerr := a.do(func() {
		s := a.st
		if st := capiReg(s.ag, kind, regions, true); st != stSuccess {
			err = nixl.Errorf(codeErr(st, nixl.ErrBackend), "libnixl Register %v: status %d", kind, st)
			return
		}
		id = nixl.RegID(s.id())
		s.regs[id] = region{kind: kind, descs: regions}
	})
	return id, first(cerr, err)
}

// Deregister undoes one Register.
func (a *Agent) Deregister(id nixl.RegID) (err error) {
	cerr := a.do(func() {
		s := a.st
		r, ok := s.regs[id]
		if !ok {
			err = nixl.Errorf(nixl.ErrInvalid, "libnixl Deregister: unknown registration %d", id)
			return
		}
		if st := capiReg(s.ag, r.kind, r.descs, false); st != stSuccess {
			err = nixl.Errorf(codeErr(st, nixl.ErrBackend), "libnixl Deregister: status %d", st)
			return
		}
		delete(s.regs, id)
		s.hitOK = false
	})
	return first(cerr, err)
}

// LocalMetadata returns NIXL's serialized metadata (name, UCX worker address,
// regions with rkeys).
func (a *Agent) LocalMetadata() (md []byte, err error) {
	cerr := a.do(func() {
		var st int
		if md, st = capiLocalMD(a.st.ag); st != stSuccess {
			err = nixl.Errorf(codeErr(st, nixl.ErrBackend), "libnixl LocalMetadata: status %d", st)
		}
	})
	return md, first(cerr, err)
}

// LoadPeer loads a peer's metadata. The same blob again is a no-op; NIXL
// rejecting a blob is ErrInvalid (it cannot tell us more).
func (a *Agent) LoadPeer(md []byte) (name string, err error) {
	if len(md) == 0 {
		return "", nixl.Errorf(nixl.ErrInvalid, "libnixl LoadPeer: empty metadata")
	}
	md = bytes.Clone(md)
	cerr := a.do(func() {
		s := a.st
		for n, p := range s.peers {
			if !p.disconnected && bytes.Equal(p.md, md) {
				name = n
				return
			}
		}
		var st int
		if name, st = capiLoadMD(s.ag, md); st != stSuccess {
			err = nixl.Errorf(nixl.ErrInvalid, "libnixl LoadPeer: NIXL rejected the metadata: status %d", st)
			return
		}
		if p, ok := s.peers[name]; ok && !p.disconnected {
			p.md = md // an update (e.g. new registrations): handles stay valid
			return
		}
		s.gen++
		s.peers[name] = &peer{gen: s.gen, md: md}
	})
	return name, first(cerr, err)
}

// DropPeer invalidates a peer; lists and requests built for it become stale.
func (a *Agent) DropPeer(name string) (err error) {
	cerr := a.do(func() {
		s := a.st
		p, ok := s.peers[name]
		if !ok {
			err = nixl.Errorf(nixl.ErrPeerUnknown, "libnixl DropPeer %q", name)
			return
		}
		st := capiInvalidate(s.ag, name)
		if st != stSuccess && !p.disconnected {
			err = nixl.Errorf(codeErr(st, nixl.ErrBackend), "libnixl DropPeer %q: status %d", name, st)
		}
		delete(s.peers, name)
		_ = s.progress() // requests in flight now settle with ErrPeerUnknown (seen by the next Poll)
	})
	return first(cerr, err)
}

// Prep prepares a descriptor list; peer "" is the local side.
func (a *Agent) Prep(peerName string, kind nixl.MemKind, descs []nixl.Desc) (id nixl.ListID, err error) {
	if !kind.Valid() || len(descs) == 0 {
		return 0, nixl.Errorf(nixl.ErrInvalid, "libnixl Prep: kind %v, %d descriptors", kind, len(descs))
	}
	cerr := a.do(func() {
		s := a.st
		l := &list{peer: peerName, kind: kind, lens: make([]uint64, len(descs))}
		for i, d := range descs {
			l.lens[i] = d.Len
			if peerName == "" && !s.covered(kind, d) {
				err = nixl.Errorf(nixl.ErrInvalid, "libnixl Prep: descriptor %d %+v outside the local %v regions", i, d, kind)
				return
			}
		}
		if peerName != "" {
			p, ok := s.known(peerName)
			if !ok {
				err = nixl.Errorf(nixl.ErrPeerUnknown, "libnixl Prep %q", peerName)
				return
			}
			if p.disconnected {
				err = nixl.Errorf(nixl.ErrRemoteDisconnect, "libnixl Prep %q", peerName)
				return
			}
			l.gen = p.gen
		}
		var st int
		if l.h, st = capiPrep(s.ag, peerName, kind, descs); st != stSuccess {
			// Peer and kind are known good here: NIXL's NOT_FOUND is a
			// descriptor outside the peer's (or our) registered regions.
			err = nixl.Errorf(nixl.ErrInvalid, "libnixl Prep %q %v: status %d", peerName, kind, st)
			return
		}
		id = nixl.ListID(s.id())
		s.lists[id] = l
	})
	return id, first(cerr, err)
}

// ReleaseList frees a prepared list; requests made from it keep working.
func (a *Agent) ReleaseList(id nixl.ListID) (err error) {
	cerr := a.do(func() {
		s := a.st
		l, ok := s.lists[id]
		if !ok {
			err = nixl.Errorf(nixl.ErrInvalid, "libnixl ReleaseList: unknown list %d", id)
			return
		}
		delete(s.lists, id)
		if st := capiReleaseList(s.ag, l.h); st != stSuccess {
			err = nixl.Errorf(nixl.ErrBackend, "libnixl ReleaseList: status %d", st)
		}
	})
	return first(cerr, err)
}

// first returns the closed-agent error if any, else the call's own error.
func first(closed, err error) error {
	if closed != nil {
		return closed
	}
	return err
}

// codeErr maps the few statuses the C API keeps apart; others get def.
func codeErr(st int, def error) error {
	switch st {
	case stInvalid:
		return nixl.ErrInvalid
	case stNotFound:
		return nixl.ErrPeerUnknown
	}
	return def
}
