package peer

import (
	"fmt"
	"slices"
)

// checker is an oracle that watches one peer's messages and effects and
// checks the invariants after every step, keeping its own account of the
// world (what NIXL holds, which loads are out, which writes ended, which rooms
// belong to which incarnation) instead of trusting the machine's.
type checker struct {
	loadsOut []uint64 // Load effects without their LoadDone yet
	inNIXL   []uint64 // incarnations loaded (LoadDone ok) and not released
	writes   map[uint64]int
	ended    map[uint64]string // write -> "posted" | "failed"
	rooms    map[uint64]uint64 // room -> incarnation whose live state applied its info
	failedOf map[uint64]bool   // incarnations whose rooms failed
	// staged writes, and those a Writable released (the machine held them)
	staged, released map[uint64]bool
	linked           bool
	closed           bool
	probeOut         bool
}

func newChecker() checker {
	return checker{writes: map[uint64]int{}, ended: map[uint64]string{}, rooms: map[uint64]uint64{}, failedOf: map[uint64]bool{},
		staged: map[uint64]bool{}, released: map[uint64]bool{}}
}

func (c *checker) clone() checker {
	d := *c
	d.loadsOut, d.inNIXL = slices.Clone(c.loadsOut), slices.Clone(c.inNIXL)
	d.writes, d.ended, d.rooms, d.failedOf = cloneMap(c.writes), cloneMap(c.ended), cloneMap(c.rooms), cloneMap(c.failedOf)
	d.staged, d.released = cloneMap(c.staged), cloneMap(c.released)
	return d
}

