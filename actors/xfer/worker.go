package xfer

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/internal/cores"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

type job struct {
	t       kv.Transfer
	done    kv.DoneFunc
	signal  [][]byte      // notifications held back from a HoldSignal transfer
	reqs    []nixl.XferID // posted and not yet terminal
	fail    kv.Reason
	started time.Time
	// withdrawn: ended before it started (its room failed); skipped when
	// its turn in the waiting list comes.
	withdrawn bool
}

type addPeer struct {
	peer *sglang.Peer
	list nixl.ListID
}

type removePeer struct{ agent string }

type withdraw struct{ room uint64 }

// signal is one room's held completion notifications (Pool.Signal).
type signal struct {
	room  uint64
	agent string
	msgs  [][]byte
}

// sendSignals asks a worker to send the signals it holds: the worker sends
// it to itself with the first one, so it comes after every signal queued
// behind that one.
type sendSignals struct{}

type peerEntry struct {
	peer *sglang.Peer
	list nixl.ListID
}

// maxGoneAgents bounds goneAgents: agent names come from outside.
const maxGoneAgents = 1024

// goneAgents are the agents last removed from a worker, oldest first. A job
// that reaches the worker after its peer was removed (the decode was lost
// while the room's write was queued) fails peer_lost, as the room's other
// writes to that decode do, not invalid_request, which is for an agent never
// known.
type goneAgents struct {
	set   map[string]struct{}
	order []string
}

func (g *goneAgents) add(agent string) {
	if _, ok := g.set[agent]; ok {
		return
	}
	if g.set == nil {
		g.set = map[string]struct{}{}
	}
	if len(g.order) >= maxGoneAgents {
		delete(g.set, g.order[0])
		g.order = g.order[1:]
	}
	g.set[agent] = struct{}{}
	g.order = append(g.order, agent)
}

func (g *goneAgents) forget(agent string) {
	if _, ok := g.set[agent]; !ok {
		return
	}
	delete(g.set, agent)
	for i, a := range g.order {
		if a == agent {
			g.order = append(g.order[:i], g.order[i+1:]...)
			break
		}
	}
}

func (g *goneAgents) has(agent string) bool {
	_, ok := g.set[agent]
	return ok
}

// tick asks a worker to poll its requests: the one it sent itself while
// spinning (at most one is queued: worker.pending).
type tick struct{}

// wakeup asks a parked worker to poll: the agent's wake-up (nixl.Waker), the
// quarantine timer or the pacing timer. A worker already spinning ignores it.
type wakeup struct{ src wakeSrc }

type wakeSrc uint8

const (
	wakeAgent      wakeSrc = iota // nixl.Waker: a request may have changed state
	wakeQuarantine                // a job's QuarantineAfter passed (Config.Clock)
	wakePace                      // an agent without a wake-up: the next poll is due
)

const (
	// spinTicks is how many polls without progress a worker makes through
	// its mailbox (yielding to new jobs between them) before it parks.
	spinTicks = 16
	// spinHorizon: while the agent (nixl.Dueer) reports a request due
	// sooner than this, the worker keeps spinning instead of parking.
	spinHorizon = time.Millisecond
	// pacePoll spaces the polls of a parked worker whose agent gives no
	// wake-up (not a nixl.Waker): never below 1 ms (Go timers below that
	// fire at about 1.1 ms anyway).
	pacePoll        = time.Millisecond
	quarantinePoll  = time.Second
	quarantineBatch = 256
)

