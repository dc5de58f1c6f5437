package peer

import (
	"slices"
	"testing"
)

// rig steps a machine through a checker, so every table test also checks the
// invariants.
type rig struct {
	t  *testing.T
	m  *Machine
	c  checker
	fx Effects
}

func newRig(t *testing.T, cfg Config) *rig {
	return &rig{t: t, m: New(&cfg), c: newChecker()}
}

func (r *rig) step(msg Msg) Effects {
	r.t.Helper()
	fx, err := r.c.step(r.m, msg)
	if err != nil {
		r.t.Fatalf("%T%+v: %v", msg, msg, err)
	}
	r.fx = fx
	return fx
}

func (r *rig) want(s State) {
	r.t.Helper()
	if r.m.State() != s {
		r.t.Fatalf("state %v, want %v", r.m.State(), s)
	}
}

// fire fires the armed timer of kind k.
func (r *rig) fire(k DeadlineKind) Effects {
	r.t.Helper()
	armed, gen := r.m.Armed(k)
	if !armed {
		r.t.Fatalf("%v not armed", k)
	}
	return r.step(Deadline{Kind: k, Gen: gen})
}

// ready registers from ep1 and completes the load.
func (r *rig) ready() {
	r.t.Helper()
	fx := r.step(Register{From: ep1, Reg: "r"})
	r.step(LoadDone{Inc: fx.Load.Inc})
	r.want(Ready)
}

func TestFirstRegistrationWinsWhileLoading(t *testing.T) {
	r := newRig(t, exploreCfg)
	fx := r.step(Register{From: ep1, Reg: "a"})
	if fx.Load == nil || fx.Load.Inc != 1 {
		t.Fatalf("no load: %+v", fx)
	}
	if fx := r.step(Register{From: ep2, Reg: "b"}); fx.Load != nil || !fx.Has(NoteDuplicate) {
		t.Fatalf("second registration while loading: %+v", fx)
	}
	r.step(Info{Room: 7})
	fx = r.step(LoadDone{Inc: 1})
	if !fx.Dial || fx.Persist != "a" || len(fx.Apply) != 1 || fx.Apply[0].Room != 7 || !fx.Has(NoteRegistered) {
		t.Fatalf("ready: %+v", fx)
	}
}

func TestComebackEndsTheIncarnationAndItsRooms(t *testing.T) {
	r := newRig(t, exploreCfg)
	r.ready()
	r.step(Info{Room: 1})
	fx := r.step(Register{From: ep1, Reg: "again"})
	if !fx.FailRooms || fx.Release != 1 || !fx.CloseLink || fx.Load == nil || fx.Load.Inc != 2 || !fx.Has(NoteReturned) {
		t.Fatalf("comeback: %+v", fx)
	}
	// The old incarnation's late results touch nothing.
	if fx := r.step(XferFailed{Inc: 1}); fx.FailRooms || !fx.Has(NoteStale) {
		t.Fatalf("late transfer failure: %+v", fx)
	}
	if fx := r.step(Write{ID: 9, Inc: 1}); !slices.Equal(fx.Fail, []uint64{9}) {
		t.Fatalf("write of the old incarnation: %+v", fx)
	}
	r.step(LoadDone{Inc: 2})
	r.want(Ready)
	// From another endpoint: a duplicate, not a comeback.
	if fx := r.step(Register{From: ep2}); !fx.Has(NoteDuplicate) || fx.FailRooms {
		t.Fatalf("registration from elsewhere: %+v", fx)
	}
}

// The register/restore race, as rules: a superseded load is released by its
// incarnation before the next load starts, and the restore and the
// registration can only follow one another.
func TestSupersededLoadIsReleasedBeforeTheNextStarts(t *testing.T) {
	r := newRig(t, exploreCfg)
	r.step(Register{From: ep1, Reg: "a"})
	r.step(Drop{Why: "activation failed"})
	fx := r.step(Register{From: ep1, Reg: "b"})
	if fx.Load != nil {
		t.Fatalf("a second load while the first is out: %+v", fx.Load)
	}
	fx = r.step(LoadDone{Inc: 1})
	if fx.Release != 1 || fx.Load == nil || fx.Load.Inc != 2 || fx.Load.Reg != "b" {
		t.Fatalf("superseded load back: %+v", fx)
	}
	r.step(LoadDone{Inc: 2})
	r.want(Ready)
}

