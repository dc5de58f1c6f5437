package room

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// The multi-sender explorer: one room pulled by one decode rank from several
// prefill ranks (MHA fan-in TP2→TP1, or the stages of a PP prefill for a PP=1
// decode), each rank its own Machine. Decode succeeds when every required
// sender told it so (SGLang's required_prefill_response_num distinct senders:
// the held notifications of each sender, or its success KV_STATUS) and fails
// on the first failure status. Every causally valid ordering of both ranks'
// messages and writes is explored; on top of each rank's own invariants
// (checker_test.go) it checks that decode's success is earned from every
// sender: decode succeeds only once every rank has published Success with
// all its writes done, and at quiescence decode succeeded exactly when every
// rank did.

type msEvent struct {
	rank  int
	msg   Msg // nil: fire that rank's armed deadline
	after []int
	// terminal: only once that rank's scheduler saw a terminal status (Clear).
	terminal bool
}

type msScenario struct {
	name     string
	ranks    int
	events   []msEvent
	errDones bool
	chunks   int
}

// decodeView is the decode rank's side: which senders completed, and whether
// a failure status arrived first.
type decodeView struct {
	completed uint32 // bit per prefill rank
	failed    bool
}

func (d decodeView) success(ranks int) bool {
	return !d.failed && d.completed == uint32(1)<<ranks-1
}

type msExplorer struct {
	t         *testing.T
	sc        *msScenario
	memo      map[string]uint64
	path      []string
	outcomes  map[string]int
	decodeWon uint64
}

type msState struct {
	m   []*Machine
	c   []checker
	dec decodeView
}

func (s *msState) clone() *msState {
	o := &msState{dec: s.dec}
	for i := range s.m {
		o.m = append(o.m, s.m[i].clone())
		o.c = append(o.c, s.c[i].clone())
	}
	return o
}

func (s *msState) key() string {
	var b strings.Builder
	for i := range s.m {
		b.WriteString(s.m[i].key())
		b.WriteByte('#')
		b.WriteString(s.c[i].key())
		b.WriteByte('#')
	}
	fmt.Fprintf(&b, "%d/%v", s.dec.completed, s.dec.failed)
	return b.String()
}

func (e *msExplorer) run() (uint64, int) {
	e.memo, e.outcomes = map[string]uint64{}, map[string]int{}
	s := &msState{}
	for range e.sc.ranks {
		s.m = append(s.m, New(&holdCfg, 1))
		s.c = append(s.c, checker{realAgents: []string{"d"}, chunks: e.sc.chunks})
	}
	n := e.visit(s, uint32(1)<<len(e.sc.events)-1)
	return n, len(e.memo)
}

func (e *msExplorer) visit(s *msState, remaining uint32) uint64 {
	key := s.key() + "|" + strconv.FormatUint(uint64(remaining), 2)
	if n, ok := e.memo[key]; ok {
		return n
	}
	var total uint64
	moves := 0
	for i, ev := range e.sc.events {
		if remaining&(1<<i) == 0 || !e.ready(ev, s, remaining) {
			continue
		}
		moves++
		msg := ev.msg
		if msg == nil {
			_, gen := s.m[ev.rank].Armed()
			msg = Deadline{Gen: gen}
		}
		total += e.try(s, ev.rank, remaining&^(1<<i), msg)
	}
	for r := range s.m {
		for _, p := range s.c[r].posts {
			if containsSeq(s.c[r].done, p.Seq) {
				continue
			}
			moves++
			total += e.try(s, r, remaining, XferDone{Seq: p.Seq, Signal: signalFor(p)})
			if e.sc.errDones {
				total += e.try(s, r, remaining, XferDone{Seq: p.Seq, Fail: kv.ReasonTransferError})
			}
		}
	}
	if moves == 0 {
		ss := s.clone()
		if remaining != 0 {
			// Only Clears of non-terminal ranks are left: time passes.
			for r := range ss.m {
				if st, _ := ss.m[r].Status(); !st.Terminal() {
					_, gen := ss.m[r].Armed()
					total += e.try(ss, r, remaining, Deadline{Gen: gen})
				}
			}
		} else {
			e.quiesce(ss)
			total = 1
		}
	}
	e.memo[key] = total
	return total
}

func (e *msExplorer) ready(ev msEvent, s *msState, remaining uint32) bool {
	for _, p := range ev.after {
		if remaining&(1<<p) != 0 {
			return false
		}
	}
	if ev.terminal {
		st, _ := s.m[ev.rank].Status()
		return st.Terminal()
	}
	return true
}

func (e *msExplorer) try(s *msState, rank int, remaining uint32, msg Msg) uint64 {
	ss := s.clone()
	e.path = append(e.path, fmt.Sprintf("r%d:%s", rank, msgName(msg)))
	defer func() { e.path = e.path[:len(e.path)-1] }()
	if err := e.step(ss, rank, msg); err != nil {
		e.fail(err)
	}
	return e.visit(ss, remaining)
}

