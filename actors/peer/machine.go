package peer

import (
	"slices"
	"time"
)

// The transition table. Rows are states, columns are messages.
//
//	state    Register            LoadDone(cur)      Probed ok/unreach/refused       Deadline                Write          Staged write  Writable   Withdraw   Info       XferFailed(cur)  LinkLost  Drop   Shutdown  Back
//	absent   start               ·                  ·                               ·                       fail           fail          ·          ·          apply      ·                ·         ·      close     ·
//	loading  duplicate           ready | gone       ·                               ·                       fail           fail          ·          ·          queue      ·                ·         gone   close     ·
//	ready    comeback* | dup     ·                  post confirmed/suspect†/lose    probe                   post|confirm   wait          post|conf  withdraw   apply      lose             probe     gone   close     ·
//	suspect  comeback* | dup     ·                  back|fence† / ·|fence† / lose   probe; outage: fence    hold           wait          hold       withdraw   apply      lose             probe     gone   close     ·
//	fenced   start (unfence)     ·                  hold-up / hold-down / gone      probe; hold: restore    fail           fail          ·          ·          fail room  ·                probe     gone   close     restore|gone
//	gone     start               ·                  ·                               ·                       fail           fail          ·          ·          apply      ·                ·         ·      close     ·
//	closed   ·                   ·                  ·                               ·                       fail           fail          ·          ·          refuse     ·                ·         ·      ·         ·
//
// "·" is absorbed (a stale message). †: decided by the time since the last
// answer (Probed.At): suspect's outage deadline is armed for what is left of
// SafeAfter, an answer past SafeAfter or a miss past Budget fences.
// comeback*: the same agent registering again from the same endpoint (not a
// replay) ends the incarnation (its rooms fail peer_lost) and starts the next;
// any other registration of a live or loading agent is a duplicate (first
// wins). A replayed registration starts an
// incarnation only from absent or gone. A LoadDone of a superseded incarnation
// releases what it loaded, then starts the load that waited for it. Ending an
// incarnation (lose, fence, comeback, drop) fails its rooms and its held writes
// in the same step, and releases it from NIXL and the pool by incarnation.
//
// A staged write (a chunk into decode's staging ring) waits in the live
// incarnation until a Writable names it (its region is answered and the
// watermark is past it: the executor, which owns the regions, decides), then
// goes as any write (post, confirm, or held while suspect); a Withdraw of its
// room ends it unwritten, and every end of the incarnation fails it with the
// other held writes. Staging (a frame for the executor) changes nothing here.
//
// Outages are measured from the last answer (Probed.At, LoadDone.At: time
// enters as messages): an unanswered probe arms Outage for what is left of
// SafeAfter since then, and then for the rest of Budget; a probe result past
// either (its message may come before the deadline's) decides at once. A
// peer suspect past SafeAfter that answers is fenced, its fence hold starting
// with that answer.
//
// Lost and Back are the daemon's word: Lost is lose (or fence, when Fence)
// for ready and suspect, and drops a loading peer (fenced with nothing to
// restore); Back in fenced restores (Alive, a registration kept) or forgets
// (another agent registered at the endpoint); both are absorbed in every
// other state.

type queued struct{ info Info }

// waitingWrite is a staged write waiting for its region.
type waitingWrite struct {
	id, room uint64
	confirm  bool
}

// Machine is one decode peer.
type Machine struct {
	cfg   *Config
	state State
	inc   uint64 // the current incarnation (0: none yet)
	to    Endpoint
	reg   any // the current incarnation's registration
	fence any // fenced: the registration to load again
	// loadOut is the incarnation whose Load is in flight (0: none); pending
	// is the load waiting for it; loaded is the incarnation in NIXL now.
	loadOut, loaded uint64
	pending         *Load
	replay          bool
	linked          bool

	queue  []Info // infos and aborts while loading
	qBytes int
	// restoring: the loading incarnation is a restore (its refusal is quiet)
	restoring bool
	held      []uint64 // writes held while suspect
	// waiting are the staged writes waiting for their region (Writable).
	waiting []waitingWrite
	confirm []uint64 // writes waiting for a probe begun after them
	// writes counts the Write messages stepped; confirmAt is, for each
	// confirm entry, the count once it was stepped (Probed.Began).
	writes    uint64
	confirmAt []uint64
	probing   bool
	covers    int  // confirm writes queued before the probe in flight began
	unsafe    bool // suspect past SafeAfter
	upSince   bool // fenced: answering, FenceHoldUp armed
	// lastOK is when the endpoint last answered (or the incarnation was
	// loaded), on the clock of the messages that carry it; failing says
	// the last probe was not answered; lastProbe is what it found.
	lastOK    time.Time
	failing   bool
	lastProbe ProbeResult
	// confirmAll: the incarnation's writes all wait for a confirmation.
	confirmAll bool
	gens       [numKinds]uint32
	armed      [numKinds]bool
}

