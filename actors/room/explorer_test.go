package room

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// The interleaving explorer enumerates every causally valid ordering of a
// bounded message set on one machine and checks the invariants (checker_test.go)
// after every step and at quiescence. Orderings that reach an identical state
// (machine, oracle and remaining messages) share their future, so each state is
// explored once and the number of orderings is counted, not re-walked.

// fixed is one message of a scenario's set with its causal predecessors.
type fixed struct {
	msg      Msg // nil: fire whatever deadline is armed at that point
	after    []int
	terminal bool // only once the scheduler has seen a terminal status (Clear)
}

type scenario struct {
	name     string
	msgs     []fixed
	oracle   checker
	errDones bool // each XferDone may also fail
}

type explorer struct {
	t         *testing.T
	sc        *scenario
	memo      map[string]uint64
	path      []string
	terminals map[string]int
}

func (e *explorer) run() (orderings uint64, states int) {
	e.memo = map[string]uint64{}
	e.terminals = map[string]int{}
	m := New(&holdCfg, 1)
	c := e.sc.oracle.clone()
	all := uint32(1)<<len(e.sc.msgs) - 1
	n := e.visit(m, &c, all)
	return n, len(e.memo)
}

func (e *explorer) visit(m *Machine, c *checker, remaining uint32) uint64 {
	key := m.key() + "#" + c.key() + "#" + strconv.FormatUint(uint64(remaining), 2)
	if n, ok := e.memo[key]; ok {
		return n
	}
	var total uint64
	moves := 0
	for i, f := range e.sc.msgs {
		if remaining&(1<<i) == 0 || !e.ready(f, m, remaining) {
			continue
		}
		moves++
		msg := f.msg
		if msg == nil {
			_, gen := m.Armed()
			msg = Deadline{Gen: gen}
		}
		total += e.try(m, c, remaining&^(1<<i), msg)
	}
	for _, p := range c.posts {
		if containsSeq(c.done, p.Seq) {
			continue
		}
		moves++
		total += e.try(m, c, remaining, XferDone{Seq: p.Seq, Signal: signalFor(p)})
		if e.sc.errDones {
			total += e.try(m, c, remaining, XferDone{Seq: p.Seq, Fail: kv.ReasonTransferError})
		}
	}
	if moves == 0 {
		if remaining != 0 {
			// Only guarded messages are left (Clear before any terminal
			// status): time passes, as it would in a real deployment.
			mm, cc := m.clone(), c.clone()
			_, gen := mm.Armed()
			total = e.try(mm, &cc, remaining, Deadline{Gen: gen})
		} else {
			mm, cc := m.clone(), c.clone()
			if err := cc.quiesce(mm); err != nil {
				e.fail(err)
			}
			st, why := mm.Status()
			e.terminals[st.String()+"/"+why.String()]++
			total = 1
		}
	}
	e.memo[key] = total
	return total
}

func (e *explorer) try(m *Machine, c *checker, remaining uint32, msg Msg) uint64 {
	mm, cc := m.clone(), c.clone()
	e.path = append(e.path, msgName(msg))
	if err := cc.step(mm, msg); err != nil {
		e.fail(err)
	}
	n := e.visit(mm, &cc, remaining)
	e.path = e.path[:len(e.path)-1]
	return n
}

func (e *explorer) ready(f fixed, m *Machine, remaining uint32) bool {
	for _, p := range f.after {
		if remaining&(1<<p) != 0 {
			return false
		}
	}
	if f.terminal {
		st, _ := m.Status()
		return st.Terminal()
	}
	return true
}

func (e *explorer) fail(err error) {
	e.t.Helper()
	e.t.Fatalf("scenario %q: %v\n  ordering: %s", e.sc.name, err, strings.Join(e.path, " → "))
}

func containsSeq(list []uint32, s uint32) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Message indices used by the scenarios below.
const (
	iOpen = iota
	iTIa
	iTIb
	iInit
	iSend1
	iSend2
	iClear
	iAbort
	iDecodeAbort
	iDeadline
)

