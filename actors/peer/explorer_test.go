package peer

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The interleaving explorer enumerates every ordering of a bounded set of
// peer events (a scenario's fixed messages, in any order their causal
// predecessors allow, interleaved with the world's answers: each load's
// result, ok or failed; each probe's result, ok, unreachable or refused; each
// armed deadline firing) and checks the invariants (checker_test.go) after
// every step and at quiescence. Orderings that reach an identical state share
// their future, so each state is explored once and orderings are counted.

var exploreCfg = Config{Interval: time.Second, SafeAfter: 2 * time.Second, Budget: 4 * time.Second,
	FenceHold: 3 * time.Second, MaxQueued: 2}

type fixed struct {
	msg   Msg
	after []int // indexes that must have been delivered first; -1: every other
}

type scenario struct {
	name      string
	cfg       Config
	msgs      []fixed
	probes    int // probe results the world may give
	deadlines int // deadline fires
	loadErrs  bool
	want      []Note // notes some ordering must reach (the scenario explores what it says)
	restores  bool   // some ordering must restore a fenced peer
	// timed: results carry the time they came back (the n-th probe result
	// 2n s in, a load's result at the time of the last probe's), so
	// outages are measured from the last answer as well as by deadlines.
	timed bool
	// probeFences: some ordering must fence on a probe's result (its time
	// past SafeAfter or the budget), not on a deadline.
	probeFences bool
}

// at is when a result comes back, probes being the probe results left.
func (e *explorer) at(probes int) time.Time {
	if !e.sc.timed {
		return time.Time{}
	}
	return sec(2 * (e.sc.probes - probes + 1))
}

type explorer struct {
	t        *testing.T
	sc       *scenario
	memo     map[string]uint64
	path     []string
	bad      int
	seen     map[Note]bool
	restored bool
	// probeFenced: some ordering fenced on a probe result.
	probeFenced bool
}

func (e *explorer) run() (orderings uint64, states int) {
	e.memo, e.seen = map[string]uint64{}, map[Note]bool{}
	m := New(&e.sc.cfg)
	c := newChecker()
	n := e.visit(m, &c, uint32(1)<<len(e.sc.msgs)-1, e.sc.probes, e.sc.deadlines)
	return n, len(e.memo)
}

func (m *Machine) key() string {
	c := *m
	c.cfg = nil
	return fmt.Sprintf("%+v", c)
}

func (e *explorer) visit(m *Machine, c *checker, remaining uint32, probes, deadlines int) uint64 {
	if e.bad > 0 {
		return 0
	}
	key := m.key() + "#" + c.key() + "#" + strconv.FormatUint(uint64(remaining), 2) + "#" +
		strconv.Itoa(probes) + "/" + strconv.Itoa(deadlines)
	if n, ok := e.memo[key]; ok {
		return n
	}
	var total uint64
	moves := 0
	try := func(msg Msg, rem uint32, p, d int) {
		moves++
		total += e.try(m, c, msg, rem, p, d)
	}
	for i, f := range e.sc.msgs {
		if remaining&(1<<i) != 0 && e.ready(f, i, remaining) {
			try(f.msg, remaining&^(1<<i), probes, deadlines)
		}
	}
	for _, inc := range c.loadsOut {
		try(LoadDone{Inc: inc, At: e.at(probes + 1)}, remaining, probes, deadlines)
		if e.sc.loadErrs {
			try(LoadDone{Inc: inc, Err: "refused", At: e.at(probes + 1)}, remaining, probes, deadlines)
		}
	}
	if c.probeOut {
		if probes > 0 {
			for _, r := range []ProbeResult{ProbeOK, ProbeUnreachable, ProbeRefused} {
				try(Probed{Result: r, At: e.at(probes)}, remaining, probes-1, deadlines)
			}
		} else {
			try(Probed{Result: ProbeOK, At: e.at(0)}, remaining, 0, deadlines) // the budget spent: the decode answers
		}
	}
	if deadlines > 0 {
		for k := range numKinds {
			if armed, gen := m.Armed(k); armed {
				try(Deadline{Kind: k, Gen: gen}, remaining, probes, deadlines-1)
			}
		}
	}
	if moves == 0 {
		if remaining != 0 {
			e.fail("stuck with messages left", remaining)
			return 0
		}
		if err := c.quiescent(m); err != nil {
			e.fail(err.Error(), remaining)
			return 0
		}
		total = 1
	}
	e.memo[key] = total
	return total
}