// New is a peer never registered.
func New(cfg *Config) *Machine { return &Machine{cfg: cfg} }

// State is the peer's state; Inc its current incarnation.
func (m *Machine) State() State { return m.state }

// Inc is the current incarnation (0: none).
func (m *Machine) Inc() uint64 { return m.inc }

// Loaded is the incarnation in NIXL now (0: none).
func (m *Machine) Loaded() uint64 { return m.loaded }

// Endpoint is where the current incarnation registered from.
func (m *Machine) Endpoint() Endpoint { return m.to }

// LoadOut says whether a load is in flight (its LoadDone is still to come).
func (m *Machine) LoadOut() bool { return m.loadOut != 0 }

// Quiet says whether the peer is closed with no load left out: nothing it
// started can still come back.
func (m *Machine) Quiet() bool { return m.state == Closed && m.loadOut == 0 }

// Held is how many writes wait (suspect, for a confirmation, or staged for
// their region).
func (m *Machine) Held() int { return len(m.held) + len(m.confirm) + len(m.waiting) }

// Waiting is how many staged writes wait for their region.
func (m *Machine) Waiting() int { return len(m.waiting) }

// Queued is how many infos and aborts wait for the load.
func (m *Machine) Queued() int { return len(m.queue) }

// Step applies one message.
func (m *Machine) Step(msg Msg) Effects {
	var fx Effects
	switch msg := msg.(type) {
	case Register:
		m.register(&fx, msg)
	case LoadDone:
		m.loadDone(&fx, msg)
	case Probed:
		m.probed(&fx, msg)
	case Deadline:
		m.deadline(&fx, msg)
	case Write:
		m.write(&fx, msg)
	case Writable:
		m.writable(&fx, msg)
	case Withdraw:
		m.withdraw(&fx, msg)
	case Info:
		m.info(&fx, msg)
	case XferFailed:
		if msg.Inc >= m.inc && m.state.Live() {
			m.lose(&fx, "NIXL connection lost")
		} else {
			fx.note(NoteStale)
		}
	case LinkLost:
		m.linkLost(&fx)
	case Drop:
		m.drop(&fx, msg)
	case Lost:
		m.lost(&fx, msg)
	case Back:
		m.back(&fx, msg)
	case Shutdown:
		m.shutdown(&fx)
	}
	return fx
}

func (m *Machine) register(fx *Effects, r Register) {
	switch m.state {
	case Closed:
		fx.note(NoteStale)
		return
	case Loading:
		fx.note(NoteDuplicate)
		return
	case Ready, Suspect:
		if r.Replay || r.From != m.to {
			fx.note(NoteDuplicate)
			return
		}
		fx.note(NoteReturned)
		m.end(fx, "registered again from its endpoint: decode cleared its connection to this prefill", false)
		fx.Forget = false // the new incarnation's record replaces it
	case Fenced:
		if r.Replay {
			fx.note(NoteDuplicate)
			return
		}
		m.fence = nil // registering again: whatever follows is after decode's reset
		m.upSince = false
	case Absent, Gone:
	}
	if r.Rejected != "" {
		fx.note(NoteRejected)
		m.disarmAll(fx)
		m.state, m.reg, m.to = Gone, nil, r.From
		return
	}
	m.confirmAll = r.Confirm
	m.start(fx, Load{Reg: r.Reg, Replay: r.Replay}, r.From, r.Epoch)
}