// worker is one pool actor. It owns its peer table, its plan buffer and the
// requests of the jobs it posted; the agent is shared (NIXL STRICT mode).
type worker struct {
	p     *Pool
	self  *actor.PID
	peers map[string]peerEntry
	gone  goneAgents
	plan  sglang.Plan

	active  []*job
	waiting []*job // not yet started: the in-flight window is full
	// waitingOf is each room's jobs in waiting, in order (a withdrawn job
	// stays in waiting, ended, until its turn comes and is skipped).
	waitingOf  map[uint64][]*job
	inflight   int // requests of the active jobs
	quarantine []*job
	lastQuar   time.Time

	// signals wait for the next sendSignals; msgs is the scratch list of
	// one agent's notifications.
	signals []*signal
	msgs    [][]byte

	ids     []nixl.XferID
	st      []nixl.Status
	idle    int  // polls in a row without progress
	pending bool // a tick is queued (spinning)

	// Parking. parked is set while the worker waits for a wakeup; whoever
	// clears it (the agent's wake-up, or the worker itself on a new job)
	// owns the next poll. It is the only field another goroutine touches.
	parked   atomic.Bool
	wake     func() // registered with the agent (nixl.Waker)
	stopWake func()
	due      nixl.Dueer // the agent's due times, if it has them
	// selfPolling: the agent polls its requests itself and wakes the worker
	// (nixl.SelfPoller), so a poll that found nothing done parks at once.
	selfPolling bool
	// The two batches (nixl.InBatch), made once so that a batch allocates
	// nothing, and their arguments and result: postBatch posts batchJob's
	// plan to batchPeer, pollBatch polls batchIDs into batchSt and releases
	// the ended ones.
	postBatch, pollBatch func(nixl.Requests)
	batchJob             *job
	batchPeer            peerEntry
	batchIDs             []nixl.XferID
	batchSt              []nixl.Status
	batchErr             error
	// Timers: the quarantine deadline of the oldest active job and the
	// next pacing poll, each armed at most once (on Config.Clock and on
	// the wall clock).
	quarTimer, paceTimer clock.Timer
	quarAt, paceAt       time.Time
}

func newWorker(p *Pool) *worker {
	w := &worker{p: p, peers: map[string]peerEntry{}, waitingOf: map[uint64][]*job{}}
	w.postBatch = func(ag nixl.Requests) { w.post(w.batchJob, w.batchPeer, ag) }
	w.pollBatch = func(ag nixl.Requests) { w.batchErr = pollRelease(ag, w.batchIDs, w.batchSt) }
	return w
}

// pace is the clock that spaces the polls of a worker whose agent gives no
// wake-up. It decides nothing (quarantine and every other decision is on
// Config.Clock): a fake clock must not stop an agent's requests from being
// polled.
var pace clock.Clock = clock.Real{}

// coreFree reports whether spinning is free: a processor has nothing else to
// run (replaced in tests).
var coreFree = cores.Free

// Receive handles one message. A panic is recovered at three levels: starting
// a job (start) and polling its requests (pollJobs) fail only the job whose
// agent call panicked, reported done with internal_error; anything else is
// recovered here, logged, and polling goes on. A worker never dies, so the
// other rooms' jobs it holds are never lost.
func (w *worker) Receive(ctx actor.Context) {
	defer func() {
		if r := recover(); r != nil {
			w.p.cfg.Logger.Error("transfer worker panicked", "message", fmt.Sprintf("%T", ctx.Message()), "panic", fmt.Sprint(r))
			w.pending = false
			w.schedule(ctx)
		}
	}()
	switch m := ctx.Message().(type) {
	case *actor.Started:
		w.self = ctx.Self()
		w.due, _ = w.p.cfg.Agent.(nixl.Dueer)
		if wk, ok := w.p.cfg.Agent.(nixl.Waker); ok {
			w.selfPolling = nixl.PollsItself(w.p.cfg.Agent)
			self, root := w.self, w.p.system.Root
			w.wake = func() {
				if w.parked.CompareAndSwap(true, false) {
					root.Send(self, wakeup{src: wakeAgent})
				}
			}
			w.stopWake = wk.OnProgress(w.wake)
		}
	case *addPeer:
		w.peers[m.peer.Agent] = peerEntry{peer: m.peer, list: m.list}
		w.gone.forget(m.peer.Agent)
	case *removePeer:
		if _, ok := w.peers[m.agent]; ok {
			delete(w.peers, m.agent)
			w.gone.add(m.agent)
		}
	case *job:
		if w.inflight >= w.p.cfg.MaxInFlight || len(w.waiting) > 0 {
			w.waiting = append(w.waiting, m)
			w.waitingOf[m.t.Room] = append(w.waitingOf[m.t.Room], m)
			return
		}
		w.start(m)
		w.idle = 0
		w.schedule(ctx)
	case withdraw:
		if w.withdraw(m.room) {
			w.startWaiting()
			w.schedule(ctx)
		}
	case *signal:
		if len(w.signals) == 0 {
			ctx.Send(w.self, sendSignals{})
		}
		w.signals = append(w.signals, m)
	case sendSignals:
		w.sendSignals()
	case tick:
		w.pending = false
		w.pollNow(ctx)
	case wakeup:
		switch m.src {
		case wakeQuarantine:
			w.quarTimer, w.quarAt = nil, time.Time{}
		case wakePace:
			w.paceTimer, w.paceAt = nil, time.Time{}
		}
		if w.pending {
			return // spinning: a tick is queued already
		}
		w.parked.Store(false)
		w.pollNow(ctx)
	case *actor.Stopping:
		w.sendSignals()
		if w.stopWake != nil {
			w.stopWake()
		}
		if w.quarTimer != nil {
			w.quarTimer.Stop()
		}
		if w.paceTimer != nil {
			w.paceTimer.Stop()
		}
	}
}

