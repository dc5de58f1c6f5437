package room

import (
	"fmt"
	"slices"

	"github.com/kvxfer/kvxfer/kv"
)

// checker is an oracle that watches one room's messages and effects and checks
// the architecture's invariants after every step. It keeps its own account of
// what was posted and completed rather than trusting the machine's.
type checker struct {
	// Scenario knowledge; zero values disable the matching checks.
	realAgents []string // non-dummy agents whose writes Success requires
	chunks     int      // chunks the scheduler sends in total
	wantState  bool     // the last chunk must carry state

	polled          kv.Status
	terminalPubs    int
	failed          bool // Failed was published
	retired         bool
	abortDelivered  bool // an abort reached the room while it was live
	drainFired      bool
	posts           []kv.Transfer
	done            []uint32
	doneErr         bool
	lastArmGen      uint32
	lastFx          Effects // of the latest step, for tests that inspect it
	nonTerminalPoll bool
}

func (c *checker) clone() checker {
	d := *c
	d.posts = slices.Clone(c.posts)
	d.done = slices.Clone(c.done)
	return d
}

func (c *checker) key() string {
	return fmt.Sprintf("%v|%d|%v|%v|%v|%v|%v|%v|%v|%v|%d", c.polled, c.terminalPubs, c.failed, c.retired,
		c.abortDelivered, c.drainFired, c.doneErr, c.posts, c.done, c.nonTerminalPoll, c.lastArmGen)
}

func (c *checker) outstanding() int { return len(c.posts) - len(c.done) }

// step applies msg to m and checks every invariant that one step can break.
func (c *checker) step(m *Machine, msg Msg) error {
	before, _ := m.Status()
	armedKind, _ := m.Armed()
	live := !m.Retired()
	hadAgent := false
	if pl, ok := msg.(PeerLost); ok {
		hadAgent = m.hasAgent(pl.Agent)
	}
	fx := m.Step(msg)
	c.lastFx = fx
	after, why := m.Status()

	switch msg := msg.(type) {
	case Abort, DecodeAbort, Clear:
		if live && !before.Terminal() {
			c.abortDelivered = true
			// Invariant 5: published Failed at once.
			if after != kv.StatusFailed {
				return fmt.Errorf("inv5: %s on a live %v room left it %v", msgName(msg), before, after)
			}
		}
	case PeerLost:
		if live && !before.Terminal() && after != kv.StatusFailed && hadAgent {
			return fmt.Errorf("inv5: peer lost did not fail the room")
		}
	case Deadline:
		if armedKind == DrainDeadline && msg.Gen == c.lastArmGen {
			c.drainFired = true
		}
	case XferDone:
		if slices.Contains(c.done, msg.Seq) || !c.posted(msg.Seq) {
			if !fx.Ignored {
				return fmt.Errorf("duplicate or unknown %s was not ignored", msgName(msg))
			}
		} else {
			c.done = append(c.done, msg.Seq)
			if msg.Fail != kv.ReasonNone {
				c.doneErr = true
			}
		}
	}

	// An Open for a room whose opened incarnation retired starts a new
	// incarnation (room ids are reused only after the old one is gone).
	if _, isOpen := msg.(Open); isOpen && c.retired && fx.Revived && fx.Published {
		if after != kv.StatusBootstrapping || len(fx.Posts) > 0 || fx.Arm.Kind != BootstrapDeadline {
			return fmt.Errorf("new incarnation started as %s", summary(fx))
		}
		*c = checker{realAgents: c.realAgents, chunks: c.chunks, wantState: c.wantState,
			polled: after, nonTerminalPoll: true, lastArmGen: fx.Arm.Gen, lastFx: fx}
		return nil
	}
	// Invariant 6: a retired room changes nothing.
	// The one exception: the sender of a room that failed before it was opened
	// (abort before sender) revives it, still Failed, to hear the answer.
	if c.retired {
		_, isOpen := msg.(Open)
		if len(fx.Posts) > 0 || fx.Published || (fx.Arm.Kind != NoDeadline || fx.Revived) && !isOpen {
			return fmt.Errorf("inv6: retired room produced %s", summary(fx))
		}
		if fx.Revived {
			c.retired = false
		}
	}
	// Invariant 4: nothing is posted for a failed room.
	if len(fx.Posts) > 0 && (c.failed || after == kv.StatusFailed) {
		return fmt.Errorf("inv4: posted %d writes for a failed room", len(fx.Posts))
	}
	c.posts = append(c.posts, fx.Posts...)

	// Invariant 1 and 9: terminal is absorbing; polls are monotonic; exactly one
	// terminal answer is published.
	if before.Terminal() && after != before {
		return fmt.Errorf("inv1: terminal %v became %v", before, after)
	}
	if fx.Published {
		if fx.Status != after || fx.Reason != why {
			return fmt.Errorf("published %v/%v but status is %v/%v", fx.Status, fx.Reason, after, why)
		}
		if after.Terminal() {
			c.terminalPubs++
			if c.terminalPubs > 1 {
				return fmt.Errorf("inv9: a second terminal status was published")
			}
		}
	} else if after != before {
		return fmt.Errorf("status moved %v->%v without a publish", before, after)
	}
	if c.nonTerminalPoll && !c.polled.Terminal() && after != kv.StatusFailed && after < c.polled {
		return fmt.Errorf("inv9: poll went backwards %v -> %v", c.polled, after)
	}
	c.polled, c.nonTerminalPoll = after, true
	if after == kv.StatusFailed {
		c.failed = true
	}

	// Invariant 3: Success is earned.
	if fx.Published && after == kv.StatusSuccess {
		if err := c.successEarned(); err != nil {
			return fmt.Errorf("inv3: %v", err)
		}
	}

	// Invariant 10: both sides agree. Decode hears of success only in the
	// step that publishes Success, once per real agent, with the held
	// notifications; an ABORT_ACK never follows an expired drain.
	if err := c.agree(fx, after); err != nil {
		return fmt.Errorf("inv10: %v", err)
	}

	// Invariant 7: decode is told, and the room released, only after the drain.
	if (len(fx.Notices) > 0 || fx.Retire) && c.outstanding() > 0 && !c.drainFired {
		return fmt.Errorf("inv7: %s with %d writes outstanding", summary(fx), c.outstanding())
	}

	// Invariant 2: every live phase has exactly one armed deadline, and the
	// wrapper was told about it.
	if fx.Arm.Kind != NoDeadline {
		c.lastArmGen = fx.Arm.Gen
	}
	kind, gen := m.Armed()
	if fx.Retire {
		c.retired = true
	}
	if !m.Retired() {
		if kind == NoDeadline {
			return fmt.Errorf("inv2: live room in phase %s has no deadline", m.Phase())
		}
		if gen != c.lastArmGen {
			return fmt.Errorf("inv2: armed gen %d was never announced (last Arm %d)", gen, c.lastArmGen)
		}
	} else if kind != NoDeadline {
		return fmt.Errorf("inv2: retired room still has a %s deadline", kind)
	}
	return nil
}

