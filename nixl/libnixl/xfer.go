package libnixl

import (
	"bytes"

	"github.com/kvxfer/kvxfer/nixl"
)

// Make builds a request from a local and a remote prepared list by indices.
func (a *Agent) Make(op nixl.Op, local nixl.ListID, localIdx []int32, remote nixl.ListID, remoteIdx []int32, notif []byte) (nixl.XferID, error) {
	return a.make(a.do, op, local, localIdx, remote, remoteIdx, notif)
}

func (a *Agent) make(run runner, op nixl.Op, local nixl.ListID, localIdx []int32, remote nixl.ListID, remoteIdx []int32, notif []byte) (id nixl.XferID, err error) {
	if op != nixl.Write && op != nixl.Read {
		return 0, nixl.Errorf(nixl.ErrInvalid, "libnixl Make: op %v", op)
	}
	if len(localIdx) == 0 || len(localIdx) != len(remoteIdx) {
		return 0, nixl.Errorf(nixl.ErrInvalid, "libnixl Make: %d local and %d remote indices", len(localIdx), len(remoteIdx))
	}
	cerr := run(func() {
		s := a.st
		l, lok := s.lists[local]
		r, rok := s.lists[remote]
		switch {
		case !lok || !rok:
			err = nixl.Errorf(nixl.ErrInvalid, "libnixl Make: unknown list (%d, %d)", local, remote)
			return
		case l.peer != "" || r.peer == "":
			err = nixl.Errorf(nixl.ErrInvalid, "libnixl Make: list %d must be local and %d remote", local, remote)
			return
		case s.stale(r.peer, r.gen):
			err = nixl.Errorf(nixl.ErrPeerUnknown, "libnixl Make: list %d was built for a dropped load of %q", remote, r.peer)
			return
		}
		if p, _ := s.known(r.peer); p.disconnected {
			err = nixl.Errorf(nixl.ErrRemoteDisconnect, "libnixl Make %q", r.peer)
			return
		}
		for i := range localIdx {
			li, ri := localIdx[i], remoteIdx[i]
			if li < 0 || int(li) >= len(l.lens) || ri < 0 || int(ri) >= len(r.lens) {
				err = nixl.Errorf(nixl.ErrInvalid, "libnixl Make: index pair %d (%d, %d) out of range (%d, %d)", i, li, ri, len(l.lens), len(r.lens))
				return
			}
			if l.lens[li] != r.lens[ri] {
				err = nixl.Errorf(nixl.ErrInvalid, "libnixl Make: pair %d lengths %d != %d", i, l.lens[li], r.lens[ri])
				return
			}
		}
		h, st := capiMake(s.ag, op, l.h, localIdx, r.h, remoteIdx, notif)
		if st != stSuccess {
			err = nixl.Errorf(codeErr(st, nixl.ErrBackend), "libnixl Make: status %d", st)
			return
		}
		id = nixl.XferID(s.id())
		s.xfers[id] = &xfer{h: h, peer: r.peer, gen: r.gen, state: nixl.Idle}
	})
	return id, first(cerr, err)
}

// Create builds a request from explicit descriptors (createXferReq).
func (a *Agent) Create(op nixl.Op, localKind nixl.MemKind, local []nixl.Desc, peerName string, remoteKind nixl.MemKind, remote []nixl.Desc, notif []byte) (nixl.XferID, error) {
	return a.create(a.do, op, localKind, local, peerName, remoteKind, remote, notif)
}

