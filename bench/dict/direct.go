package dict

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// Waiter is a transfer layer whose writes complete only while the transfer
// worker that posted them waits on them, as in SGLang: a worker thread posts
// a chunk's handles and then busy-waits on check_xfer_state with
// time.sleep(0) until every one is DONE (spec §5.2 step 5). When
// Config.Waiter is set, a worker calls Wait(room) after posting a chunk
// through Config.Transfers and before it reads the results.
type Waiter interface {
	Wait(room uint64)
}

// Direct posts a dict engine's writes straight to a NIXL agent and makes the
// worker that posted them wait exactly as SGLang's transfer_worker does: poll
// every handle of the chunk (Agent.Poll, check_xfer_state), yield the
// processor between rounds (runtime.Gosched, Python's time.sleep(0)), until
// every handle is Done or one failed. There is no pool, no timer and no
// wake-up: the waiting worker burns its share of a core, as upstream's does.
//
// It implements actors.Transfers (Post, from the worker goroutine) and
// Waiter. Posts are kept per worker (room % Workers, the engine's queue
// choice), so Wait touches only the waiting worker's own writes.
type Direct struct {
	ag      nixl.Agent
	local   *sglang.Local
	localKV nixl.ListID
	peers   map[string]directPeer
	slots   []directSlot

	stopWake func()
}

// Close stops the agent's wake-ups; the agent itself is the caller's.
func (d *Direct) Close() {
	if d.stopWake != nil {
		d.stopWake()
	}
}

// spinPolls is how many polls in a row without progress a waiting worker
// spins (SGLang's loop never stops spinning) before it parks on the agent's
// wake-up. See Wait.
const spinPolls = 256

type directPeer struct {
	peer *sglang.Peer
	list nixl.ListID
}

type directSlot struct {
	woke chan struct{} // the agent's OnProgress wake-up (capacity 1)
	mu   sync.Mutex
	plan sglang.Plan
	pend []directPending
	ids  []nixl.XferID
	st   []nixl.Status
}

type directPending struct {
	reqs []nixl.XferID
	done kv.DoneFunc
	fail kv.Reason
}

// NewDirect prepares the local KV list and every peer's list on ag (a NIXL
// agent shared with others: NIXL's STRICT mode). workers must equal the dict
// engine's Config.Workers.
func NewDirect(ag nixl.Agent, local *sglang.Local, peers []sglang.PeerGeometry, workers int) (*Direct, error) {
	if workers <= 0 {
		workers = 4
	}
	l, err := sglang.PrepLocalKV(ag, local)
	if err != nil {
		return nil, fmt.Errorf("dict direct: local KV list: %w", err)
	}
	d := &Direct{ag: ag, local: local, localKV: l, peers: map[string]directPeer{}, slots: make([]directSlot, workers)}
	for i := range d.slots {
		d.slots[i].woke = make(chan struct{}, 1)
	}
	if w, ok := ag.(nixl.Waker); ok {
		d.stopWake = w.OnProgress(func() {
			for i := range d.slots {
				select {
				case d.slots[i].woke <- struct{}{}:
				default:
				}
			}
		})
	}
	for _, g := range peers {
		p, err := sglang.NewPeer(local, g)
		if err != nil {
			return nil, fmt.Errorf("dict direct: peer %s: %w", g.Agent, err)
		}
		list, err := sglang.PrepPeerKV(ag, local, p)
		if err != nil {
			return nil, fmt.Errorf("dict direct: peer %s KV list: %w", g.Agent, err)
		}
		d.peers[g.Agent] = directPeer{peer: p, list: list}
	}
	return d, nil
}

func (d *Direct) slot(roomID uint64) *directSlot { return &d.slots[roomID%uint64(len(d.slots))] }