// quiesce fires whatever deadline is armed until the room retires, as time
// passing would, and checks that it ends terminal and released.
func (c *checker) quiesce(m *Machine) error {
	for i := 0; i < 6 && !m.Retired(); i++ {
		_, gen := m.Armed()
		if err := c.step(m, Deadline{Gen: gen}); err != nil {
			return fmt.Errorf("at quiescence: %w", err)
		}
	}
	st, _ := m.Status()
	switch {
	case !m.Retired():
		return fmt.Errorf("room never retired (phase %s)", m.Phase())
	case !st.Terminal():
		return fmt.Errorf("room retired non-terminal: %v", st)
	case c.abortDelivered && st != kv.StatusFailed:
		return fmt.Errorf("inv5: an abort was delivered but the room ended %v", st)
	case c.doneErr && st == kv.StatusSuccess:
		return fmt.Errorf("a write failed but the room ended Success")
	}
	return nil
}

func (c *checker) successEarned() error {
	if c.outstanding() != 0 || c.doneErr {
		return fmt.Errorf("success with %d writes outstanding (err=%v)", c.outstanding(), c.doneErr)
	}
	if c.chunks == 0 {
		return nil
	}
	for _, agent := range c.realAgents {
		seen := map[int]bool{}
		for _, p := range c.posts {
			if p.Agent != agent {
				continue
			}
			seen[p.Chunk] = true
			if p.Last != (p.Chunk == c.chunks-1) {
				return fmt.Errorf("chunk %d to %s has last=%v", p.Chunk, agent, p.Last)
			}
			if p.Last && c.wantState && len(p.DstState) == 0 {
				return fmt.Errorf("last chunk to %s carries no state", agent)
			}
		}
		if len(seen) != c.chunks {
			return fmt.Errorf("agent %s got chunks %v of %d", agent, seen, c.chunks)
		}
	}
	return nil
}

func (c *checker) posted(seq uint32) bool {
	for _, p := range c.posts {
		if p.Seq == seq {
			return true
		}
	}
	return false
}

func (c *checker) agree(fx Effects, after kv.Status) error {
	var done []string
	for _, n := range fx.Notices {
		switch n.Kind {
		case Completion:
			if !fx.Published || after != kv.StatusSuccess {
				return fmt.Errorf("completion told to %s in a step that did not publish Success (%v)", n.Agent, after)
			}
			done = append(done, n.Agent)
			for _, p := range c.posts {
				if p.Agent == n.Agent && p.Last && p.HoldSignal && len(n.Signal) == 0 {
					return fmt.Errorf("completion to %s without the held notifications", n.Agent)
				}
			}
		case AbortAck:
			if c.drainFired {
				return fmt.Errorf("ABORT_ACK after the drain deadline expired: a write may still land")
			}
		}
	}
	if fx.Published && after == kv.StatusSuccess && c.chunks > 0 {
		slices.Sort(done)
		want := slices.Clone(c.realAgents)
		slices.Sort(want)
		if !slices.Equal(done, want) {
			return fmt.Errorf("success told to %v, want every real agent %v", done, want)
		}
	}
	return nil
}