// step applies msg to one rank, checks that rank's invariants, and delivers
// its notices to decode.
func (e *msExplorer) step(s *msState, rank int, msg Msg) error {
	if err := s.c[rank].step(s.m[rank], msg); err != nil {
		return fmt.Errorf("rank %d: %w", rank, err)
	}
	was := s.dec.success(e.sc.ranks)
	for _, n := range s.c[rank].lastFx.Notices {
		switch n.Kind {
		case Completion:
			s.dec.completed |= 1 << rank
		case FailureStatus:
			if !was {
				s.dec.failed = true
			}
		}
	}
	if s.dec.success(e.sc.ranks) && !was {
		// Decode just counted its last required sender: every sender must
		// have earned Success, with nothing of its own still in flight.
		for r := range s.m {
			st, _ := s.m[r].Status()
			if st != kv.StatusSuccess || s.c[r].outstanding() != 0 {
				return fmt.Errorf("decode succeeded while rank %d is %v with %d writes outstanding", r, st, s.c[r].outstanding())
			}
		}
	}
	return nil
}

func (e *msExplorer) quiesce(s *msState) {
	all := true
	var outs []string
	for r := range s.m {
		for i := 0; i < 6 && !s.m[r].Retired(); i++ {
			_, gen := s.m[r].Armed()
			if err := e.step(s, r, Deadline{Gen: gen}); err != nil {
				e.fail(fmt.Errorf("at quiescence: %w", err))
			}
		}
		if err := s.c[r].quiesce(s.m[r]); err != nil {
			e.fail(fmt.Errorf("rank %d: %w", r, err))
		}
		st, why := s.m[r].Status()
		all = all && st == kv.StatusSuccess
		outs = append(outs, st.String()+"/"+why.String())
	}
	if got := s.dec.success(e.sc.ranks); got != all {
		e.fail(fmt.Errorf("at quiescence decode success=%v but ranks ended %v", got, outs))
	}
	if all {
		e.decodeWon++
	}
	e.outcomes[strings.Join(outs, " ")]++
}

func (e *msExplorer) fail(err error) {
	e.t.Helper()
	e.t.Fatalf("scenario %q: %v\n  ordering: %s", e.sc.name, err, strings.Join(e.path, " → "))
}

// msRank is one prefill rank's messages, SGLang-ordered: Open → Init → the
// sends; the transfer info and decode's ABORT are free; Clear after a
// terminal status. base is the index of its first event.
func msRank(rank, base int, chunks int, abort Msg) []msEvent {
	open, init := base, base+2
	evs := []msEvent{
		{rank: rank, msg: Open{}},
		{rank: rank, msg: TransferInfo{Agent: "d", From: epA, DstPages: pages(10, 11, 12, 13)[:2*chunks], DstAux: 3, Required: 1}},
		{rank: rank, msg: Init{NumPages: 2 * chunks, AuxIndex: 2}, after: []int{open}},
	}
	prev := init
	for c := range chunks {
		evs = append(evs, msEvent{rank: rank, msg: Send{Pages: pages(int32(1+2*c), int32(2+2*c))}, after: []int{prev}})
		prev = base + len(evs) - 1
	}
	evs = append(evs, msEvent{rank: rank, msg: Clear{}, after: []int{open}, terminal: true})
	if abort != nil {
		evs = append(evs, msEvent{rank: rank, msg: abort, after: []int{open}})
	}
	return evs
}

func msScenarios() []msScenario {
	build := func(name string, chunks int, errDones bool, aborts ...Msg) msScenario {
		sc := msScenario{name: name, ranks: len(aborts), errDones: errDones, chunks: chunks}
		for r, a := range aborts {
			sc.events = append(sc.events, msRank(r, len(sc.events), chunks, a)...)
		}
		return sc
	}
	return []msScenario{
		build("two senders (fan-in), one chunk each", 1, false, nil, nil),
		build("two senders, decode ABORT to both", 1, false, DecodeAbort{From: epA}, DecodeAbort{From: epA}),
		build("two senders, client abort on one", 1, false, nil, Abort{}),
		build("two senders, writes may fail", 1, true, nil, nil),
		build("two senders, two chunks each, decode ABORT to one", 2, false, nil, DecodeAbort{From: epA}),
	}
}

func TestExploreMultiSender(t *testing.T) {
	var total uint64
	for _, sc := range msScenarios() {
		sc := sc
		e := &msExplorer{t: t, sc: &sc}
		n, states := e.run()
		total += n
		t.Logf("%-50s %12d orderings, %7d states, decode success in %d end states; rank outcomes %v", sc.name, n, states, e.decodeWon, e.outcomes)
		if e.decodeWon == 0 {
			t.Errorf("scenario %q: decode never succeeded: the explorer is not exercising the happy path", sc.name)
		}
	}
	t.Logf("multi-sender explorer: %d orderings across %d scenarios", total, len(msScenarios()))
}
