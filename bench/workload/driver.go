package workload

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/bench"
	wl "github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/kv"
)

// Options tune the scheduler loop.
type Options struct {
	// Concurrency and Rate come from the Spec (closed or open loop).
	Concurrency int
	Rate        float64
	// Quiet is how long the loop waits, with every room admitted, nothing
	// changing and no write in flight, before it declares the workload
	// quiesced (default 400 ms of wall time).
	Quiet time.Duration
	// Idle is the pause after an iteration that changed nothing, so the loop
	// does not starve the engine on a small machine (default 50 µs).
	Idle time.Duration
	// Pace, if positive, is the shortest iteration: the loop sleeps out the
	// rest, as SGLang's scheduler spends a forward pass between two polls
	// of its queues. Zero: the loop spins (the stress case for polling).
	Pace time.Duration
	// Grace is how far the fake clock runs once the workload quiesced, in
	// GraceStep steps (defaults bench.Grace and bench.GraceStep: past every
	// deadline of the actor engine and of the fixed dict engine).
	Grace, GraceStep time.Duration
	// Progress, if set, is updated as rooms are admitted and end.
	Progress *Progress
	// Agents names the decode agents a room's transfer infos come from.
	Agents [2]string
	// Slots and AuxSlots bound the page and aux indices (the fabric's).
	Slots, AuxSlots int
	// InFlight reports the writes still in flight below the engine (default:
	// the rig's tap).
	InFlight func() int64
}

// Progress is read by a progress display while a run goes on.
type Progress struct {
	Admitted, Terminal atomic.Int64
}

func (o *Options) defaults() {
	if o.Quiet <= 0 {
		o.Quiet = 400 * time.Millisecond
	}
	if o.Idle <= 0 {
		o.Idle = 50 * time.Microsecond
	}
	if o.Grace <= 0 {
		o.Grace, o.GraceStep = bench.Grace, bench.GraceStep
	}
	if o.GraceStep <= 0 {
		o.GraceStep = o.Grace / 100
	}
	if o.Progress == nil {
		o.Progress = &Progress{}
	}
	if o.Agents[0] == "" {
		o.Agents = [2]string{"decode-0", "decode-1"}
	}
	if o.Slots <= 0 {
		o.Slots = 4096
	}
	if o.AuxSlots <= 0 {
		o.AuxSlots = 64
	}
}

// stage is where the scheduler is with a room.
type stage uint8

const (
	waitReady stage = iota // opened; init once it polls WaitingForInput
	sending                // initialised; one chunk per loop iteration
	waitDone               // every chunk sent; poll until terminal
	abandoned              // the client aborted: poll until terminal, send nothing
	done                   // cleared: drop from the live set
)

type live struct {
	id      uint64
	plan    int
	stage   stage
	sent    int
	start   time.Duration
	abortAt time.Duration // -1: not aborted
	abortIt int           // d.res.Iterations when the abort was issued
	startIt int           // d.res.Iterations when the room was admitted
	first   int32         // first prefill page
}

// ids hands out room ids, unique across the runs of a process (an engine
// never sees an id twice, as in SGLang where bootstrap_room is random).
var ids atomic.Uint64

// Run drives the engine of rig through plans with one scheduler loop, as
// SGLang's prefill scheduler does: admit rooms (closed or open loop), send
// decode's transfer infos, poll every live room in one batch per iteration,
// init and send the first chunk once a room polls WaitingForInput, one more
// chunk per iteration, clear each room once it polls terminal, and inject the
// planned aborts. Then it quiesces (see Options.Quiet and Grace) and counts
// the pinned rooms and what the engine still holds.
func Run(rig *Rig, plans []wl.Plan, o Options) Result {
	o.defaults()
	if o.InFlight == nil {
		o.InFlight = rig.Tap.inflight.Load
	}
	d := &driver{rig: rig, plans: plans, o: o, res: Result{Kind: rig.Kind, Rooms: len(plans)}}
	d.base = ids.Add(uint64(len(plans))+1) - uint64(len(plans))
	d.loop()
	d.quiesce()
	d.res.Posts, d.res.LatePosts = rig.Tap.posts.Load(), rig.Tap.late.Load()
	d.res.FailureNotices, d.res.Acks = rig.Notices.Failures.Load(), rig.Notices.Acks.Load()
	return d.res
}

type driver struct {
	rig   *Rig
	plans []wl.Plan
	o     Options
	res   Result
	base  uint64
	t0    time.Time
	live  []live
	// pending: rooms whose decode ABORT was delivered and whose sender the
	// scheduler creates on the next iteration.
	pending []live
	// stuck: slots of the closed loop held by rooms that stopped changing
	// (see Result.Stalls).
	stuck     int
	iterStart time.Duration
	ids       []uint64
	out       []kv.Reply
}