func (a *Agent) create(run runner, op nixl.Op, localKind nixl.MemKind, local []nixl.Desc, peerName string, remoteKind nixl.MemKind, remote []nixl.Desc, notif []byte) (id nixl.XferID, err error) {
	switch {
	case op != nixl.Write && op != nixl.Read, !localKind.Valid(), !remoteKind.Valid():
		return 0, nixl.Errorf(nixl.ErrInvalid, "libnixl Create: op %v, kinds %v/%v", op, localKind, remoteKind)
	case len(local) == 0 || len(local) != len(remote):
		return 0, nixl.Errorf(nixl.ErrInvalid, "libnixl Create: %d local and %d remote descriptors", len(local), len(remote))
	case peerName == "":
		return 0, nixl.Errorf(nixl.ErrInvalid, "libnixl Create: no peer")
	}
	for i := range local {
		if local[i].Len != remote[i].Len {
			return 0, nixl.Errorf(nixl.ErrInvalid, "libnixl Create: pair %d lengths %d != %d", i, local[i].Len, remote[i].Len)
		}
	}
	cerr := run(func() {
		s := a.st
		p, ok := s.known(peerName)
		if !ok {
			err = nixl.Errorf(nixl.ErrPeerUnknown, "libnixl Create %q", peerName)
			return
		}
		if p.disconnected {
			err = nixl.Errorf(nixl.ErrRemoteDisconnect, "libnixl Create %q", peerName)
			return
		}
		for i, d := range local {
			if !s.covered(localKind, d) {
				err = nixl.Errorf(nixl.ErrInvalid, "libnixl Create: local descriptor %d %+v outside the %v regions", i, d, localKind)
				return
			}
		}
		h, st := capiCreate(s.ag, op, localKind, local, peerName, remoteKind, remote, notif)
		if st != stSuccess {
			// The local side and the peer are good, so a NIXL failure here is
			// a remote descriptor outside the peer's regions (createXferReq
			// reports every failure as BACKEND through this API).
			err = nixl.Errorf(nixl.ErrInvalid, "libnixl Create %q: status %d", peerName, st)
			return
		}
		id = nixl.XferID(s.id())
		s.xfers[id] = &xfer{h: h, peer: peerName, gen: p.gen, state: nixl.Idle}
	})
	return id, first(cerr, err)
}

// Post starts a request; at most one post per request is in flight.
func (a *Agent) Post(id nixl.XferID) (nixl.State, error) { return a.post(a.do, id) }

func (a *Agent) post(run runner, id nixl.XferID) (state nixl.State, err error) {
	cerr := run(func() {
		s := a.st
		x, ok := s.xfers[id]
		switch {
		case !ok:
			state, err = nixl.Failed, nixl.Errorf(nixl.ErrInvalid, "libnixl Post: unknown request %d", id)
			return
		case x.state == nixl.InProgress:
			state, err = nixl.InProgress, nixl.Errorf(nixl.ErrRequestActive, "libnixl Post %d", id)
			return
		case s.stale(x.peer, x.gen):
			x.state, x.err = nixl.Failed, nixl.Errorf(nixl.ErrPeerUnknown, "libnixl Post %d: peer %q was dropped", id, x.peer)
			state, err = x.state, x.err
			return
		}
		if p, _ := s.known(x.peer); p.disconnected {
			x.state, x.err = nixl.Failed, nixl.Errorf(nixl.ErrRemoteDisconnect, "libnixl Post %d to %q", id, x.peer)
			state, err = x.state, x.err
			return
		}
		st := capiPost(s.ag, x.h)
		s.settle(x, st)
		state, err = x.state, x.err
		if st == stRepost {
			err = nixl.Errorf(nixl.ErrRequestActive, "libnixl Post %d: NIXL still runs its last post", id)
		}
	})
	if cerr != nil {
		return nixl.Failed, cerr
	}
	return state, err
}

// Poll reports the state of many requests; only unknown ones call nothing.
func (a *Agent) Poll(xs []nixl.XferID, out []nixl.Status) error { return a.poll(a.do, xs, out) }