// sendSignals sends the signals held, each agent's in one call, in the
// order they came. A failed call fails every room whose notifications it
// carried.
func (w *worker) sendSignals() {
	sigs := w.signals
	w.signals = nil // a panic below loses these signals, not the next ones
	for i, s := range sigs {
		if s == nil {
			continue // sent with an earlier one's agent
		}
		w.msgs = append(w.msgs[:0], s.msgs...)
		for _, o := range sigs[i+1:] {
			if o != nil && o.agent == s.agent {
				w.msgs = append(w.msgs, o.msgs...)
			}
		}
		err := nixl.SendNotifs(w.p.cfg.Agent, s.agent, w.msgs)
		clear(w.msgs)
		for k, o := range sigs[i:] {
			if o == nil || o.agent != s.agent {
				continue
			}
			if err != nil {
				w.p.cfg.SignalFailed(o.room, o.agent, err)
			}
			sigs[i+k] = nil
		}
	}
	w.signals = sigs[:0]
}

// pollNow polls, starts what waits for the window and schedules the next poll.
func (w *worker) pollNow(ctx actor.Context) {
	if w.poll() {
		w.idle = 0
	} else {
		w.idle++
	}
	w.startWaiting()
	w.schedule(ctx)
}

// start starts a job (startJob). If that panics (an agent call, the plan),
// the job alone is reported done with internal_error; its requests already
// posted are abandoned to the agent, never released (their state is unknown).
func (w *worker) start(j *job) {
	defer func() {
		if r := recover(); r != nil {
			w.p.cfg.Logger.Error("starting a transfer panicked; failing it", "room", j.t.Room, "agent", j.t.Agent,
				"abandoned", len(j.reqs), "panic", fmt.Sprint(r))
			w.failJob(j)
		}
	}()
	w.startJob(j)
}

// failJob reports a job done with internal_error and abandons its requests.
func (w *worker) failJob(j *job) {
	j.reqs = nil
	j.fail = kv.ReasonInternalError
	w.finish(j)
}

// startJob plans the transfer and posts its requests. A failure to plan or post
// still waits for the requests already posted before the job reports done.
func (w *worker) startJob(j *job) {
	j.started = w.p.cfg.Clock.Now()
	pe, ok := w.peers[j.t.Agent]
	if !ok {
		j.fail = kv.ReasonInvalidRequest
		if w.gone.has(j.t.Agent) {
			j.fail = kv.ReasonPeerLost
		} else {
			w.p.cfg.Logger.Warn("transfer for an unregistered decode agent", "room", j.t.Room, "agent", j.t.Agent)
		}
		w.finish(j)
		return
	}
	c := sglang.Chunk{
		Room: j.t.Room, ChunkID: j.t.Chunk, IsLast: j.t.Last, SrcPages: j.t.SrcPages, DstPages: j.t.DstPages,
		SrcAux: j.t.SrcAux, DstAux: j.t.DstAux, SrcState: j.t.SrcState, DstState: j.t.DstState, NoKVChunks: j.t.Chunk,
	}
	if s := j.t.Staged; s != nil {
		c.Staged = &sglang.StagedRegion{ChunkIdx: s.ChunkIdx, PageStart: j.t.PageStart, Offset: s.Offset}
	}
	if err := w.p.cfg.Local.Plan(&w.plan, pe.peer, &c); err != nil {
		w.p.cfg.Logger.Warn("transfer rejected", "room", j.t.Room, "agent", j.t.Agent, "err", err)
		j.fail = classify(err)
		w.finish(j)
		return
	}
	// The requests are made and posted in one batch (one hop for an agent
	// whose calls run on an owner thread); nothing in it calls out.
	w.batchJob, w.batchPeer = j, pe
	err := nixl.InBatch(w.p.cfg.Agent, w.postBatch)
	w.batchJob, w.batchPeer = nil, peerEntry{}
	if err != nil && j.fail == kv.ReasonNone {
		j.fail = classify(err)
	}
	if len(j.reqs) == 0 {
		w.finish(j)
		return
	}
	w.inflight += len(j.reqs)
	w.active = append(w.active, j)
}