// Post implements actors.Transfers: it plans the chunk (SGLang's descriptors
// and notifications), makes and posts its NIXL requests, and leaves them for
// the posting worker's Wait.
func (d *Direct) Post(t kv.Transfer, done kv.DoneFunc) {
	s := d.slot(t.Room)
	s.mu.Lock()
	defer s.mu.Unlock()
	p := directPending{done: done}
	pe, ok := d.peers[t.Agent]
	if !ok {
		p.fail = kv.ReasonInvalidRequest
		s.pend = append(s.pend, p)
		return
	}
	c := sglang.Chunk{Room: t.Room, ChunkID: t.Chunk, IsLast: t.Last, SrcPages: t.SrcPages, DstPages: t.DstPages,
		SrcAux: t.SrcAux, DstAux: t.DstAux, SrcState: t.SrcState, DstState: t.DstState, NoKVChunks: t.Chunk}
	if err := d.local.Plan(&s.plan, pe.peer, &c); err != nil {
		p.fail = reasonOf(err)
		s.pend = append(s.pend, p)
		return
	}
	for i := range s.plan.Reqs {
		r := &s.plan.Reqs[i]
		notif := r.Notif
		if pe.peer.NoNotifs {
			r.Notif = nil
		}
		x, err := sglang.MakeReq(d.ag, d.localKV, pe.list, pe.peer.Agent, r)
		r.Notif = notif
		if err != nil {
			p.fail = reasonOf(err)
			break
		}
		st, err := d.ag.Post(x)
		if err != nil {
			_ = d.ag.Release(x)
			p.fail = reasonOf(err)
			break
		}
		if st == nixl.Done {
			_ = d.ag.Release(x)
			continue
		}
		p.reqs = append(p.reqs, x)
	}
	s.pend = append(s.pend, p)
}

// Wait implements Waiter: upstream's busy-wait over the handles the worker of
// roomID posted, one Poll of all of them per round and a yield between rounds.
// It reports every posted write (its DoneFunc) once all of its handles are
// terminal; the first failed handle fails the write.
//
// One deviation, measured: Python's time.sleep(0) is a system call that gives
// the OS thread away; Go's runtime.Gosched is not, and while every P runs a
// spinning worker Go's scheduler looks at the network poller only from sysmon
// (about every 10 ms), so goroutines waiting on sockets (the loopback agent's
// notification socket) starve. After spinPolls polls without progress, and
// unless a modelled completion is due within 1 ms (nixl.Dueer), the worker
// parks on the agent's wake-up (nixl.Waker) or until that due time.
func (d *Direct) Wait(roomID uint64) {
	s := d.slot(roomID)
	s.mu.Lock()
	defer s.mu.Unlock()
	idle := 0
	for {
		s.ids = s.ids[:0]
		for _, p := range s.pend {
			s.ids = append(s.ids, p.reqs...)
		}
		if len(s.ids) == 0 {
			break
		}
		if cap(s.st) < len(s.ids) {
			s.st = make([]nixl.Status, len(s.ids))
		}
		st := s.st[:len(s.ids)]
		if err := d.ag.Poll(s.ids, st); err != nil {
			for i := range s.pend {
				if s.pend[i].fail == kv.ReasonNone {
					s.pend[i].fail = reasonOf(err)
				}
				s.pend[i].reqs = s.pend[i].reqs[:0]
			}
			break
		}
		k, busy, moved := 0, false, false
		for i := range s.pend {
			p := &s.pend[i]
			keep := p.reqs[:0]
			for _, x := range p.reqs {
				switch st[k].State {
				case nixl.Done:
					_ = d.ag.Release(x)
					moved = true
				case nixl.Failed:
					_ = d.ag.Release(x)
					moved = true
					if p.fail == kv.ReasonNone {
						p.fail = reasonOf(st[k].Err)
					}
				default:
					keep = append(keep, x)
				}
				k++
			}
			p.reqs = keep
			busy = busy || len(keep) > 0
		}
		if !busy {
			break
		}
		if moved {
			idle = 0
		} else {
			idle++
		}
		if idle < spinPolls {
			runtime.Gosched() // time.sleep(0)
			continue
		}
		d.park(s)
		idle = 0
	}
	pend := s.pend
	s.pend = s.pend[:0]
	for _, p := range pend {
		p.done(p.fail, nil)
	}
	clear(pend)
}

// park waits for the agent's wake-up, or for its next modelled completion
// when that is 1 ms or more away (a due time sooner than that is spun for).
func (d *Direct) park(s *directSlot) {
	var until time.Duration
	if du, ok := d.ag.(nixl.Dueer); ok {
		if at, ok := du.Due(); ok {
			if until = time.Until(at); until < time.Millisecond {
				runtime.Gosched()
				return
			}
		}
	}
	if until == 0 {
		if d.stopWake == nil { // no wake-up to park on
			runtime.Gosched()
			return
		}
		<-s.woke
		return
	}
	t := time.NewTimer(until)
	defer t.Stop()
	select {
	case <-s.woke:
	case <-t.C:
	}
}

// reasonOf maps a NIXL error to a room failure reason, as the pool does.
func reasonOf(err error) kv.Reason {
	switch {
	case errors.Is(err, nixl.ErrRemoteDisconnect), errors.Is(err, nixl.ErrPeerUnknown):
		return kv.ReasonPeerLost
	case errors.Is(err, nixl.ErrInvalid):
		return kv.ReasonInvalidRequest
	default:
		return kv.ReasonTransferError
	}
}