func (a *Agent) poll(run runner, xs []nixl.XferID, out []nixl.Status) error {
	if len(out) < len(xs) {
		return nixl.Errorf(nixl.ErrInvalid, "libnixl Poll: %d slots for %d requests", len(out), len(xs))
	}
	return run(func() {
		s := a.st
		for i, id := range xs {
			x, ok := s.xfers[id]
			if !ok {
				out[i] = nixl.Status{State: nixl.Failed, Err: nixl.Errorf(nixl.ErrInvalid, "libnixl Poll: unknown request %d", id)}
				continue
			}
			if x.state == nixl.InProgress {
				s.settle(x, capiStatus(s.ag, x.h))
			}
			out[i] = nixl.Status{State: x.state, Err: x.err}
		}
	})
}

// Release frees a request in a terminal state. An in-flight request is kept:
// NIXL's release of a running request is not an abort and bytes may still land.
func (a *Agent) Release(id nixl.XferID) error { return a.release(a.do, id) }

func (a *Agent) release(run runner, id nixl.XferID) (err error) {
	cerr := run(func() {
		s := a.st
		x, ok := s.xfers[id]
		if !ok {
			err = nixl.Errorf(nixl.ErrInvalid, "libnixl Release: unknown request %d", id)
			return
		}
		if x.state == nixl.InProgress {
			s.settle(x, capiStatus(s.ag, x.h))
		}
		if x.state == nixl.InProgress {
			err = nixl.Errorf(nixl.ErrRequestActive, "libnixl Release %d", id)
			return
		}
		if st := capiRelease(s.ag, x.h); st != stSuccess {
			err = nixl.Errorf(nixl.ErrBackend, "libnixl Release %d: status %d", id, st)
			return
		}
		delete(s.xfers, id)
	})
	return first(cerr, err)
}

// Notifs appends every notification received since the last call.
func (a *Agent) Notifs(dst []nixl.Notif) (out []nixl.Notif, err error) {
	out = dst
	cerr := a.do(func() {
		var st int
		if out, st = capiDrain(a.st.ag, a.st.notifs, dst); st != stSuccess {
			err = nixl.Errorf(nixl.ErrBackend, "libnixl Notifs: status %d", st)
		}
	})
	if cerr != nil {
		return dst, cerr
	}
	return out, err
}

// SendNotifs implements nixl.NotifBatcher: msgs go to the peer in order in
// one hop onto the owner thread (a genNotif each), stopping at the first
// that fails.
func (a *Agent) SendNotifs(peerName string, msgs [][]byte) (err error) {
	if len(msgs) == 0 {
		return nil
	}
	cerr := a.do(func() {
		s := a.st
		p, ok := s.known(peerName)
		switch {
		case !ok:
			err = nixl.Errorf(nixl.ErrPeerUnknown, "libnixl SendNotifs %q", peerName)
			return
		case p.disconnected:
			err = nixl.Errorf(nixl.ErrRemoteDisconnect, "libnixl SendNotifs %q", peerName)
			return
		}
		for i, m := range msgs {
			if st := capiGenNotif(s.ag, peerName, m); st != stSuccess {
				err = nixl.Errorf(s.transportErr(peerName, p.gen, st), "libnixl SendNotifs %q: message %d of %d: status %d",
					peerName, i+1, len(msgs), st)
				return
			}
		}
	})
	return first(cerr, err)
}

// SendNotif sends a notification not tied to a transfer (genNotif).
func (a *Agent) SendNotif(peerName string, msg []byte) (err error) {
	msg = bytes.Clone(msg)
	cerr := a.do(func() {
		s := a.st
		p, ok := s.known(peerName)
		switch {
		case !ok:
			err = nixl.Errorf(nixl.ErrPeerUnknown, "libnixl SendNotif %q", peerName)
			return
		case p.disconnected:
			err = nixl.Errorf(nixl.ErrRemoteDisconnect, "libnixl SendNotif %q", peerName)
			return
		}
		if st := capiGenNotif(s.ag, peerName, msg); st != stSuccess {
			err = nixl.Errorf(s.transportErr(peerName, p.gen, st), "libnixl SendNotif %q: status %d", peerName, st)
		}
	})
	return first(cerr, err)
}
