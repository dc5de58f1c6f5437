package libnixl

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// state is everything the owner goroutine keeps beside the NIXL handles. The C
// API folds most statuses into BACKEND and does not tell "in flight" from
// "done", so the rules of nixl.Agent (one post in flight, release only when
// terminal, stale handles after DropPeer, typed errors) are enforced here,
// before NIXL is asked.
type state struct {
	name     string
	ag       handle
	notifs   handle
	next     uint64
	gen      uint64
	regs     map[nixl.RegID]region
	peers    map[string]*peer
	lists    map[nixl.ListID]*list
	xfers    map[nixl.XferID]*xfer
	inflight int
	polls    int // the owner's own polls of the requests in flight (progress)
	dead     bool
	// hit is the registered descriptor that covered the last one checked
	// (valid while hitOK): a room's descriptors mostly lie in the region of
	// the one before, so most checks cost one comparison, not a scan of
	// every registration. Deregister clears it.
	hit     nixl.Desc
	hitKind nixl.MemKind
	hitOK   bool
}

type region struct {
	kind  nixl.MemKind
	descs []nixl.Desc
}

// peer is one loaded remote agent. gen changes on every fresh load, so lists
// and requests built against an older load are recognised as stale.
type peer struct {
	gen          uint64
	md           []byte
	disconnected bool
}

type list struct {
	h    handle
	peer string
	gen  uint64
	kind nixl.MemKind
	lens []uint64
}

type xfer struct {
	h     handle
	peer  string
	gen   uint64
	state nixl.State
	err   error
}

func newState(name string, o Options) (*state, error) {
	ag, st := capiCreateAgent(name, !o.NoProgressThread, syncStrict, uint64(o.ProgressDelay/time.Microsecond))
	if st != stSuccess {
		return nil, fmt.Errorf("libnixl: create agent %q: status %d: %w", name, st, nixl.ErrBackend)
	}
	s := &state{name: name, ag: ag, regs: map[nixl.RegID]region{}, peers: map[string]*peer{},
		lists: map[nixl.ListID]*list{}, xfers: map[nixl.XferID]*xfer{}}
	fail := func(err error) (*state, error) {
		capiDestroyAgent(ag)
		return nil, err
	}
	plugins, st := capiPlugins(ag)
	if st != stSuccess {
		return fail(fmt.Errorf("libnixl: list plugins: status %d: %w", st, nixl.ErrBackend))
	}
	if !slices.Contains(plugins, o.Backend) {
		return fail(fmt.Errorf("libnixl: backend plugin %q not available (have %v; NIXL_PLUGIN_DIR=%q): %w",
			o.Backend, plugins, os.Getenv("NIXL_PLUGIN_DIR"), nixl.ErrBackend))
	}
	if st := capiCreateBackend(ag, o.Backend, o.BackendParams); st != stSuccess {
		return fail(fmt.Errorf("libnixl: create backend %s %v: status %d: %w", o.Backend, o.BackendParams, st, nixl.ErrBackend))
	}
	if s.notifs, st = capiNewNotifMap(); st != stSuccess {
		return fail(fmt.Errorf("libnixl: notification map: status %d: %w", st, nixl.ErrBackend))
	}
	return s, nil
}

func (s *state) id() uint64 {
	s.next++
	return s.next
}

// registered reports whether d overlaps any registered region.
func (s *state) registered(d nixl.Desc) bool {
	for _, r := range s.regs {
		for _, x := range r.descs {
			if uint64(x.Addr) < d.End() && uint64(d.Addr) < x.End() {
				return true
			}
		}
	}
	return false
}

// covered reports whether d lies inside one registered local region of kind.
func (s *state) covered(kind nixl.MemKind, d nixl.Desc) bool {
	if s.hitOK && s.hitKind == kind && s.hit.Covers(d) {
		return true
	}
	for _, r := range s.regs {
		if r.kind != kind {
			continue
		}
		for _, x := range r.descs {
			if x.Covers(d) {
				s.hit, s.hitKind, s.hitOK = x, kind, true
				return true
			}
		}
	}
	return false
}