// start begins the next incarnation: its load starts now, or once the load
// still in flight (a superseded incarnation's) is back.
func (m *Machine) start(fx *Effects, l Load, from Endpoint, epoch uint64) {
	m.disarmAll(fx)
	m.inc = max(m.inc+1, epoch)
	l.Inc = m.inc
	m.restoring = l.Restored
	m.state, m.to, m.reg, m.replay = Loading, from, l.Reg, l.Replay
	m.unsafe, m.upSince, m.fence = false, false, nil
	if m.loadOut != 0 {
		m.pending = &l
		return
	}
	m.loadOut = l.Inc
	fx.Load = &l
}

func (m *Machine) loadDone(fx *Effects, d LoadDone) {
	if d.Inc == 0 || d.Inc != m.loadOut {
		fx.note(NoteStale)
		return
	}
	m.loadOut = 0
	if d.Inc != m.inc || m.state != Loading {
		// Superseded (dropped, replaced, shut down while loading): what it
		// loaded leaves NIXL before the next load starts.
		fx.note(NoteStale)
		if d.Err == "" {
			fx.Release = d.Inc
		}
		if m.pending != nil {
			l := *m.pending
			m.pending, m.loadOut = nil, l.Inc
			fx.Load = &l
		}
		return
	}
	fx.Apply = append(fx.Apply, m.queue...)
	m.queue, m.qBytes = nil, 0
	if d.Err != "" {
		m.state = Gone
		if m.restoring {
			fx.note(NoteDropped) // a restore refused: the fence simply ends
		} else if m.replay {
			fx.note(NoteReplayFailed)
			fx.Forget = true
		} else {
			fx.note(NoteRejected)
		}
		return
	}
	m.state, m.loaded = Ready, d.Inc
	m.lastOK, m.failing = d.At, false // the outage of a decode that never answers counts from here
	fx.note(NoteRegistered)
	fx.Dial, m.linked = true, true
	fx.Persist = m.reg
	m.armProbe(fx)
}

func (m *Machine) probed(fx *Effects, p Probed) {
	if !m.probing {
		fx.note(NoteStale)
		return
	}
	m.probing = false
	covers := m.covers
	m.covers = 0
	switch m.state {
	case Ready, Suspect:
		m.lastProbe = p.Result
		switch p.Result {
		case ProbeOK:
			if p.Began != 0 { // the probe says when it began: it answers for every write stepped before
				covers = 0
				for covers < len(m.confirmAt) && m.confirmAt[covers] <= p.Began {
					covers++
				}
			}
			m.answeredLive(fx, p.At, covers)
		case ProbeUnreachable:
			m.unanswered(fx, p.At)
		case ProbeRefused:
			m.lose(fx, "nothing listens at decode's endpoint: its process is gone")
		}
	case Fenced:
		m.lastProbe = p.Result
		switch p.Result {
		case ProbeOK:
			m.lastOK, m.failing = p.At, false
			m.upNow(fx)
		case ProbeUnreachable:
			m.failing = true
			m.upSince = false
			m.disarm(fx, FenceHoldUp)
		case ProbeRefused:
			m.disarmAll(fx)
			m.state, m.fence = Gone, nil
			fx.note(NoteDropped)
			m.closeLink(fx)
		}
	default:
		fx.note(NoteStale)
	}
}

// answeredLive: a live peer's endpoint answered. After an outage past
// SafeAfter decode may have failed its rooms: fenced (and, answering, its
// fence hold starts now); else what was held is posted, in order, then what
// the probe confirmed.
func (m *Machine) answeredLive(fx *Effects, at time.Time, covers int) {
	if out, known := m.outage(at); m.state == Suspect && (m.unsafe || known && out >= m.cfg.SafeAfter) {
		m.fenceNow(fx, "unreachable"+m.forWhile(out, known)+" (decode gives up after "+m.cfg.SafeAfter.String()+
			" at the earliest): decode may have failed its rooms")
		m.lastOK, m.failing = at, false
		m.upNow(fx)
		return
	}
	m.state = Ready
	m.unsafe = false
	m.lastOK, m.failing = at, false
	m.disarm(fx, Outage)
	fx.Post = append(fx.Post, m.held...) // in order, before anything confirmed after
	m.held = nil
	fx.Post = append(fx.Post, m.confirm[:covers]...)
	m.confirm, m.confirmAt = m.confirm[covers:], m.confirmAt[covers:]
	if len(m.confirm) > 0 {
		m.probeNow(fx)
	}
}