func TestRegistrationDuringRestoreIsADuplicateAndRestoreAfterRegistrationIsStale(t *testing.T) {
	r := newRig(t, exploreCfg)
	r.ready()
	fenceIt(r)
	r.step(Probed{Result: ProbeUnreachable}) // no: still fenced; answer again
	r.fire(ProbeTick)
	r.step(Probed{Result: ProbeOK})
	fx := r.fire(FenceHoldUp)
	if fx.Load == nil || !fx.Load.Restored || fx.Load.Reg != "r" || !fx.Has(NoteReturned) {
		t.Fatalf("restore: %+v", fx)
	}
	if fx := r.step(Register{From: ep1, Reg: "fresh"}); !fx.Has(NoteDuplicate) || fx.Load != nil {
		t.Fatalf("registration during the restore's load: %+v", fx)
	}

	r = newRig(t, exploreCfg)
	r.ready()
	fenceIt(r)
	r.fire(ProbeTick)
	r.step(Probed{Result: ProbeOK})
	_, gen := r.m.Armed(FenceHoldUp)
	fx = r.step(Register{From: ep1, Reg: "fresh"})
	if fx.Load == nil || fx.Load.Restored {
		t.Fatalf("registration of a fenced agent: %+v", fx)
	}
	if fx := r.step(Deadline{Kind: FenceHoldUp, Gen: gen}); fx.Load != nil || !fx.Has(NoteStale) {
		t.Fatalf("fence hold after the registration: %+v", fx)
	}
}

// fenceIt takes a ready peer through an outage past the budget.
func fenceIt(r *rig) {
	r.t.Helper()
	r.fire(ProbeTick)
	r.step(Probed{Result: ProbeUnreachable})
	r.want(Suspect)
	r.fire(Outage)
	fx := r.fire(Outage)
	if !fx.FailRooms || !fx.Has(NoteFenced) || fx.Release == 0 || fx.CloseLink {
		r.t.Fatalf("fence: %+v", fx)
	}
	r.want(Fenced)
	r.fire(ProbeTick)
}

func TestHeldWritesPostInOrderOrFail(t *testing.T) {
	r := newRig(t, exploreCfg)
	r.ready()
	r.fire(ProbeTick)
	r.step(Probed{Result: ProbeUnreachable})
	r.step(Write{ID: 1, Inc: 1})
	r.step(Write{ID: 2, Inc: 1})
	r.fire(ProbeTick)
	if fx := r.step(Probed{Result: ProbeOK}); !slices.Equal(fx.Post, []uint64{1, 2}) {
		t.Fatalf("back before SafeAfter: %+v", fx)
	}
	r.fire(ProbeTick)
	r.step(Probed{Result: ProbeUnreachable})
	r.step(Write{ID: 3, Inc: 1})
	r.fire(Outage) // past SafeAfter
	r.fire(ProbeTick)
	fx := r.step(Probed{Result: ProbeOK})
	if !slices.Equal(fx.Fail, []uint64{3}) || len(fx.Post) != 0 || !fx.Has(NoteFenced) {
		t.Fatalf("back after SafeAfter: %+v", fx)
	}
	if fx := r.step(Info{Room: 5}); len(fx.FailInfos) != 1 || !fx.Has(NoteFencedInfo) {
		t.Fatalf("info of a fenced peer: %+v", fx)
	}
}

