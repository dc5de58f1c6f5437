package xfertest

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// Post is one recorded Transfers.Post.
type Post struct {
	T kv.Transfer
	// Tick orders this post among every post and completion of the pool.
	Tick int
	// Done is the tick of its completion, 0 while it is held.
	Done int
	Fail kv.Reason
}

// Pool implements actors.Transfers. It is safe for concurrent use.
type Pool struct {
	mu      sync.Mutex
	hold    func(kv.Transfer) bool
	outcome func(kv.Transfer) kv.Reason
	posts   []*Post
	held    map[*Post]kv.DoneFunc
	tick    int
	changed chan struct{} // closed and replaced on every post and completion
}

// New returns a pool that completes every write successfully at once.
func New() *Pool {
	return &Pool{held: map[*Post]kv.DoneFunc{}, changed: make(chan struct{})}
}

// Hold makes later posts that match wait for Release (nil: hold none).
func (g *Pool) Hold(match func(kv.Transfer) bool) {
	g.mu.Lock()
	g.hold = match
	g.mu.Unlock()
}

// Outcome sets how writes that are not held complete (nil: success).
func (g *Pool) Outcome(fn func(kv.Transfer) kv.Reason) {
	g.mu.Lock()
	g.outcome = fn
	g.mu.Unlock()
}

// Room matches the transfers of one room.
func Room(id uint64) func(kv.Transfer) bool {
	return func(t kv.Transfer) bool { return t.Room == id }
}

// Post records t and completes it, or holds it.
func (g *Pool) Post(t kv.Transfer, done kv.DoneFunc) {
	g.mu.Lock()
	g.tick++
	p := &Post{T: t, Tick: g.tick}
	g.posts = append(g.posts, p)
	if g.hold != nil && g.hold(t) {
		g.held[p] = done
		g.signalLocked()
		g.mu.Unlock()
		return
	}
	fail := kv.ReasonNone
	if g.outcome != nil {
		fail = g.outcome(t)
	}
	g.tick++
	p.Done, p.Fail = g.tick, fail
	g.signalLocked()
	g.mu.Unlock()
	done(fail, nil)
}

func (g *Pool) signalLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// Release completes every held write of the room with fail and returns how
// many it completed. The done callbacks run in the caller's goroutine.
func (g *Pool) Release(id uint64, fail kv.Reason) int {
	g.mu.Lock()
	var dones []kv.DoneFunc
	for p, done := range g.held {
		if p.T.Room != id {
			continue
		}
		g.tick++
		p.Done, p.Fail = g.tick, fail
		dones = append(dones, done)
		delete(g.held, p)
	}
	g.signalLocked()
	g.mu.Unlock()
	for _, d := range dones {
		d(fail, nil)
	}
	return len(dones)
}

// ReleaseAll completes every held write successfully and stops holding, so no
// engine goroutine stays blocked when a test ends.
func (g *Pool) ReleaseAll() {
	g.Hold(nil)
	g.mu.Lock()
	var ids []uint64
	for p := range g.held {
		ids = append(ids, p.T.Room)
	}
	g.mu.Unlock()
	for _, id := range ids {
		g.Release(id, kv.ReasonNone)
	}
}

// Held returns the number of held writes of the room.
func (g *Pool) Held(id uint64) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for p := range g.held {
		if p.T.Room == id {
			n++
		}
	}
	return n
}

// Tick returns the current tick: posts and completions after it compare greater.
func (g *Pool) Tick() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tick
}

// Posts returns copies of the room's recorded posts, in post order.
func (g *Pool) Posts(id uint64) []Post {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []Post
	for _, p := range g.posts {
		if p.T.Room == id {
			out = append(out, *p)
		}
	}
	return out
}

// PostedAfter counts the room's writes posted after tick.
func (g *Pool) PostedAfter(id uint64, tick int) int {
	n := 0
	for _, p := range g.Posts(id) {
		if p.Tick > tick {
			n++
		}
	}
	return n
}

// LandedAfter counts the room's writes posted at or before tick that completed
// after it: writes that were in flight at tick and landed later.
func (g *Pool) LandedAfter(id uint64, tick int) int {
	n := 0
	for _, p := range g.Posts(id) {
		if p.Tick <= tick && p.Done > tick {
			n++
		}
	}
	return n
}

// WaitHeld waits until the room has at least n held writes. The bound only
// turns a hang into an error; the wait itself is on a channel.
func (g *Pool) WaitHeld(id uint64, n int) error {
	return g.wait(func() bool {
		c := 0
		for p := range g.held {
			if p.T.Room == id {
				c++
			}
		}
		return c >= n
	}, fmt.Sprintf("room %d: %d held writes", id, n))
}

// WaitPosts waits until the room has at least n recorded posts.
func (g *Pool) WaitPosts(id uint64, n int) error {
	return g.wait(func() bool {
		c := 0
		for _, p := range g.posts {
			if p.T.Room == id {
				c++
			}
		}
		return c >= n
	}, fmt.Sprintf("room %d: %d posts", id, n))
}

func (g *Pool) wait(cond func() bool, what string) error {
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for {
		g.mu.Lock()
		ok, ch := cond(), g.changed
		g.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-timeout.C:
			return fmt.Errorf("xfertest: timed out waiting for %s", what)
		}
	}
}

// Notices records what each room's decode would be told. It implements
// actors.Notifier and is safe for concurrent use.
type Notices struct {
	mu sync.Mutex
	by map[uint64][]room.Notice
}

// Notify records n.
func (l *Notices) Notify(id uint64, n room.Notice) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = map[uint64][]room.Notice{}
	}
	l.by[id] = append(l.by[id], n)
}

// Of returns the room's notices in order.
func (l *Notices) Of(id uint64) []room.Notice {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]room.Notice(nil), l.by[id]...)
}

// Count returns the number of the room's notices of kind k.
func (l *Notices) Count(id uint64, k room.NoticeKind) int {
	n := 0
	for _, x := range l.Of(id) {
		if x.Kind == k {
			n++
		}
	}
	return n
}