func (e *explorer) ready(f fixed, i int, remaining uint32) bool {
	for _, a := range f.after {
		if a == -1 {
			if remaining&^(1<<i) != 0 {
				return false
			}
			continue
		}
		if remaining&(1<<a) != 0 {
			return false
		}
	}
	return true
}

func (e *explorer) try(m *Machine, c *checker, msg Msg, remaining uint32, probes, deadlines int) uint64 {
	m2, c2 := *m, c.clone()
	m2.queue = append([]Info(nil), m.queue...)
	m2.held = append([]uint64(nil), m.held...)
	m2.confirm = append([]uint64(nil), m.confirm...)
	m2.confirmAt = append([]uint64(nil), m.confirmAt...)
	m2.waiting = append([]waitingWrite(nil), m.waiting...)
	if m.pending != nil {
		p := *m.pending
		m2.pending = &p
	}
	e.path = append(e.path, fmt.Sprintf("%T%+v", msg, msg))
	defer func() { e.path = e.path[:len(e.path)-1] }()
	fx, err := c2.step(&m2, msg)
	if err != nil {
		e.fail(err.Error(), remaining)
		return 0
	}
	for _, n := range fx.Notes {
		e.seen[n] = true
	}
	e.restored = e.restored || fx.Load != nil && fx.Load.Restored
	if _, ok := msg.(Probed); ok && fx.Has(NoteFenced) {
		e.probeFenced = true
	}
	return e.visit(&m2, &c2, remaining, probes, deadlines)
}

func (e *explorer) fail(why string, remaining uint32) {
	e.bad++
	e.t.Errorf("%s: %s (remaining %b)\n  path: %s", e.sc.name, why, remaining, strings.Join(e.path, "\n        "))
}

var ep1, ep2 = Endpoint{IP: "10.0.0.2", Port: 7000}, Endpoint{IP: "10.0.0.3", Port: 7000}