func cloneMap[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (c *checker) key() string {
	return fmt.Sprint(c.loadsOut, c.inNIXL, c.ended, c.rooms, c.failedOf, c.linked, c.closed, c.probeOut, c.released)
}

// step applies msg to m and checks every invariant one step can break.
func (c *checker) step(m *Machine, msg Msg) (Effects, error) {
	before, incBefore := m.State(), m.Inc()
	if w, ok := msg.(Write); ok {
		c.writes[w.ID]++
		if w.Staged {
			c.staged[w.ID] = true
		}
	}
	if w, ok := msg.(Writable); ok {
		for _, id := range w.IDs {
			if _, ended := c.ended[id]; !ended && c.staged[id] && slices.ContainsFunc(m.waiting, func(x waitingWrite) bool { return x.id == id }) {
				c.released[id] = true
			}
		}
	}
	if d, ok := msg.(LoadDone); ok {
		i := slices.Index(c.loadsOut, d.Inc)
		if i < 0 {
			return Effects{}, fmt.Errorf("LoadDone %d without its load", d.Inc)
		}
		c.loadsOut = slices.Delete(c.loadsOut, i, i+1)
		if d.Err == "" {
			c.inNIXL = append(c.inNIXL, d.Inc) // NIXL holds it now, whatever the machine makes of it
		}
	}
	if _, ok := msg.(Probed); ok {
		c.probeOut = false
	}
	fx := m.Step(msg)
	after := m.State()

	// Effects, in the order the actor executes them.
	if fx.Release != 0 {
		i := slices.Index(c.inNIXL, fx.Release)
		if i < 0 {
			return fx, fmt.Errorf("release of incarnation %d, which NIXL does not hold (%v)", fx.Release, c.inNIXL)
		}
		c.inNIXL = slices.Delete(c.inNIXL, i, i+1)
	}
	if fx.FailRooms {
		c.failedOf[incBefore] = true
	}
	for _, id := range fx.Fail {
		if err := c.end(id, "failed"); err != nil {
			return fx, err
		}
	}
	for _, id := range fx.Withdrawn {
		if !c.staged[id] || c.released[id] {
			return fx, fmt.Errorf("write %d withdrawn but not a staged write waiting", id)
		}
		if err := c.end(id, "withdrawn"); err != nil {
			return fx, err
		}
	}
	if fx.CloseLink {
		c.linked = false
	}
	if fx.Load != nil {
		c.loadsOut = append(c.loadsOut, fx.Load.Inc)
	}
	if fx.Dial {
		c.linked = true
	}
	for _, i := range fx.Apply {
		if i.Abort {
			continue
		}
		if after.Live() {
			c.rooms[i.Room] = m.Inc()
		}
	}
	for _, id := range fx.Post {
		// Nothing is posted to a fenced or gone peer, nor to one not loaded,
		// nor for a write planned for another incarnation.
		if after != Ready || m.Loaded() != m.Inc() || !slices.Contains(c.inNIXL, m.Inc()) {
			return fx, fmt.Errorf("write %d posted while %v (loaded %d, incarnation %d, NIXL %v)", id, after, m.Loaded(), m.Inc(), c.inNIXL)
		}
		// A staged write is posted only once a Writable released it.
		if c.staged[id] && !c.released[id] {
			return fx, fmt.Errorf("staged write %d posted before a Writable named it", id)
		}
		if err := c.end(id, "posted"); err != nil {
			return fx, err
		}
	}
	if fx.Probe {
		if c.probeOut {
			return fx, fmt.Errorf("a second probe while one is out")
		}
		c.probeOut = true
	}
	if _, ok := msg.(Shutdown); ok {
		c.closed = true
	}

	// At most one live registration: one load in flight, NIXL holds at most
	// one incarnation, and a live state's is the current one.
	if len(c.loadsOut) > 1 {
		return fx, fmt.Errorf("%d loads of one agent in flight: %v", len(c.loadsOut), c.loadsOut)
	}
	if len(c.inNIXL) > 1 {
		return fx, fmt.Errorf("NIXL holds %d incarnations of one agent: %v", len(c.inNIXL), c.inNIXL)
	}
	if after.Live() && (m.Loaded() != m.Inc() || !slices.Contains(c.inNIXL, m.Inc())) {
		return fx, fmt.Errorf("%v with incarnation %d not loaded (NIXL %v)", after, m.Inc(), c.inNIXL)
	}
	// A peer coming back never inherits the old incarnation's rooms: when a
	// live incarnation ends, its rooms fail in that same step.
	// (Shutdown ends every room through the engine's close.)
	_, shut := msg.(Shutdown)
	if before.Live() && (!after.Live() || m.Inc() != incBefore) && !fx.FailRooms && !shut {
		return fx, fmt.Errorf("incarnation %d ended (%v -> %v) without failing its rooms", incBefore, before, after)
	}
	for r, inc := range c.rooms {
		if inc != m.Inc() && after.Live() && !c.failedOf[inc] {
			return fx, fmt.Errorf("room %d of incarnation %d alive under incarnation %d", r, inc, m.Inc())
		}
	}
	if c.closed && after != Closed {
		return fx, fmt.Errorf("after shutdown: %v", after)
	}
	// A peer that holds writes takes every write after them (the daemon
	// posts straight only when WritesVia is false): none overtakes.
	// (Staged writes always go through the actor and wait for their
	// region in any order.)
	if n := len(m.held) + len(m.confirm); n > 0 && !m.WritesVia() {
		return fx, fmt.Errorf("%d writes held while %v lets writes go straight", n, after)
	}
	// A fenced peer is still watched: it comes back or goes, never stays
	// fenced unprobed.
	if after == Fenced && !m.cfg.NoLiveness && !m.Probing() {
		if armed, _ := m.Armed(ProbeTick); !armed {
			return fx, fmt.Errorf("fenced with no probe out or armed")
		}
	}
	return fx, nil
}

func (c *checker) end(id uint64, how string) error {
	if c.writes[id] == 0 {
		return fmt.Errorf("write %d %s but never asked for", id, how)
	}
	if prev, ok := c.ended[id]; ok {
		return fmt.Errorf("write %d %s, already %s", id, how, prev)
	}
	c.ended[id] = how
	return nil
}

// quiescent checks what must hold once nothing is left to happen: every
// write ended, and a shut down peer holds nothing (NIXL, link, loads).
func (c *checker) quiescent(m *Machine) error {
	for id := range c.writes {
		if _, ok := c.ended[id]; !ok {
			return fmt.Errorf("write %d never ended (%v, %d held)", id, m.State(), m.Held())
		}
	}
	if c.closed {
		if len(c.inNIXL) != 0 || c.linked || len(c.loadsOut) != 0 || m.Held() != 0 || m.Queued() != 0 {
			return fmt.Errorf("shut down but NIXL %v, linked %v, loads %v, held %d, queued %d", c.inNIXL, c.linked,
				c.loadsOut, m.Held(), m.Queued())
		}
	}
	return nil
}