// post makes and posts the requests of j's plan (w.plan) through ag,
// keeping those in flight in j.reqs. It stops at the first failure.
func (w *worker) post(j *job, pe peerEntry, ag nixl.Requests) {
	hold := j.t.HoldSignal && !pe.peer.NoNotifs
	if hold {
		j.signal = holdNotifs(w.plan.Reqs)
	}
	for i := range w.plan.Reqs {
		r := &w.plan.Reqs[i]
		notif := r.Notif
		if pe.peer.NoNotifs || hold {
			r.Notif = nil // nil: no notification (Make's contract)
		}
		x, err := sglang.MakeReq(ag, w.p.localL, pe.list, pe.peer.Agent, r)
		r.Notif = notif // keep the buffer for the next plan
		if err != nil {
			j.fail = classify(err)
			return
		}
		st, err := ag.Post(x)
		w.p.requests.Add(1)
		if err != nil {
			_ = ag.Release(x) // a request whose post failed is not in flight
			j.fail = classify(err)
			return
		}
		if st == nixl.Done {
			_ = ag.Release(x)
			continue
		}
		j.reqs = append(j.reqs, x)
	}
}

// holdNotifs copies the plan's notifications, to be sent when the room
// completes (two allocations, whatever the plan's size).
func holdNotifs(reqs []sglang.Req) [][]byte {
	n := 0
	for i := range reqs {
		n += len(reqs[i].Notif)
	}
	buf := make([]byte, 0, n)
	out := make([][]byte, len(reqs))
	for i := range reqs {
		buf = append(buf, reqs[i].Notif...)
		out[i] = buf[len(buf)-len(reqs[i].Notif) : len(buf) : len(buf)]
	}
	return out
}

// startWaiting starts queued transfers, in order, while the window has room.
func (w *worker) startWaiting() {
	n := 0
	for n < len(w.waiting) && w.inflight < w.p.cfg.MaxInFlight {
		j := w.waiting[n]
		n++
		if j.withdrawn {
			continue
		}
		if rest := w.waitingOf[j.t.Room][1:]; len(rest) > 0 {
			w.waitingOf[j.t.Room] = rest
		} else {
			delete(w.waitingOf, j.t.Room)
		}
		w.start(j)
	}
	if n > 0 {
		clear(w.waiting[:n])
		w.waiting = w.waiting[n:]
		w.idle = 0
	}
}

// withdraw ends the jobs of a failed room that wait for the window, unwritten
// (transfer_error): the room drains only what was started. Its jobs are all
// here or started: a room's jobs and its withdrawal come through this
// worker's mailbox in the order the room sent them. An ended job stays in
// waiting, skipped when its turn comes: after every handler that frees the
// window (a poll, a withdrawal) startWaiting runs, so waiting holds a job
// only while the window is full and an arriving job may queue behind it.
func (w *worker) withdraw(room uint64) bool {
	js := w.waitingOf[room]
	if len(js) == 0 {
		return false
	}
	delete(w.waitingOf, room)
	for _, j := range js {
		j.withdrawn, j.fail = true, kv.ReasonTransferError
		w.p.withdrawn.Add(1)
		w.finish(j)
	}
	return true
}

// poll checks every request of the active jobs in one batched call (and the
// quarantined ones once a second). It reports whether anything completed.
func (w *worker) poll() bool {
	progress := w.pollJobs(&w.active, true)
	if now := w.p.cfg.Clock.Now(); len(w.quarantine) > 0 && now.Sub(w.lastQuar) >= quarantinePoll {
		w.lastQuar = now
		w.pollJobs(&w.quarantine, false)
	}
	return progress
}

