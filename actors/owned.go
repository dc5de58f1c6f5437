package actors

import (
	"io"
	"log/slog"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Owned is a value with one owner and lock-free readers: an actor is the only
// writer, and it publishes each version whole (an immutable *S behind an
// atomic pointer), so a reader never waits and never sees a version change
// under it. An edit runs on the owner, one at a time, from the version
// published last; it must return a new value and never change the one it
// was given (readers may hold it). The owner also keeps the writer's private
// state (W): what no reader sees, such as the order to forget entries in.
type Owned[S, W any] struct {
	sys     *actor.ActorSystem
	pid     *actor.PID
	cur     atomic.Pointer[S]
	stopped chan struct{}
	closed  atomic.Bool
}

// ownedEdit is one edit for the owner; done closes once it is published.
type ownedEdit[S, W any] struct {
	f    func(cur *S, w *W) *S
	done chan struct{}
}

type ownedActor[S, W any] struct {
	o *Owned[S, W]
	w W
}

func (a *ownedActor[S, W]) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *ownedEdit[S, W]:
		a.edit(msg)
	}
}

// edit applies one edit. One that panics publishes nothing, and its caller
// returns all the same: the owner, and the versions after, go on.
func (a *ownedActor[S, W]) edit(e *ownedEdit[S, W]) {
	defer close(e.done)
	defer func() { _ = recover() }()
	if next := e.f(a.o.cur.Load(), &a.w); next != nil {
		a.o.cur.Store(next)
	}
}

// NewOwned starts the owner with the first version.
func NewOwned[S, W any](first *S) *Owned[S, W] {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	o := &Owned[S, W]{sys: sys, stopped: make(chan struct{})}
	o.cur.Store(first)
	o.pid = sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &ownedActor[S, W]{o: o} }))
	return o
}

// Load is the version published last (never nil; never to be changed).
func (o *Owned[S, W]) Load() *S { return o.cur.Load() }

// Edit runs f on the owner and returns once its version (nil: none, the
// current one stays) is published, so the caller reads its own edit. After
// Close it returns at once, applying nothing.
func (o *Owned[S, W]) Edit(f func(cur *S, w *W) *S) {
	e := &ownedEdit[S, W]{f: f, done: make(chan struct{})}
	select {
	case <-o.stopped:
		return
	default:
	}
	o.sys.Root.Send(o.pid, e)
	select {
	case <-e.done:
	case <-o.stopped:
	}
}

// Close stops the owner; the last version stays readable.
func (o *Owned[S, W]) Close() {
	if !o.closed.CompareAndSwap(false, true) {
		return
	}
	close(o.stopped)
	o.sys.Root.Stop(o.pid)
}