// unanswered: a live peer's probe went unanswered. What waited for a
// confirmation waits for an answer; past the budget (since the last answer)
// the peer is fenced; a ready one turns suspect, its outage deadline armed
// from the last answer.
func (m *Machine) unanswered(fx *Effects, at time.Time) {
	m.failing = true
	m.held = append(m.held, m.confirm...)
	m.confirm, m.confirmAt = nil, nil
	out, known := m.outage(at)
	if known && out >= m.cfg.Budget {
		m.fenceNow(fx, "unreachable"+m.forWhile(out, known)+", past decode's heartbeat budget of "+
			m.cfg.Budget.String()+": decode has failed its rooms")
		return
	}
	if m.state != Ready {
		return
	}
	m.state = Suspect
	switch {
	case !known:
		m.arm(fx, Outage, m.cfg.SafeAfter)
	case out >= m.cfg.SafeAfter:
		m.unsafe = true
		m.arm(fx, Outage, m.cfg.Budget-out)
	default:
		m.arm(fx, Outage, m.cfg.SafeAfter-out)
	}
}

// upNow: a fenced endpoint answers; its fence hold starts unless running.
func (m *Machine) upNow(fx *Effects) {
	if !m.upSince {
		m.upSince = true
		m.arm(fx, FenceHoldUp, m.cfg.FenceHold)
	}
}

// outage is how long since the endpoint last answered, as of at (known
// false when either time is missing: the deadlines alone decide).
func (m *Machine) outage(at time.Time) (time.Duration, bool) {
	if at.IsZero() || m.lastOK.IsZero() {
		return 0, false
	}
	return at.Sub(m.lastOK), true
}

func (m *Machine) forWhile(out time.Duration, known bool) string {
	if !known {
		return ""
	}
	return " for " + out.Round(time.Millisecond).String()
}

func (m *Machine) deadline(fx *Effects, d Deadline) {
	if d.Kind >= numKinds || !m.armed[d.Kind] || d.Gen != m.gens[d.Kind] {
		fx.note(NoteStale)
		return
	}
	m.armed[d.Kind] = false // fired: a second fire of the same arm is stale
	switch d.Kind {
	case ProbeTick:
		if m.state != Ready && m.state != Suspect && m.state != Fenced {
			fx.note(NoteStale)
			return
		}
		if !m.probing {
			m.probeNow(fx)
		}
		m.armProbe(fx)
	case Outage:
		if m.state != Suspect {
			fx.note(NoteStale)
			return
		}
		if !m.unsafe && m.cfg.Budget > m.cfg.SafeAfter {
			m.unsafe = true
			m.arm(fx, Outage, m.cfg.Budget-m.cfg.SafeAfter)
			return
		}
		m.fenceNow(fx, "unreachable past decode's heartbeat budget: decode has failed its rooms")
	case FenceHoldUp:
		if m.state != Fenced || !m.upSince {
			fx.note(NoteStale)
			return
		}
		if m.fence == nil {
			m.disarmAll(fx)
			m.state = Gone
			return
		}
		fx.note(NoteReturned)
		m.start(fx, Load{Reg: m.fence, Restored: true}, m.to, d.Epoch)
	}
}

func (m *Machine) write(fx *Effects, w Write) {
	m.writes++
	if w.Inc < m.inc || !m.state.Live() {
		fx.Fail = append(fx.Fail, w.ID)
		return
	}
	if w.Staged {
		m.waiting = append(m.waiting, waitingWrite{id: w.ID, room: w.Room, confirm: w.Confirm})
		return
	}
	m.gate(fx, w.ID, w.Confirm)
}

// gate is where a write of a live peer goes: held while suspect, waiting for
// a confirmation, or posted now.
func (m *Machine) gate(fx *Effects, id uint64, confirm bool) {
	switch {
	case m.state == Suspect:
		m.held = append(m.held, id)
	case (confirm || m.confirmAll) && !m.cfg.NoLiveness:
		m.confirm = append(m.confirm, id)
		m.confirmAt = append(m.confirmAt, m.writes)
		if !m.probing {
			m.probeNow(fx)
		}
	default:
		fx.Post = append(fx.Post, id)
	}
}