func (d *driver) now() time.Duration { return time.Since(d.t0) }

// pause waits d, handing the processor to any other goroutine until d has
// passed, as a scheduler that busy-polls its queues does between two polls
// (SGLang's does). A Go timer below a millisecond fires at about 1.1 ms here
// (the runtime's poller waits in whole milliseconds): time.Sleep(50 µs) made
// every idle iteration 1.1 ms, and every time-to-terminal a multiple of it.
func pause(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		runtime.Gosched()
	}
}

func (d *driver) loop() {
	next := 0
	eng := d.rig.Engine
	cpu0 := cpuTime()
	d.t0 = time.Now()
	lastChange := time.Duration(0)
	lastEnd, cpuEnd := time.Duration(0), cpu0
	for {
		changed := false
		now := d.now()
		if d.o.Pace > 0 && d.res.Iterations > 0 {
			if rest := d.o.Pace - (now - d.iterStart); rest > 0 {
				time.Sleep(rest)
				now = d.now()
			}
		}
		d.iterStart = now
		if len(d.pending) > 0 {
			d.openPending()
			changed = true
		}
		for next < len(d.plans) && d.admissible(next, now) {
			d.admit(next, now)
			next++
			changed = true
		}
		if len(d.live) == 0 && len(d.pending) == 0 {
			if next == len(d.plans) {
				break
			}
			time.Sleep(min(d.plans[next].Arrival-now, time.Millisecond))
			continue
		}
		if len(d.live) == 0 {
			continue
		}
		d.ids = d.ids[:0]
		for i := range d.live {
			d.ids = append(d.ids, d.live[i].id)
		}
		polled := d.now()
		d.out = eng.Poll(d.ids, d.out)
		d.res.Iterations++
		now = d.now()
		d.res.Polls = append(d.res.Polls, now-polled)
		kept, ended := d.live[:0], false
		for i := range d.live {
			r := &d.live[i]
			if d.step(r, d.out[i], now) {
				changed = true
			}
			if r.stage == done {
				ended = true
			} else {
				kept = append(kept, *r)
			}
		}
		d.live = kept
		if ended {
			lastEnd, cpuEnd = now, cpuTime()
		}
		if changed {
			lastChange = now
			continue
		}
		if now-lastChange > d.o.Quiet && d.o.InFlight() == 0 && (next == len(d.plans) || d.o.Rate <= 0) {
			if next == len(d.plans) {
				break
			}
			// Every live room is stuck and holds a slot of the closed
			// loop: the scheduler would stall for good. Let it admit past
			// them (they stay polled and are counted at the end).
			d.stuck += len(d.live)
			d.res.Stalls++
			lastChange = now
			continue
		}
		if d.o.Pace <= 0 { // a paced loop sleeps at the top of the next iteration
			pause(d.o.Idle)
		}
	}
	d.res.Wall, d.res.CPU = lastEnd, cpuEnd-cpu0
	if lastEnd > 0 {
		d.res.RoomsPerSec = float64(d.res.Succeeded+d.res.Failed) / lastEnd.Seconds()
	}
}

func (d *driver) admissible(i int, now time.Duration) bool {
	if d.o.Rate > 0 {
		return d.plans[i].Arrival <= now
	}
	return len(d.live)+len(d.pending) < d.o.Concurrency+d.stuck
}

// openPending creates the senders of the rooms decode aborted first. A dict
// engine handles decode frames on its bootstrap goroutine, so the scheduler
// waits for it to catch up (as when the request sat in prefill's queue while
// the frame arrived); the actor engine orders the frame before the Open in
// the room's mailbox anyway.
func (d *driver) openPending() {
	d.rig.SettleBootstrap()
	for _, r := range d.pending {
		d.rig.Engine.Open(r.id)
		d.live = append(d.live, r)
	}
	d.pending = d.pending[:0]
}

var decodeEP = [2]kv.Endpoint{{IP: "10.0.0.8", Port: 17000}, {IP: "10.0.0.9", Port: 17001}}