func TestConfirmWritesWaitForAProbeBegunAfterThem(t *testing.T) {
	r := newRig(t, exploreCfg)
	r.ready()
	if fx := r.step(Write{ID: 1, Inc: 1, Confirm: true}); !fx.Probe || len(fx.Post) != 0 {
		t.Fatalf("confirm write: %+v", fx)
	}
	r.step(Write{ID: 2, Inc: 1, Confirm: true}) // queued after the probe began
	fx := r.step(Probed{Result: ProbeOK})
	if !slices.Equal(fx.Post, []uint64{1}) || !fx.Probe {
		t.Fatalf("first answer: %+v", fx)
	}
	if fx := r.step(Probed{Result: ProbeOK}); !slices.Equal(fx.Post, []uint64{2}) || fx.Probe {
		t.Fatalf("second answer: %+v", fx)
	}
}

func TestRefusedProbeLosesAndReplayFailureForgets(t *testing.T) {
	r := newRig(t, exploreCfg)
	r.ready()
	r.step(Write{ID: 1, Inc: 1, Confirm: true})
	fx := r.step(Probed{Result: ProbeRefused})
	if !fx.FailRooms || !slices.Equal(fx.Fail, []uint64{1}) || !fx.CloseLink || !fx.Forget || !fx.Has(NoteLost) {
		t.Fatalf("refused: %+v", fx)
	}
	r.want(Gone)

	r = newRig(t, exploreCfg)
	fx = r.step(Register{From: ep1, Replay: true, Reg: "stored"})
	if !fx.Load.Replay {
		t.Fatalf("replay load: %+v", fx.Load)
	}
	fx = r.step(LoadDone{Inc: 1, Err: "gone"})
	if !fx.Forget || !fx.Has(NoteReplayFailed) || fx.Dial {
		t.Fatalf("replay failed: %+v", fx)
	}
	if fx := r.step(Register{From: ep1, Reg: "fresh"}); fx.Load == nil || fx.Load.Inc != 2 {
		t.Fatalf("a registration after the failed replay: %+v", fx)
	}
}

func TestLoadingQueueIsBoundedAndShutdownEndsEverything(t *testing.T) {
	r := newRig(t, Config{MaxQueued: 1, Interval: 1})
	r.step(Register{From: ep1, Reg: "a"})
	r.step(Info{Room: 1})
	if fx := r.step(Info{Room: 2}); len(fx.Refuse) != 1 || !fx.Has(NoteQueueRefused) {
		t.Fatalf("past the queue bound: %+v", fx)
	}
	fx := r.step(Shutdown{})
	if len(fx.Refuse) != 1 || fx.Refuse[0].Room != 1 {
		t.Fatalf("shutdown while loading: %+v", fx)
	}
	if fx := r.step(LoadDone{Inc: 1}); fx.Release != 1 || fx.Load != nil {
		t.Fatalf("load back after shutdown: %+v", fx)
	}
	if fx := r.step(Register{From: ep1}); fx.Load != nil {
		t.Fatalf("registration after shutdown: %+v", fx)
	}
	r.want(Closed)
	if err := r.c.quiescent(r.m); err != nil {
		t.Fatal(err)
	}
}

func TestNoLivenessLinkLossDropsAtOnce(t *testing.T) {
	r := newRig(t, Config{NoLiveness: true})
	r.ready()
	if armed, _ := r.m.Armed(ProbeTick); armed {
		t.Fatal("probe armed without liveness")
	}
	if fx := r.step(Write{ID: 1, Inc: 1, Confirm: true}); !slices.Equal(fx.Post, []uint64{1}) {
		t.Fatalf("write without liveness: %+v", fx)
	}
	if fx := r.step(LinkLost{}); !fx.FailRooms || !fx.Has(NoteLost) {
		t.Fatalf("link lost: %+v", fx)
	}
	r.want(Gone)
}