// writable releases the staged writes named, in that order, through the
// gate (a live peer: every end of an incarnation failed what waited).
func (m *Machine) writable(fx *Effects, w Writable) {
	for _, id := range w.IDs {
		i := slices.IndexFunc(m.waiting, func(x waitingWrite) bool { return x.id == id })
		if i < 0 {
			continue // withdrawn, failed, or released already
		}
		x := m.waiting[i]
		m.waiting = slices.Delete(m.waiting, i, i+1)
		m.gate(fx, x.id, x.confirm)
	}
}

// withdraw ends the staged writes of a failed room still waiting.
func (m *Machine) withdraw(fx *Effects, w Withdraw) {
	m.waiting = slices.DeleteFunc(m.waiting, func(x waitingWrite) bool {
		if x.room == w.Room {
			fx.Withdrawn = append(fx.Withdrawn, x.id)
			return true
		}
		return false
	})
}

func (m *Machine) info(fx *Effects, i Info) {
	switch m.state {
	case Loading:
		if m.cfg.MaxQueued > 0 && len(m.queue) >= m.cfg.MaxQueued ||
			m.cfg.MaxQueuedBytes > 0 && m.qBytes+i.Size > m.cfg.MaxQueuedBytes {
			fx.note(NoteQueueRefused)
			if i.Abort { // applied at once: it may overtake, but its room still fails
				fx.Apply = append(fx.Apply, i)
			} else {
				fx.Refuse = append(fx.Refuse, i)
			}
			return
		}
		m.queue = append(m.queue, i)
		m.qBytes += i.Size
	case Fenced:
		if i.Abort {
			fx.Apply = append(fx.Apply, i)
			return
		}
		fx.note(NoteFencedInfo)
		fx.FailInfos = append(fx.FailInfos, i)
	case Closed:
		fx.Refuse = append(fx.Refuse, i)
	default:
		fx.Apply = append(fx.Apply, i)
	}
}

func (m *Machine) linkLost(fx *Effects) {
	switch m.state {
	case Ready, Suspect, Fenced:
		if m.cfg.NoLiveness && m.state != Fenced {
			m.lose(fx, "connection lost")
			return
		}
		if !m.probing {
			m.probeNow(fx)
		}
	default:
		fx.note(NoteStale)
	}
}

func (m *Machine) drop(fx *Effects, d Drop) {
	switch m.state {
	case Absent, Gone, Closed:
		fx.note(NoteStale)
		return
	case Loading:
		// Its queued infos fail their rooms (nothing was loaded for them).
		m.failQueue(fx)
		m.pending = nil
		fx.FailRooms, fx.Reason = true, d.Why
	case Fenced:
		m.fence = nil
	default:
		m.end(fx, d.Why, false)
	}
	fx.note(NoteDropped)
	m.disarmAll(fx)
	m.state = Gone
	m.closeLink(fx)
	fx.Forget = !d.KeepState
}

// lost: the daemon says the decode is lost (fenced for an outage).
func (m *Machine) lost(fx *Effects, l Lost) {
	switch m.state {
	case Ready, Suspect:
		if l.Fence {
			m.fenceNow(fx, l.Why)
		} else {
			m.lose(fx, l.Why)
		}
	case Loading:
		// Lost while loading: the load comes back to a superseded
		// incarnation and is released; nothing is known to restore.
		fx.note(NoteLost)
		m.failQueue(fx)
		m.pending = nil
		fx.FailRooms, fx.Reason, fx.Forget = true, l.Why, true
		m.disarmAll(fx)
		m.state = Gone
		if l.Fence {
			fx.note(NoteFenced)
			m.state, m.fence = Fenced, nil
		}
	default:
		fx.note(NoteStale)
	}
}

// back: the daemon ends the fence (another agent took the endpoint, or a
// restore it decided).
func (m *Machine) back(fx *Effects, b Back) {
	if m.state != Fenced {
		fx.note(NoteStale)
		return
	}
	if !b.Alive || m.fence == nil {
		m.disarmAll(fx)
		m.state, m.fence = Gone, nil
		m.closeLink(fx)
		return
	}
	fx.note(NoteReturned)
	m.start(fx, Load{Reg: m.fence, Restored: true}, m.to, b.Epoch)
}

func (m *Machine) shutdown(fx *Effects) {
	if m.state == Closed {
		return
	}
	fx.Refuse = append(fx.Refuse, m.queue...)
	m.queue, m.qBytes = nil, 0
	m.failHeld(fx)
	if m.loaded != 0 {
		fx.Release, m.loaded = m.loaded, 0
	}
	m.pending = nil
	m.disarmAll(fx)
	m.closeLink(fx)
	m.state, m.fence = Closed, nil
}