func (w *worker) pollJobs(list *[]*job, mayQuarantine bool) bool {
	jobs := *list
	if len(jobs) == 0 {
		return false
	}
	w.ids = w.ids[:0]
	for _, j := range jobs {
		w.ids = append(w.ids, j.reqs...)
	}
	if cap(w.st) < len(w.ids) {
		w.st = make([]nixl.Status, len(w.ids))
	}
	st := w.st[:len(w.ids)]
	var err error
	if p := recoverFrom(func() { err = w.pollRelease(st) }); p != nil {
		// Find the jobs whose requests make the agent panic: poll each job
		// alone; those fail (internal_error), the rest go on.
		w.p.cfg.Logger.Error("polling transfers panicked; polling each transfer alone", "panic", fmt.Sprint(p))
		jobs, err = w.isolate(jobs, mayQuarantine)
		*list = jobs
		if len(jobs) == 0 {
			return true
		}
		w.ids = w.ids[:0]
		for _, j := range jobs {
			w.ids = append(w.ids, j.reqs...)
		}
		st = w.st[:len(w.ids)]
		if err == nil {
			err = w.pollRelease(st)
		}
	}
	if err != nil {
		w.p.cfg.Logger.Error("polling transfers", "err", err)
		return false
	}
	progress := false
	now := w.p.cfg.Clock.Now()
	kept := jobs[:0]
	k := 0
	for _, j := range jobs {
		left := j.reqs[:0]
		for _, x := range j.reqs {
			s := st[k]
			k++
			switch s.State {
			case nixl.Done, nixl.Failed:
				progress = true
				if mayQuarantine {
					w.inflight--
				}
				if s.State == nixl.Failed && j.fail == kv.ReasonNone {
					j.fail = classify(s.Err)
				}
			default:
				left = append(left, x)
			}
		}
		j.reqs = left
		switch {
		case len(j.reqs) == 0:
			w.finish(j)
		case mayQuarantine && now.Sub(j.started) > w.p.cfg.QuarantineAfter:
			w.inflight -= len(j.reqs) // stuck requests leave the window
			w.p.quarantined.Add(1)
			w.p.cfg.Logger.Warn("transfer never completed; quarantined, not released", "room", j.t.Room, "agent", j.t.Agent, "requests", len(j.reqs))
			w.quarantine = append(w.quarantine, j)
		default:
			kept = append(kept, j)
		}
	}
	clear(jobs[len(kept):])
	*list = kept
	return progress
}

// pollRelease polls w.ids into st and releases the requests it finds
// terminal, in one batch (one hop for an agent whose calls run on an owner
// thread): the jobs' bookkeeping, which steps rooms, comes after, outside it.
func (w *worker) pollRelease(st []nixl.Status) error {
	w.batchIDs, w.batchSt, w.batchErr = w.ids, st, nil
	err := nixl.InBatch(w.p.cfg.Agent, w.pollBatch)
	if err == nil {
		err = w.batchErr
	}
	w.batchIDs, w.batchSt, w.batchErr = nil, nil, nil
	return err
}

// pollRelease polls ids into st through ag and releases those terminal.
func pollRelease(ag nixl.Requests, ids []nixl.XferID, st []nixl.Status) error {
	if err := ag.Poll(ids, st); err != nil {
		return err
	}
	for i, x := range ids {
		if s := st[i].State; s == nixl.Done || s == nixl.Failed {
			_ = ag.Release(x)
		}
	}
	return nil
}

// isolate polls each job's requests alone and fails the jobs whose poll
// panics (their requests leave the window, abandoned). It returns the others.
func (w *worker) isolate(jobs []*job, mayQuarantine bool) ([]*job, error) {
	kept := jobs[:0]
	var err error
	for _, j := range jobs {
		st := make([]nixl.Status, len(j.reqs))
		var e error
		if p := recoverFrom(func() { e = w.p.cfg.Agent.Poll(j.reqs, st) }); p != nil {
			w.p.cfg.Logger.Error("polling a transfer panicked; failing it", "room", j.t.Room, "agent", j.t.Agent, "panic", fmt.Sprint(p))
			if mayQuarantine {
				w.inflight -= len(j.reqs)
			}
			w.failJob(j)
			continue
		}
		if e != nil {
			err = e
		}
		kept = append(kept, j)
	}
	clear(jobs[len(kept):])
	return kept, err
}

// recoverFrom runs f and returns what it panicked with (nil if it returned).
func recoverFrom(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}

func (w *worker) finish(j *job) {
	if j.fail != kv.ReasonNone {
		w.p.failed.Add(1)
	}
	// Report first: once InFlight drops, the room has been sent its completion.
	if j.fail != kv.ReasonNone {
		j.signal = nil
	}
	j.done(j.fail, j.signal)
	w.p.inflight.Add(-1)
}