// admit: decode's frames and the scheduler's Open for a new room.
func (d *driver) admit(i int, now time.Duration) {
	p := d.plans[i]
	eng := d.rig.Engine
	r := live{id: d.base + uint64(i), plan: i, start: now, abortAt: -1, startIt: d.res.Iterations}
	r.first = int32((i * 16) % max(d.o.Slots-64, 1))
	d.o.Progress.Admitted.Add(1)
	ph := p.Abort.Phase()
	if p.Abort == wl.Abort(wl.BeforeSender, wl.Decode) {
		// Decode gave up before prefill created the sender: the ABORT is
		// delivered now, the sender created on the next iteration, once the
		// engine has handled the frame (see openPending).
		d.abort(&r, now)
		d.pending = append(d.pending, r)
		return
	}
	eng.Open(r.id)
	if ph == wl.BeforeSender { // the client aborts while the room bootstraps
		d.abort(&r, now)
		r.stage = abandoned
	}
	dst := int32((i*16 + 32) % max(d.o.Slots-64, 1))
	for a := 0; a < p.Agents; a++ {
		ti := room.TransferInfo{Agent: d.o.Agents[a], From: decodeEP[a], DstAux: i % d.o.AuxSlots, Required: p.Agents}
		ti.DstPages = make([]int32, p.Pages)
		for k := range ti.DstPages {
			ti.DstPages[k] = dst + int32(k)
		}
		eng.TransferInfo(r.id, ti)
	}
	if ph == wl.AfterInfo { // right after decode's infos
		d.abort(&r, now)
		if p.Abort.From() == wl.Client {
			r.stage = abandoned
		}
	}
	d.live = append(d.live, r)
}

// abort injects the plan's abort now.
func (d *driver) abort(r *live, now time.Duration) {
	r.abortAt, r.abortIt = now, d.res.Iterations
	d.rig.aborted.add(r.id, r.sent)
	if d.plans[r.plan].Abort.From() == wl.Decode {
		d.rig.Engine.DecodeAbort(r.id, decodeEP[0])
	} else {
		d.rig.Engine.Abort(r.id)
	}
}

// step acts on one room's poll answer; it reports whether it did anything
// and marks a cleared room done.
func (d *driver) step(r *live, rep kv.Reply, now time.Duration) bool {
	p := d.plans[r.plan]
	ph, client := p.Abort.Phase(), p.Abort.From() == wl.Client
	eng := d.rig.Engine
	switch {
	case rep.Status.Terminal():
		d.finish(r, rep, now)
		if ph == wl.AfterSuccess && r.abortAt < 0 {
			d.abort(r, now)
			r.abortAt = -2 // aborted, but after the terminal answer
		}
		eng.Clear(r.id)
		r.stage = done
		return true
	case r.stage == waitReady && rep.Status == kv.StatusWaitingForInput:
		if ph == wl.BeforeInit && r.abortAt < 0 {
			d.abort(r, now)
			if client {
				r.stage = abandoned
			}
			return true // a decode abort: init on a later iteration if still ready
		}
		eng.Init(r.id, p.Pages, r.plan%d.o.AuxSlots)
		if ph == wl.AfterInit && r.abortAt < 0 {
			d.abort(r, now)
			r.stage = sending // a decode abort: the first chunk on the next iteration
			if client {
				r.stage = abandoned
			}
			return true
		}
		d.sendChunk(r)
		if ph == wl.InChunk && r.abortAt < 0 {
			d.abort(r, now)
			if client {
				r.stage = abandoned
			}
		}
		return true
	case r.stage == sending:
		d.sendChunk(r)
		return true
	}
	return false
}

func (d *driver) sendChunk(r *live) {
	p := d.plans[r.plan]
	off := int32(0)
	for _, c := range p.Chunks[:r.sent] {
		off += int32(c)
	}
	pages := make([]int32, p.Chunks[r.sent])
	for k := range pages {
		pages[k] = r.first + off + int32(k)
	}
	d.rig.Engine.Send(r.id, pages, nil)
	r.sent++
	r.stage = sending
	if r.sent == len(p.Chunks) {
		r.stage = waitDone
	}
}

func (d *driver) finish(r *live, rep kv.Reply, now time.Duration) {
	if rep.Status == kv.StatusSuccess {
		d.res.Succeeded++
	} else {
		d.res.Failed++
		d.res.count(rep.Reason)
	}
	d.res.TTT = append(d.res.TTT, now-r.start)
	d.res.TTTIters = append(d.res.TTTIters, d.res.Iterations-r.startIt)
	if r.abortAt >= 0 {
		d.res.Aborted++
		d.res.A2T = append(d.res.A2T, now-r.abortAt)
		d.res.A2TIters = append(d.res.A2TIters, d.res.Iterations-r.abortIt)
		ph := d.res.phase(d.plans[r.plan])
		ph.A2T = append(ph.A2T, now-r.abortAt)
	}
	d.o.Progress.Terminal.Add(1)
}
