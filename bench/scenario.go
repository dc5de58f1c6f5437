package bench

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/bench/dict"
	"github.com/kvxfer/kvxfer/kv"
)

// Scenario is one deterministic reproduction of a race, runnable against any
// engine kind: Run drives the engine through the interleaving (forcing it with
// hooks and held writes where the engine has the window) and reports what it
// saw; Check says whether that is what this kind of engine does.
type Scenario struct {
	Name  string
	Spec  string // the spec §6.3 item it reproduces
	Doc   string
	Kinds []Kind // the engines it runs against
	Run   func(t *Target) (Outcome, error)
	Check func(o Outcome) error
}

// Outcome is what a scenario observed on one engine.
type Outcome struct {
	Kind  Kind
	Room  uint64
	Views []View // the room as the scheduler polled it at named moments
	// Final is the room's answer after the workload quiesced and the grace
	// period passed; for a room the scheduler already cleared, what a poll of
	// that id answers once the workload quiesced (the view a request reusing
	// the id would start from).
	Final kv.Reply
	// Pinned: the scheduler still holds the room and it is not terminal.
	Pinned bool
	// Leaked: entries (dict engines) or live rooms (actor engine) left once
	// the scheduler cleared every room it could; Leaks splits the former.
	Leaked int
	Leaks  dict.Leaks
	// LiveBeforeGrace: the same count when the workload quiesced, before the
	// clock ran (what a bounded, swept leak looks like before its sweep).
	LiveBeforeGrace int
	// LateWrites: writes in flight when the abort was processed that landed
	// after it (decode may have freed their pages by then).
	LateWrites int
	// PostsAfterAbort: writes posted after the abort was processed.
	PostsAfterAbort int
	// NoticesInWindow: notices decode got while a write was still in flight.
	NoticesInWindow int
	Notices         []room.Notice
}

// View is one named poll.
type View struct {
	At    string
	Reply kv.Reply
}

func (o *Outcome) view(t *Target, at string) kv.Reply {
	r := t.Poll(o.Room)
	o.Views = append(o.Views, View{At: at, Reply: r})
	return r
}

// At returns the named view.
func (o *Outcome) At(name string) (kv.Reply, bool) {
	for _, v := range o.Views {
		if v.At == name {
			return v.Reply, true
		}
	}
	return kv.Reply{}, false
}

func (o Outcome) String() string {
	return fmt.Sprintf("%s room %d: final %v/%v pinned=%v leaked=%d (before grace %d) %+v late=%d postsAfterAbort=%d noticesInWindow=%d notices=%d views=%v",
		o.Kind, o.Room, o.Final.Status, o.Final.Reason, o.Pinned, o.Leaked, o.LiveBeforeGrace, o.Leaks, o.LateWrites,
		o.PostsAfterAbort, o.NoticesInWindow, len(o.Notices), o.Views)
}

// Grace is how far scenarios advance the clock once the workload quiesced:
// past every deadline of the actor engine (bootstrap 300 s, drain 10 s,
// linger 300 s) and the fixed engine's bootstrap timeout and sweeps.
const (
	Grace     = 1000 * time.Second
	GraceStep = 10 * time.Second
)

// finish lets the clock run through the grace period, records whether the
// rooms the scheduler still holds are pinned, clears the terminal ones as the
// scheduler does, lets the clock run again (sweeps, lingering rooms) and
// counts what is left.
func finish(t *Target, o *Outcome, held ...uint64) {
	if len(held) == 0 {
		o.Final = t.Poll(o.Room) // before tombstones expire
	}
	o.LiveBeforeGrace = t.Live()
	final, pinned := t.Quiesce(held, Grace, GraceStep)
	for i, id := range held {
		if id == o.Room {
			o.Final = final[i]
		}
	}
	o.Pinned = len(pinned) > 0
	for i, id := range held {
		if final[i].Status.Terminal() {
			t.Engine.Clear(id)
		}
	}
	t.SettleBootstrap(held...)
	t.Quiesce(nil, Grace, GraceStep)
	o.Leaked, o.Leaks = t.Live(), t.Leaks()
	o.Notices = t.Notices.Of(o.Room)
}

func reach(pp *dict.Pausepoint) error {
	select {
	case <-pp.Reached:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("bench: the engine never reached the pause point")
	}
}

func notices(o Outcome, k room.NoticeKind) int {
	n := 0
	for _, x := range o.Notices {
		if x.Kind == k {
			n++
		}
	}
	return n
}

// RunOn runs s against a fresh engine of kind k and closes it.
func (s Scenario) RunOn(k Kind) (Outcome, error) {
	t, err := NewTarget(k)
	if err != nil {
		return Outcome{}, err
	}
	o, err := s.Run(t)
	o.Kind = k
	if cerr := t.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return o, err
}

var decodeEP = kv.Endpoint{IP: "10.0.0.9", Port: 17001}

// readyRoom opens raceRoom, hands it one decode transfer info for pages
// pages, waits until the engine took it, and inits the room: the prelude of
// every chunk-window scenario.
func readyRoom(t *Target, pages int) {
	t.Engine.Open(raceRoom)
	t.Engine.TransferInfo(raceRoom, info(pages, 1))
	t.SettleBootstrap(raceRoom)
	t.Engine.Init(raceRoom, pages, 0)
}

func info(n, required int) room.TransferInfo {
	ps := make([]int32, n)
	for i := range ps {
		ps[i] = int32(1000 + i)
	}
	return room.TransferInfo{Agent: "decode-0", From: decodeEP, DstPages: ps, DstAux: 5, Required: required}
}

func chunkOf(id uint64, c int) func(kv.Transfer) bool {
	return func(t kv.Transfer) bool { return t.Room == id && t.Chunk == c }
}

// expect collects the failed expectations of a Check.
type expect struct{ errs []error }

func (x *expect) that(ok bool, format string, args ...any) {
	if !ok {
		x.errs = append(x.errs, fmt.Errorf(format, args...))
	}
}

func (x *expect) err() error { return errors.Join(x.errs...) }