// baseSet is the bounded message set the explorer permutes: Open, two TransferInfos (two agents), Init,
// two Sends (the second last), the XferDones of what was posted (dynamic), a
// DecodeAbort, a client Abort, Clear and a Deadline. The scheduler's calls are
// ordered as SGLang makes them; decode's and the deadline's are free.
func baseSet(tiA, tiB TransferInfo, send1, send2 Msg, initPages int, extra Msg) []fixed {
	msgs := []fixed{
		iOpen:        {msg: Open{}},
		iTIa:         {msg: tiA},
		iTIb:         {msg: tiB},
		iInit:        {msg: Init{NumPages: initPages, AuxIndex: 2}, after: []int{iOpen}},
		iSend1:       {msg: send1, after: []int{iInit}},
		iSend2:       {msg: send2, after: []int{iSend1}},
		iClear:       {msg: Clear{}, after: []int{iOpen}, terminal: true},
		iAbort:       {msg: Abort{}, after: []int{iOpen}},
		iDecodeAbort: {msg: DecodeAbort{From: epA}},
		iDeadline:    {msg: nil},
	}
	if extra != nil {
		msgs[iDecodeAbort] = fixed{msg: extra}
	}
	return msgs
}

func scenarios() []scenario {
	two := func(agent string, ep kv.Endpoint) TransferInfo { return ti(agent, ep, pages(10, 11, 12, 13), 2) }
	s1, s2 := Send{Pages: pages(1, 2)}, Send{Pages: pages(3, 4)}
	return []scenario{
		{
			name:   "two agents, two chunks, decode and client aborts",
			msgs:   baseSet(two("a", epA), two("b", epB), s1, s2, 4, nil),
			oracle: checker{realAgents: []string{"a", "b"}, chunks: 2},
		},
		{
			name:     "two agents, two chunks, writes may fail",
			msgs:     baseSet(two("a", epA), two("b", epB), s1, s2, 4, nil),
			oracle:   checker{realAgents: []string{"a", "b"}, chunks: 2},
			errDones: true,
		},
		{
			name:   "one real agent and one dummy",
			msgs:   baseSet(two("a", epA), dummy("b", epB, 2), s1, s2, 4, nil),
			oracle: checker{realAgents: []string{"a"}, chunks: 2},
		},
		{
			name:   "peer lost instead of a decode abort",
			msgs:   baseSet(two("a", epA), two("b", epB), s1, s2, 4, PeerLost{Agent: "b"}),
			oracle: checker{realAgents: []string{"a", "b"}, chunks: 2},
		},
		{
			name: "hybrid state on the last chunk",
			msgs: baseSet(
				TransferInfo{Agent: "a", From: epA, DstPages: pages(10, 11, 12, 13), Required: 2, DstState: [][]int32{{5}}},
				TransferInfo{Agent: "b", From: epB, DstPages: pages(20, 21, 22, 23), Required: 2, DstState: [][]int32{{6}}},
				s1, Send{Pages: pages(3, 4), State: [][]int32{{9}}}, 4, nil),
			oracle: checker{realAgents: []string{"a", "b"}, chunks: 2, wantState: true},
		},
		{
			// Decode's radix cache holds every page: Init(0) and one empty
			// last chunk (aux_nokv). A Poll stands in for the second Send.
			name: "decode prefix hit: an empty last chunk",
			msgs: baseSet(
				TransferInfo{Agent: "a", From: epA, DstAux: 1, Required: 2, PrefixLen: 32},
				TransferInfo{Agent: "b", From: epB, DstAux: 1, Required: 2, PrefixLen: 32},
				Send{}, Poll{}, 0, nil),
			oracle: checker{realAgents: []string{"a", "b"}, chunks: 1},
		},
	}
}

func TestExploreInterleavings(t *testing.T) {
	var total uint64
	for _, sc := range scenarios() {
		sc := sc
		e := &explorer{t: t, sc: &sc}
		n, states := e.run()
		total += n
		t.Logf("%-55s %12d orderings, %7d distinct states, outcomes %v", sc.name, n, states, e.terminals)
		if e.terminals["Success/"] == 0 {
			t.Errorf("scenario %q never reached Success: the explorer is not exercising the happy path", sc.name)
		}
	}
	fmt.Printf("interleaving explorer: %d orderings explored across %d scenarios\n", total, len(scenarios()))
}