// schedule arranges the next poll. While completions are likely the worker
// spins: it polls through its own mailbox (new jobs get in between), unless
// the agent polls its requests itself (nixl.SelfPoller). After
// spinTicks polls without progress, unless the agent reports a request due
// within spinHorizon, it parks: nothing is queued, and the agent's wake-up
// (nixl.Waker) sends the next poll; an agent without one is polled every
// pacePoll. A parked worker with active jobs also arms the quarantine
// deadline of its oldest job on Config.Clock, and one with only quarantined
// jobs polls them every quarantinePoll on it. No sub-millisecond timer.
func (w *worker) schedule(ctx actor.Context) {
	if w.pending {
		return
	}
	if w.parked.Load() && !w.parked.CompareAndSwap(true, false) {
		return // the agent woke us: its wakeup is queued
	}
	if len(w.active)+len(w.quarantine)+len(w.waiting) == 0 {
		w.idle = 0
		return
	}
	// A poll that found nothing spins on only while a processor is free
	// (cores.Free): where every core has a runnable task the spin takes
	// one from work, and the worker parks until the agent's wake-up or the
	// due time instead.
	// An agent that polls its own requests wakes the worker when one ends:
	// its polling would only add calls.
	if len(w.active) > 0 && !w.selfPolling && (w.idle < spinTicks || w.dueSoon()) && (w.idle == 0 || coreFree()) {
		if w.idle > 0 {
			// A poll that found nothing: give the processor to whoever
			// waits for it (the scheduler's loop, a shard, another
			// worker) before the next. The mailbox itself yields only
			// every 300 messages, so without this a spinning worker held
			// a processor for hundreds of empty polls at a time, and with
			// four workers on two processors the rooms' own work queued
			// behind them (the c=100 time-to-terminal tail).
			runtime.Gosched()
		}
		w.pending = true
		ctx.Send(w.self, tick{})
		return
	}
	w.park(ctx)
}

// dueSoon reports whether the agent has a request due within spinHorizon
// (pacing against the agent's own monotonic due times; it decides nothing).
func (w *worker) dueSoon() bool {
	if w.due == nil {
		return false
	}
	at, ok := w.due.Due()
	return ok && time.Until(at) < spinHorizon
}

// armQuarantine arms one timer on Config.Clock for the next quarantine
// decision: the oldest active job's QuarantineAfter, or the next poll of the
// quarantined jobs (every quarantinePoll), whichever is first.
func (w *worker) armQuarantine() {
	var at time.Time
	has := false
	for _, j := range w.active {
		if t := j.started.Add(w.p.cfg.QuarantineAfter); !has || t.Before(at) {
			at, has = t, true
		}
	}
	if len(w.quarantine) > 0 {
		if t := w.lastQuar.Add(quarantinePoll); !has || t.Before(at) {
			at, has = t, true
		}
	}
	if !has || (w.quarTimer != nil && !at.Before(w.quarAt)) {
		return
	}
	if w.quarTimer != nil {
		w.quarTimer.Stop()
	}
	clk, self, root := w.p.cfg.Clock, w.self, w.p.system.Root
	w.quarAt = at
	// Just past at: the decision is "in flight longer than QuarantineAfter".
	w.quarTimer = clk.AfterFunc(max(at.Sub(clk.Now()), 0)+time.Nanosecond, func() { root.Send(self, wakeup{src: wakeQuarantine}) })
}

// park waits for a wakeup. With a wake-up from the agent, parked is set
// first and the requests polled once more: a completion between the last
// poll and parking either shows in that poll or wakes the worker. A request
// due later (nixl.Dueer: the agent does not wake anyone at a due time) gets a
// pacing timer for its due time, as does an agent without a wake-up every
// pacePoll; never below pacePoll.
func (w *worker) park(ctx actor.Context) {
	w.armQuarantine()
	if len(w.active) == 0 {
		return
	}
	d := time.Duration(-1)
	if w.wake == nil {
		d = pacePoll
	}
	if w.due != nil {
		if at, ok := w.due.Due(); ok {
			if dd := max(time.Until(at), pacePoll); d < 0 || dd < d {
				d = dd
			}
		}
	}
	if d >= 0 {
		w.armPace(d)
	}
	if w.wake == nil {
		return
	}
	w.parked.Store(true)
	if w.poll() && w.parked.CompareAndSwap(true, false) {
		w.idle = 0
		w.startWaiting()
		w.pending = true
		ctx.Send(w.self, tick{})
	}
}

// armPace arms the pacing timer d from now (wall clock), unless it is armed
// for an earlier time already.
func (w *worker) armPace(d time.Duration) {
	at := time.Now().Add(d)
	if w.paceTimer != nil && !at.Before(w.paceAt) {
		return
	}
	if w.paceTimer != nil {
		w.paceTimer.Stop()
	}
	self, root := w.self, w.p.system.Root
	w.paceAt = at
	w.paceTimer = pace.AfterFunc(d, func() { root.Send(self, wakeup{src: wakePace}) })
}