// known returns the loaded peer, or nil. The agent's own name is a valid
// target (NIXL's loopback) that needs no metadata.
func (s *state) known(name string) (*peer, bool) {
	if name == s.name {
		return &peer{}, true
	}
	p, ok := s.peers[name]
	return p, ok
}

// stale reports whether something built against (name, gen) outlived its load.
func (s *state) stale(name string, gen uint64) bool {
	if name == "" || name == s.name {
		return false
	}
	p, ok := s.peers[name]
	return !ok || p.gen != gen
}

// transportErr classifies a failed post, status or notification towards a
// peer. With the raw statuses (see rawStatus) NIXL says REMOTE_DISCONNECT
// itself. Through the C API alone it is folded into BACKEND; older NIXL
// releases invalidate a disconnected peer's metadata, so a BACKEND error after
// which check_remote_md no longer finds the peer is taken as a disconnect.
func (s *state) transportErr(peerName string, gen uint64, st int) error {
	if s.stale(peerName, gen) {
		return nixl.ErrPeerUnknown
	}
	p := s.peers[peerName]
	switch {
	case st == stDisconnect:
		if p != nil {
			p.disconnected = true
		}
		return nixl.ErrRemoteDisconnect
	case p != nil && p.disconnected:
		return nixl.ErrRemoteDisconnect
	case st == stNotFound:
		return nixl.ErrPeerUnknown
	case st == stRepost:
		return nixl.ErrRequestActive
	case st == stInvalid:
		return nixl.ErrInvalid
	}
	if p != nil && capiCheckMD(s.ag, peerName) != stSuccess {
		p.disconnected = true
		return nixl.ErrRemoteDisconnect
	}
	return nixl.ErrBackend
}

// settle records a status from post or get_xfer_status on an in-flight request.
func (s *state) settle(x *xfer, st int) {
	was := x.state == nixl.InProgress
	switch {
	case st == stSuccess:
		x.state, x.err = nixl.Done, nil
	case st == stInProg, st == stRepost: // REPOST_ACTIVE: NIXL still runs the last post
		x.state, x.err = nixl.InProgress, nil
	default:
		x.state = nixl.Failed
		x.err = nixl.Errorf(s.transportErr(x.peer, x.gen, st), "libnixl: transfer to %q: status %d", x.peer, st)
	}
	now := x.state == nixl.InProgress
	if was && !now {
		s.inflight--
	} else if !was && now {
		s.inflight++
	}
}

// progress polls every request in flight: it moves their state forward and
// makes NIXL send notifications it defers to getXferStatus. It reports
// whether any request left InProgress.
func (s *state) progress() bool {
	s.polls++
	ended := false
	for _, x := range s.xfers {
		if x.state == nixl.InProgress {
			s.settle(x, capiStatus(s.ag, x.h))
			ended = ended || x.state != nixl.InProgress
		}
	}
	return ended
}

// shutdown waits up to wait for requests in flight, releases every terminal
// request and every list, then destroys the agent (which tears down the rest,
// including requests that never settled).
func (s *state) shutdown(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for s.inflight > 0 && time.Now().Before(deadline) {
		s.progress()
		if s.inflight > 0 {
			time.Sleep(time.Millisecond) // sub-ms sleeps take ~1.1 ms here anyway
		}
	}
	for id, x := range s.xfers {
		if x.state != nixl.InProgress && capiRelease(s.ag, x.h) == stSuccess {
			delete(s.xfers, id)
		}
	}
	for id, l := range s.lists {
		capiReleaseList(s.ag, l.h)
		delete(s.lists, id)
	}
	capiFreeNotifMap(s.notifs)
	st := capiDestroyAgent(s.ag)
	s.dead = true
	if st != stSuccess {
		return fmt.Errorf("libnixl: destroy agent %q: status %d: %w", s.name, st, nixl.ErrBackend)
	}
	return nil
}
