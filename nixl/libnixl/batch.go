package libnixl

import (
	"sync/atomic"

	"github.com/kvxfer/kvxfer/nixl"
)

// runner is how a request method's body reaches the agent's state: a.do (a
// hop onto the owner goroutine), or batch.here (in place, inside a Batch).
type runner func(f func()) error

var (
	_ nixl.Batcher    = (*Agent)(nil)
	_ nixl.SelfPoller = (*Agent)(nil)
	_ nixl.Requests   = (*batch)(nil)
)

// Batch implements nixl.Batcher: f runs on the owner goroutine, in one hop,
// and its calls on r run there in place (the same checks and NIXL calls as
// the Agent's methods, without a hop each).
func (a *Agent) Batch(f func(r nixl.Requests)) error {
	b := &batch{a: a}
	var p any
	cerr := a.do(func() {
		b.live.Store(true)
		p = recoverFrom(func() { f(b) })
		b.live.Store(false)
	})
	if cerr != nil {
		return cerr
	}
	if p != nil {
		panic(p)
	}
	return nil
}

// PollsItself implements nixl.SelfPoller: the owner goroutine polls the
// requests in flight (back to back, or every Options.PollInterval past
// Options.Spin) and wakes the OnProgress functions when one ends.
func (a *Agent) PollsItself() bool { return true }

// batch is the nixl.Requests a Batch hands out, valid while it runs.
type batch struct {
	a    *Agent
	live atomic.Bool
}

func (b *batch) here(f func()) error {
	if !b.live.Load() {
		return nixl.Errorf(nixl.ErrInvalid, "libnixl %s: a batch's requests used after it ended", b.a.name)
	}
	f()
	return nil
}

func (b *batch) Make(op nixl.Op, local nixl.ListID, localIdx []int32, remote nixl.ListID, remoteIdx []int32, notif []byte) (nixl.XferID, error) {
	return b.a.make(b.here, op, local, localIdx, remote, remoteIdx, notif)
}

func (b *batch) Create(op nixl.Op, localKind nixl.MemKind, local []nixl.Desc, peer string, remoteKind nixl.MemKind, remote []nixl.Desc, notif []byte) (nixl.XferID, error) {
	return b.a.create(b.here, op, localKind, local, peer, remoteKind, remote, notif)
}

func (b *batch) Post(x nixl.XferID) (nixl.State, error) { return b.a.post(b.here, x) }

func (b *batch) Poll(xs []nixl.XferID, out []nixl.Status) error { return b.a.poll(b.here, xs, out) }

func (b *batch) Release(x nixl.XferID) error { return b.a.release(b.here, x) }

// recoverFrom runs f and returns what it panicked with (nil if it returned).
func recoverFrom(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}
