package peer

import (
	"slices"
	"testing"
	"time"
)

// Table tests of the machine's own watch of its decode: probes answered,
// unanswered and refused, with the time of each result in its message.

var t0 = time.Unix(1000, 0)

func sec(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }

var liveCfg = Config{Interval: time.Second, SafeAfter: 5 * time.Second, Budget: 10 * time.Second, FenceHold: 7 * time.Second}

// readyAt registers from ep1 and completes the load at at.
func (r *rig) readyAt(at time.Time, confirm bool) {
	r.t.Helper()
	fx := r.step(Register{From: ep1, Reg: "r", Confirm: confirm})
	r.step(LoadDone{Inc: fx.Load.Inc, At: at})
	r.want(Ready)
}

// probe has the periodic tick start a probe (unless one is out) and answers it.
func (r *rig) probe(res ProbeResult, at time.Time) Effects {
	r.t.Helper()
	if !r.m.Probing() {
		if fx := r.fire(ProbeTick); !fx.Probe {
			r.t.Fatalf("the tick started no probe: %+v", fx)
		}
	}
	return r.step(Probed{Result: res, At: at})
}

// armed is the After of the last arm of kind k in fx (-1: none).
func armedFor(fx Effects, k DeadlineKind) time.Duration {
	d := time.Duration(-1)
	for _, a := range fx.Arms {
		if a.Kind == k {
			d = a.After
		}
	}
	return d
}

// The outage counts from the last answer, not from the first probe that
// went unanswered: the deadline is armed for what is left of SafeAfter, a
// result past the budget fences at once, and the fence ends only once the
// endpoint has answered for FenceHold without a miss.
func TestOutageCountsFromTheLastAnswer(t *testing.T) {
	r := newRig(t, liveCfg)
	r.readyAt(sec(0), false)
	for i := 1; i <= 3; i++ {
		r.probe(ProbeOK, sec(i))
	}
	fx := r.probe(ProbeUnreachable, sec(4))
	r.want(Suspect)
	if got := armedFor(fx, Outage); got != 4*time.Second {
		t.Fatalf("outage armed for %v, want 4s (SafeAfter less the 1 s since the last answer)", got)
	}
	for i := 5; i <= 12; i++ {
		r.probe(ProbeUnreachable, sec(i)) // 9 s since the last answer at 12 s
	}
	r.want(Suspect)
	if !r.m.Failing() || r.m.LastOK() != sec(3) {
		t.Fatalf("failing %v, last answer %v", r.m.Failing(), r.m.LastOK())
	}
	fx = r.probe(ProbeUnreachable, sec(13)) // 10 s: the budget, before the deadline's message
	r.want(Fenced)
	if !fx.FailRooms || !fx.Has(NoteFenced) || fx.CloseLink {
		t.Fatalf("fence: %+v", fx)
	}
	fx = r.probe(ProbeOK, sec(14))
	if got := armedFor(fx, FenceHoldUp); got != 7*time.Second {
		t.Fatalf("fence hold armed for %v", got)
	}
	r.probe(ProbeUnreachable, sec(15)) // a miss: the hold starts again at the next answer
	if armed, _ := r.m.Armed(FenceHoldUp); armed {
		t.Fatal("the fence hold survived a miss")
	}
	r.probe(ProbeOK, sec(16))
	armed, gen := r.m.Armed(FenceHoldUp)
	if !armed {
		t.Fatal("fence hold not armed")
	}
	fx = r.step(Deadline{Kind: FenceHoldUp, Gen: gen, Epoch: 42})
	if fx.Load == nil || !fx.Load.Restored || fx.Load.Inc != 42 || fx.Load.Reg != "r" || !fx.Has(NoteReturned) {
		t.Fatalf("restore: %+v", fx.Load)
	}
	r.step(LoadDone{Inc: 42, At: sec(24)})
	r.want(Ready)
}

// Without a probe result past them, the deadlines alone fence: at SafeAfter
// and at the budget, both since the last answer.
func TestOutageDeadlinesFromTheLastAnswer(t *testing.T) {
	r := newRig(t, liveCfg)
	r.readyAt(sec(0), false)
	r.probe(ProbeOK, sec(1))
	fx := r.probe(ProbeUnreachable, sec(3))
	if got := armedFor(fx, Outage); got != 3*time.Second {
		t.Fatalf("outage armed for %v, want 3s", got)
	}
	fx = r.fire(Outage) // 6 s: past SafeAfter
	if got := armedFor(fx, Outage); got != 5*time.Second || r.m.State() != Suspect {
		t.Fatalf("after SafeAfter: %v, armed %v", r.m.State(), got)
	}
	fx = r.fire(Outage) // 11 s: the budget
	r.want(Fenced)
	if !fx.FailRooms {
		t.Fatalf("fence: %+v", fx)
	}
}

// A probe refused (nothing listens) loses the peer at once, without a fence.
func TestProbeRefusedIsLostAtOnce(t *testing.T) {
	r := newRig(t, liveCfg)
	r.readyAt(sec(0), false)
	r.step(Write{ID: 1, Inc: 1})
	fx := r.probe(ProbeRefused, sec(1))
	r.want(Gone)
	if !fx.FailRooms || !fx.CloseLink || !fx.Forget || !fx.Has(NoteLost) || fx.Has(NoteFenced) || fx.Release != 1 {
		t.Fatalf("refused: %+v", fx)
	}
	if armed, _ := r.m.Armed(ProbeTick); armed {
		t.Fatal("a gone peer is still probed")
	}
}

