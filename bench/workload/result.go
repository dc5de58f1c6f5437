package workload

import (
	"time"

	"github.com/kvxfer/kvxfer/bench"
	"github.com/kvxfer/kvxfer/bench/dict"
	wl "github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/kv"
)

// Result is what one run of a workload on one engine measured.
type Result struct {
	Kind      bench.Kind `json:"engine"`
	Rooms     int        `json:"rooms"`
	Succeeded int        `json:"succeeded"`
	Failed    int        `json:"failed"`
	// Reasons counts the failures the scheduler saw during the workload.
	Reasons map[string]int `json:"reasons,omitempty"`
	// Wall is the time from the first admission to the last terminal answer
	// of the workload (the quiet wait is not counted); CPU the process's user
	// and system time over the same span.
	Wall        time.Duration `json:"wall_ns"`
	CPU         time.Duration `json:"cpu_ns"`
	RoomsPerSec float64       `json:"rooms_per_sec"`
	Iterations  int           `json:"iterations"`
	// Stalls counts the times every live room had stopped changing while
	// rooms were still waiting for a slot of the closed loop: pinned rooms
	// had taken every slot. The loop then admits past them after the quiet
	// period, which the wall time includes.
	Stalls int `json:"stalls"`
	// TTT: open to the first terminal poll, per room that ended during the
	// workload. A2T: abort issued to the first terminal poll, per room aborted
	// while not yet terminal that ended during the workload; AbortsNever
	// counts the aborted rooms that never did (pinned, or ended only by a
	// deadline).
	TTT []time.Duration `json:"-"`
	A2T []time.Duration `json:"-"`
	// A2TIters and TTTIters are A2T and TTT counted in scheduler
	// iterations: the polls from the abort (or the admission) to the first
	// terminal answer (1: the next poll). Polls is each iteration's batched
	// poll, call to return (what the scheduler waits).
	A2TIters    []int           `json:"-"`
	TTTIters    []int           `json:"-"`
	Polls       []time.Duration `json:"-"`
	Aborted     int             `json:"aborted"`
	AbortsNever int             `json:"aborts_never_terminal"`
	// ByPhase splits A2T by where and from whom the abort came
	// ("in-chunk/decode", ...).
	ByPhase map[string]*PhaseA2T `json:"-"`
	// HardPinned: rooms the scheduler holds that are still not terminal after
	// the workload quiesced and the fake clock ran the grace period.
	// DeadlineEnded: rooms that were aborted yet ended only by a deadline
	// during that grace period. DeadlineOther: rooms without an abort that
	// ended only by a deadline.
	HardPinned    int            `json:"hard_pinned"`
	DeadlineEnded int            `json:"deadline_ended_after_abort"`
	DeadlineOther int            `json:"deadline_ended_other"`
	PinnedAt      map[string]int `json:"pinned_at,omitempty"`
	// LiveBeforeGrace and Leaked: what the engine holds once every room the
	// scheduler could clear was cleared, before and after a further grace
	// period (dict: map entries without tombstones; actors: live rooms).
	LiveBeforeGrace int        `json:"live_before_grace"`
	Leaked          int        `json:"leaked"`
	Leaks           dict.Leaks `json:"leaks"`
	// Posts: writes the engine posted; LatePosts: those posted for a room
	// after the workload had issued its abort.
	Posts          int64 `json:"posts"`
	LatePosts      int64 `json:"late_posts"`
	FailureNotices int64 `json:"failure_notices"`
	Acks           int64 `json:"abort_acks"`
}

// PhaseA2T is the abort-to-terminal samples of one abort phase and source.
type PhaseA2T struct {
	A2T   []time.Duration
	Never int
}

func (r *Result) phase(p wl.Plan) *PhaseA2T {
	if r.ByPhase == nil {
		r.ByPhase = map[string]*PhaseA2T{}
	}
	k := p.Abort.Phase().String() + "/" + p.Abort.From().String()
	if r.ByPhase[k] == nil {
		r.ByPhase[k] = &PhaseA2T{}
	}
	return r.ByPhase[k]
}

// Pinned counts every room an abort failed to end: hard pins plus aborted rooms that
// ended only by a deadline.
func (r *Result) Pinned() int { return r.HardPinned + r.DeadlineEnded }

// CPUPer1k is CPU seconds per 1,000 rooms.
func (r *Result) CPUPer1k() float64 {
	n := r.Succeeded + r.Failed
	if n == 0 {
		return 0
	}
	return r.CPU.Seconds() * 1000 / float64(n)
}

func (r *Result) count(why kv.Reason) {
	if r.Reasons == nil {
		r.Reasons = map[string]int{}
	}
	r.Reasons[why.String()]++
}

// quiesce lets the fake clock run the grace period over the rooms still
// live, polling them every step as the scheduler would, clears those that
// end, records the rest as pinned, then clears what it can, runs the clock
// again (sweeps, lingering rooms) and counts what the engine still holds.
func (d *driver) quiesce() {
	rig := d.rig
	rig.Settle()
	for t := time.Duration(0); t < d.o.Grace && len(d.live) > 0; t += d.o.GraceStep {
		rig.Clock.Advance(d.o.GraceStep)
		d.graceStep()
	}
	// The actor engine handles deadline messages asynchronously: give the
	// last ones a moment of wall time to land.
	for end := time.Now().Add(time.Second); len(d.live) > 0 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
		d.graceStep()
	}
	d.res.HardPinned = len(d.live)
	d.res.AbortsNever += d.res.HardPinned - countNotAborted(d.live)
	for _, r := range d.live {
		if r.abortAt >= 0 {
			d.res.phase(d.plans[r.plan]).Never++
		}
	}
	if len(d.live) > 0 {
		d.res.PinnedAt = map[string]int{}
		d.ids = d.ids[:0]
		for _, r := range d.live {
			d.ids = append(d.ids, r.id)
		}
		for _, rep := range rig.Engine.Poll(d.ids, nil) {
			d.res.PinnedAt[rep.Status.String()]++
		}
	}
	rig.Settle()
	d.res.LiveBeforeGrace = rig.Live()
	for t := time.Duration(0); t < d.o.Grace; t += d.o.GraceStep {
		rig.Clock.Advance(d.o.GraceStep)
	}
	rig.Settle()
	// A cleared actor room retires by a message to its shard; on a loaded
	// machine the last ones may still be on their way. Every room but the
	// pinned ones (which the scheduler could not clear) must go.
	for end := time.Now().Add(2 * time.Second); rig.act != nil && rig.Live() > d.res.HardPinned && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	d.res.Leaked, d.res.Leaks = rig.Live(), rig.Leaks()
}

func (d *driver) graceStep() {
	d.ids = d.ids[:0]
	for _, r := range d.live {
		d.ids = append(d.ids, r.id)
	}
	d.out = d.rig.Engine.Poll(d.ids, d.out)
	kept := d.live[:0]
	for i, r := range d.live {
		rep := d.out[i]
		if !rep.Status.Terminal() {
			kept = append(kept, r)
			continue
		}
		if r.abortAt >= 0 {
			d.res.DeadlineEnded++
			d.res.AbortsNever++
			d.res.phase(d.plans[r.plan]).Never++
		} else {
			d.res.DeadlineOther++
		}
		d.rig.Engine.Clear(r.id)
	}
	d.live = kept
}

func countNotAborted(ls []live) int {
	n := 0
	for _, r := range ls {
		if r.abortAt < 0 {
			n++
		}
	}
	return n
}