// With the watch outside the machine (the daemon's liveness probing on its
// own), Lost fences or drops, and Back restores or forgets.
func TestWatchOutsideLostAndBack(t *testing.T) {
	r := newRig(t, Config{NoLiveness: true})
	r.ready()
	r.step(Info{Room: 1})
	fx := r.step(Lost{Why: "outage", Fence: true})
	if !fx.FailRooms || fx.Release != 1 || !fx.Has(NoteFenced) || fx.CloseLink {
		t.Fatalf("lost with a fence: %+v", fx)
	}
	if fx := r.step(Info{Room: 2}); len(fx.FailInfos) != 1 {
		t.Fatalf("info while fenced: %+v", fx)
	}
	fx = r.step(Back{Alive: true})
	if fx.Load == nil || !fx.Load.Restored || fx.Load.Inc != 2 || fx.Load.Reg != "r" {
		t.Fatalf("back alive: %+v", fx)
	}
	r.step(LoadDone{Inc: 2})
	r.want(Ready)
	if fx := r.step(Back{Alive: true}); !fx.Has(NoteStale) || fx.Load != nil {
		t.Fatalf("back when not fenced: %+v", fx)
	}
	r.step(Lost{Why: "outage", Fence: true})
	if fx := r.step(Back{Alive: false}); !fx.CloseLink || fx.Load != nil {
		t.Fatalf("back refused: %+v", fx)
	}
	r.want(Gone)
}

// A staged write waits for its region in every live state: a Writable
// releases it through the gate (held while suspect, posted in order after
// the writes held before it), a Withdraw of its room ends it unwritten, and
// the end of the incarnation fails what still waits; nothing is written to
// a peer that is not live.
func TestStagedWritesWaitForTheirRegion(t *testing.T) {
	r := newRig(t, exploreCfg)
	if fx := r.step(Write{ID: 9, Inc: 1, Staged: true, Room: 1}); !slices.Equal(fx.Fail, []uint64{9}) {
		t.Fatalf("staged write to an absent peer: %+v", fx)
	}
	r.ready()
	for id := uint64(1); id <= 3; id++ {
		if fx := r.step(Write{ID: id, Inc: 1, Staged: true, Room: id % 2}); len(fx.Post)+len(fx.Fail) != 0 {
			t.Fatalf("staged write %d not waiting: %+v", id, fx)
		}
	}
	if r.m.Waiting() != 3 || r.m.WritesVia() {
		t.Fatalf("waiting %d, via %v", r.m.Waiting(), r.m.WritesVia())
	}
	if fx := r.step(Writable{IDs: []uint64{3, 2, 7}}); !slices.Equal(fx.Post, []uint64{3, 2}) {
		t.Fatalf("writable while ready: %+v", fx)
	}
	if fx := r.step(Writable{IDs: []uint64{3}}); len(fx.Post) != 0 {
		t.Fatalf("released twice: %+v", fx)
	}
	r.step(Write{ID: 4, Inc: 1, Staged: true, Room: 4})
	r.step(Write{ID: 5, Inc: 1, Staged: true, Room: 5})
	if fx := r.step(Withdraw{Room: 1}); !slices.Equal(fx.Withdrawn, []uint64{1}) {
		t.Fatalf("withdraw: %+v", fx)
	}
	r.fire(ProbeTick)
	r.step(Probed{Result: ProbeUnreachable})
	r.want(Suspect)
	r.step(Write{ID: 6, Inc: 1})
	if fx := r.step(Writable{IDs: []uint64{4}}); len(fx.Post) != 0 || r.m.Held() != 3 {
		t.Fatalf("writable while suspect: %+v (held %d)", fx, r.m.Held())
	}
	if fx := r.step(Staging{Payload: "rsp"}); len(fx.Post)+len(fx.Fail)+len(fx.Withdrawn) != 0 || fx.FailRooms {
		t.Fatalf("a staging frame changed the machine: %+v", fx)
	}
	r.fire(ProbeTick)
	if fx := r.step(Probed{Result: ProbeOK}); !slices.Equal(fx.Post, []uint64{6, 4}) {
		t.Fatalf("back: %+v", fx)
	}
	if fx := r.step(XferFailed{Inc: 1}); !slices.Equal(fx.Fail, []uint64{5}) || r.m.Held() != 0 {
		t.Fatalf("lost: %+v", fx)
	}
	if fx := r.step(Withdraw{Room: 5}); len(fx.Withdrawn) != 0 {
		t.Fatalf("withdraw after the end: %+v", fx)
	}
}