// Writes to a suspect peer are held; a short outage posts them in the order
// they came.
func TestShortOutagePostsHeldWritesInOrder(t *testing.T) {
	r := newRig(t, liveCfg)
	r.readyAt(sec(0), false)
	if fx := r.step(Write{ID: 1, Inc: 1}); !slices.Equal(fx.Post, []uint64{1}) || r.m.WritesVia() {
		t.Fatalf("write to a ready peer: %+v (via %v)", fx, r.m.WritesVia())
	}
	r.probe(ProbeUnreachable, sec(1))
	if !r.m.WritesVia() {
		t.Fatal("a suspect peer's writes go straight")
	}
	for id := uint64(2); id <= 4; id++ {
		if fx := r.step(Write{ID: id, Inc: 1}); len(fx.Post)+len(fx.Fail) != 0 {
			t.Fatalf("write %d to a suspect peer: %+v", id, fx)
		}
	}
	fx := r.probe(ProbeOK, sec(4)) // 4 s since the last answer: under SafeAfter
	r.want(Ready)
	if !slices.Equal(fx.Post, []uint64{2, 3, 4}) || r.m.Held() != 0 || r.m.WritesVia() {
		t.Fatalf("after a short outage: %+v", fx)
	}
}

// An outage that lasted SafeAfter fences the peer when it answers again: its
// held writes fail, nothing is posted, and the answer starts its fence hold.
func TestOutagePastSafeAfterFencesOnTheAnswer(t *testing.T) {
	r := newRig(t, liveCfg)
	r.readyAt(sec(0), false)
	r.probe(ProbeUnreachable, sec(1))
	r.step(Write{ID: 1, Inc: 1})
	fx := r.probe(ProbeOK, sec(5)) // 5 s: its message before the deadline's
	r.want(Fenced)
	if len(fx.Post) != 0 || !slices.Equal(fx.Fail, []uint64{1}) || !fx.FailRooms || armedFor(fx, FenceHoldUp) != 7*time.Second {
		t.Fatalf("answer after SafeAfter: %+v", fx)
	}
	if fx := r.step(Write{ID: 2, Inc: 1}); !slices.Equal(fx.Fail, []uint64{2}) {
		t.Fatalf("write to a fenced peer: %+v", fx)
	}
}

// With confirmation, a write is posted only once a probe begun after it was
// answered: one that came while a probe was out waits for the next; one
// whose probe went unanswered is held until the decode answers again.
func TestConfirmedWritesWaitForAProbeBegunAfterThem(t *testing.T) {
	r := newRig(t, liveCfg)
	r.readyAt(sec(0), true)
	if !r.m.WritesVia() {
		t.Fatal("a confirming peer's writes go straight")
	}
	fx := r.step(Write{ID: 1, Inc: 1})
	if !fx.Probe || len(fx.Post) != 0 {
		t.Fatalf("first write: %+v", fx)
	}
	if fx := r.step(Write{ID: 2, Inc: 1}); fx.Probe || len(fx.Post) != 0 {
		t.Fatalf("second write, a probe out: %+v", fx)
	}
	fx = r.step(Probed{Result: ProbeOK, At: sec(0)})
	if !slices.Equal(fx.Post, []uint64{1}) || !fx.Probe {
		t.Fatalf("after the first probe: %+v", fx)
	}
	fx = r.step(Probed{Result: ProbeUnreachable, At: sec(1)})
	if len(fx.Post) != 0 || r.m.State() != Suspect || r.m.Held() != 1 {
		t.Fatalf("unanswered: %+v, %v, held %d", fx, r.m.State(), r.m.Held())
	}
	fx = r.probe(ProbeOK, sec(2))
	if !slices.Equal(fx.Post, []uint64{2}) {
		t.Fatalf("answered again: %+v", fx)
	}
}

// Another agent registering at a fenced peer's endpoint ends the fence
// (Back, not alive): the fenced peer goes, its link closes, nothing loads.
func TestRegistrationAtAFencedEndpointEndsTheFence(t *testing.T) {
	r := newRig(t, liveCfg)
	r.readyAt(sec(0), false)
	r.probe(ProbeUnreachable, sec(1))
	r.probe(ProbeUnreachable, sec(10))
	r.want(Fenced)
	fx := r.step(Back{})
	r.want(Gone)
	if !fx.CloseLink || fx.Load != nil {
		t.Fatalf("fence ended: %+v", fx)
	}
	for k := range numKinds {
		if armed, _ := r.m.Armed(k); armed {
			t.Fatalf("%v still armed", k)
		}
	}
}

// A probe that says when it began (Began: the writes stepped by then)
// confirms every write stepped before its connect, one that came after it
// was asked for included; a write stepped after it began waits for the next.
func TestAProbeConfirmsTheWritesSteppedBeforeItBegan(t *testing.T) {
	r := newRig(t, liveCfg)
	r.readyAt(sec(0), true)
	if fx := r.step(Write{ID: 1, Inc: 1}); !fx.Probe {
		t.Fatalf("first write: %+v", fx)
	}
	r.step(Write{ID: 2, Inc: 1}) // before the connect began
	r.step(Write{ID: 3, Inc: 1}) // after
	fx := r.step(Probed{Result: ProbeOK, At: sec(0), Began: 2})
	if !slices.Equal(fx.Post, []uint64{1, 2}) || !fx.Probe {
		t.Fatalf("answered: %+v", fx)
	}
	fx = r.step(Probed{Result: ProbeOK, At: sec(0), Began: 3})
	if !slices.Equal(fx.Post, []uint64{3}) || fx.Probe || r.m.Held() != 0 {
		t.Fatalf("the next round: %+v", fx)
	}
}