// lose ends the incarnation for good: the decode is gone.
func (m *Machine) lose(fx *Effects, why string) {
	fx.note(NoteLost)
	m.end(fx, why, true)
	m.disarmAll(fx)
	m.state = Gone
	m.closeLink(fx)
}

// fenceNow ends the incarnation for an outage: its rooms fail, it stays
// probed (its link kept, so failures still reach decode) until it comes back.
func (m *Machine) fenceNow(fx *Effects, why string) {
	fx.note(NoteLost)
	fx.note(NoteFenced)
	reg := m.reg
	m.end(fx, why, true)
	m.disarm(fx, Outage)
	m.state, m.fence, m.unsafe, m.upSince = Fenced, reg, false, false
}

// end is what every end of a live incarnation does: its rooms and held
// writes fail, it leaves NIXL and the pool, its record goes.
func (m *Machine) end(fx *Effects, why string, forget bool) {
	fx.FailRooms, fx.Reason = true, why
	m.failHeld(fx)
	if m.loaded != 0 {
		fx.Release, m.loaded = m.loaded, 0
	}
	fx.Forget = forget
	if !forget {
		m.closeLink(fx) // replaced: the next incarnation dials afresh
	}
}

func (m *Machine) failQueue(fx *Effects) {
	for _, i := range m.queue {
		if i.Abort {
			fx.Apply = append(fx.Apply, i)
		} else {
			fx.FailInfos = append(fx.FailInfos, i)
		}
	}
	m.queue, m.qBytes = nil, 0
}

func (m *Machine) failHeld(fx *Effects) {
	fx.Fail = append(fx.Fail, m.held...)
	fx.Fail = append(fx.Fail, m.confirm...)
	for _, x := range m.waiting {
		fx.Fail = append(fx.Fail, x.id)
	}
	m.held, m.confirm, m.confirmAt, m.waiting = nil, nil, nil, nil
	m.covers = 0 // a probe still out answers for none of what comes next
}

func (m *Machine) closeLink(fx *Effects) {
	if m.linked {
		fx.CloseLink, m.linked = true, false
	}
}

func (m *Machine) probeNow(fx *Effects) {
	if m.cfg.NoLiveness {
		return
	}
	fx.Probe, m.probing, m.covers = true, true, len(m.confirm)
}

func (m *Machine) armProbe(fx *Effects) {
	if !m.cfg.NoLiveness {
		m.arm(fx, ProbeTick, m.cfg.Interval)
	}
}

func (m *Machine) arm(fx *Effects, k DeadlineKind, after time.Duration) {
	m.gens[k]++
	m.armed[k] = true
	fx.Arms = append(fx.Arms, Arm{Kind: k, After: after, Gen: m.gens[k]})
}

func (m *Machine) disarm(fx *Effects, k DeadlineKind) {
	if !m.armed[k] {
		return
	}
	m.gens[k]++
	m.armed[k] = false
	fx.Arms = append(fx.Arms, Arm{Kind: k, Gen: m.gens[k]})
}

func (m *Machine) disarmAll(fx *Effects) {
	for k := range numKinds {
		m.disarm(fx, k)
	}
}

// LastOK is when the endpoint last answered (or the incarnation loaded);
// Failing says its last probe went unanswered; LastProbe is what that probe
// found; Probing says a probe is out.
func (m *Machine) LastOK() time.Time      { return m.lastOK }
func (m *Machine) Failing() bool          { return m.failing }
func (m *Machine) LastProbe() ProbeResult { return m.lastProbe }
func (m *Machine) Probing() bool          { return m.probing }

// WritesVia says whether a write to the peer must be stepped by the machine
// now (held while suspect, or waiting for a confirmation); any other write
// of a ready peer is posted as it comes.
func (m *Machine) WritesVia() bool {
	return m.state == Suspect || m.state == Ready && (m.confirmAll || len(m.confirm) > 0)
}

// Armed reports whether the timer of kind k is armed and its generation.
func (m *Machine) Armed(k DeadlineKind) (bool, uint32) { return m.armed[k], m.gens[k] }