func scenarios() []*scenario {
	last := []int{-1}
	return []*scenario{
		{name: "register, comeback, late transfer result", cfg: exploreCfg, probes: 2, deadlines: 3, loadErrs: true,
			want: []Note{NoteReturned, NoteLost, NoteStale, NoteRejected, NoteRegistered},
			msgs: []fixed{
				{msg: Register{From: ep1, Reg: "r1"}},
				{msg: Info{Room: 1}, after: []int{0}},
				{msg: Write{ID: 1, Inc: 1}, after: []int{0}},
				{msg: Register{From: ep1, Reg: "r2"}, after: []int{0}},
				{msg: XferFailed{Inc: 1}, after: []int{2}},
				{msg: Info{Room: 2}, after: []int{3}},
				{msg: Write{ID: 2, Inc: 2}, after: []int{3}},
				{msg: Shutdown{}, after: last},
			}},
		{name: "replay, register, restore after an outage", cfg: exploreCfg, probes: 2, deadlines: 5, restores: true,
			want: []Note{NoteFenced, NoteReturned, NoteDuplicate, NoteLost},
			msgs: []fixed{
				{msg: Register{From: ep1, Replay: true, Reg: "stored"}},
				{msg: Register{From: ep1, Reg: "fresh"}},
				{msg: Write{ID: 1, Inc: 1}},
				{msg: Write{ID: 2, Inc: 1, Confirm: true}},
				{msg: Info{Room: 1}},
				{msg: LinkLost{}},
				{msg: Shutdown{}, after: last},
			}},
		{name: "outage, fence, re-registration from another endpoint", cfg: exploreCfg, probes: 3, deadlines: 4, loadErrs: true,
			want: []Note{NoteFenced, NoteDropped, NoteFencedInfo},
			msgs: []fixed{
				{msg: Register{From: ep1, Reg: "r1"}},
				{msg: Write{ID: 1, Inc: 1}, after: []int{0}},
				{msg: Info{Room: 1}, after: []int{0}},
				{msg: Info{Room: 2}},
				{msg: Register{From: ep2, Reg: "r2"}, after: []int{0}},
				{msg: Write{ID: 2, Inc: 2, Confirm: true}, after: []int{4}},
				{msg: Drop{Why: "activation failed", KeepState: true}, after: []int{1}},
				{msg: Shutdown{}, after: last},
			}},
		{name: "timed probes: outage from the last answer, confirmed writes, restore", cfg: exploreCfg, probes: 3, deadlines: 3,
			timed: true, restores: true, probeFences: true, want: []Note{NoteFenced, NoteReturned, NoteLost, NoteStale},
			msgs: []fixed{
				{msg: Register{From: ep1, Reg: "r1", Confirm: true}},
				{msg: Write{ID: 1, Inc: 1}, after: []int{0}},
				{msg: Write{ID: 2, Inc: 1}, after: []int{0}},
				{msg: Info{Room: 1}, after: []int{0}},
				{msg: XferFailed{Inc: 1}, after: []int{1}},
				{msg: Write{ID: 3, Inc: 2}, after: []int{0}},
				{msg: Shutdown{}, after: last},
			}},
		{name: "no liveness: link loss drops at once", cfg: Config{NoLiveness: true, MaxQueued: 1}, probes: 0, deadlines: 0, loadErrs: true,
			want: []Note{NoteLost, NoteQueueRefused, NoteReturned},
			msgs: []fixed{
				{msg: Register{From: ep1, Reg: "r1"}},
				{msg: Info{Room: 1}},
				{msg: Info{Room: 2, Abort: true}},
				{msg: Info{Room: 3}},
				{msg: Write{ID: 1, Inc: 1, Confirm: true}},
				{msg: LinkLost{}},
				{msg: Register{From: ep1, Reg: "r2"}, after: []int{5}},
				{msg: Write{ID: 2, Inc: 2}, after: []int{6}},
				{msg: Shutdown{}, after: last},
			}},
		{name: "watch outside: lost with a fence, back, re-registration, late results", cfg: Config{NoLiveness: true, MaxQueued: 2},
			loadErrs: true, restores: true, want: []Note{NoteFenced, NoteReturned, NoteFencedInfo, NoteStale},
			msgs: []fixed{
				{msg: Register{From: ep1, Reg: "r1"}},
				{msg: Write{ID: 1, Inc: 1}},
				{msg: Info{Room: 1}},
				{msg: Lost{Why: "unreachable past the budget", Fence: true}, after: []int{0}},
				{msg: Info{Room: 2}, after: []int{3}},
				{msg: Back{Alive: true}, after: []int{3}},
				{msg: Register{From: ep1, Reg: "r2"}, after: []int{3}},
				{msg: Write{ID: 2, Inc: 2}, after: []int{5}},
				{msg: XferFailed{Inc: 1}, after: []int{1}},
				{msg: Shutdown{}, after: last},
			}},
		{name: "staged writes: writable, withdrawn, held while suspect, failed with the incarnation", cfg: exploreCfg,
			probes: 2, deadlines: 3, want: []Note{NoteLost, NoteFenced, NoteRegistered},
			msgs: []fixed{
				{msg: Register{From: ep1, Reg: "r1"}},
				{msg: Write{ID: 1, Inc: 1, Staged: true, Room: 1}, after: []int{0}},
				{msg: Write{ID: 2, Inc: 1, Staged: true, Room: 2, Confirm: true}, after: []int{0}},
				{msg: Writable{IDs: []uint64{2, 1}}, after: []int{1, 2}},
				{msg: Withdraw{Room: 1}, after: []int{1}},
				{msg: Staging{Payload: "watermark"}},
				{msg: Shutdown{}, after: last},
			}},
		{name: "watch outside: lost while loading, gone, back refused", cfg: Config{NoLiveness: true},
			loadErrs: true, want: []Note{NoteLost, NoteFenced, NoteStale},
			msgs: []fixed{
				{msg: Register{From: ep1, Replay: true, Reg: "stored"}},
				{msg: Info{Room: 1}},
				{msg: Lost{Why: "nothing listens", Fence: false}},
				{msg: Lost{Why: "outage", Fence: true}},
				{msg: Back{Alive: false}},
				{msg: Register{From: ep2, Reg: "r2"}},
				{msg: Write{ID: 1, Inc: 2}},
				{msg: Shutdown{}, after: last},
			}},
	}
}

func TestExplorePeerInterleavings(t *testing.T) {
	var all uint64
	for _, sc := range scenarios() {
		e := &explorer{t: t, sc: sc}
		n, states := e.run()
		if n == 0 && e.bad == 0 {
			t.Errorf("%s: no ordering explored", sc.name)
		}
		t.Logf("%s: %d orderings, %d states", sc.name, n, states)
		for _, w := range sc.want {
			if !e.seen[w] {
				t.Errorf("%s: no ordering reached %v", sc.name, w)
			}
		}
		if sc.probeFences && !e.probeFenced {
			t.Errorf("%s: no ordering fenced on a probe's result", sc.name)
		}
		if sc.restores && !e.restored {
			t.Errorf("%s: no ordering restored the fenced peer", sc.name)
		}
		all += n
	}
	t.Logf("total: %d orderings", all)
}
