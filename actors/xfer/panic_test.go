package xfer_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
)

// panicAgent is a NIXL agent whose Post or Poll panics when a request
// targets one peer (a binding bug, say); everything else goes through.
type panicAgent struct {
	nixl.Agent
	bad    string
	onPoll bool // Poll panics (else Post)
	hits   atomic.Int64

	mu    sync.Mutex
	lists map[nixl.ListID]string
	reqs  map[nixl.XferID]string
}

func (a *panicAgent) Prep(peer string, kind nixl.MemKind, descs []nixl.Desc) (nixl.ListID, error) {
	id, err := a.Agent.Prep(peer, kind, descs)
	a.mu.Lock()
	a.lists[id] = peer
	a.mu.Unlock()
	return id, err
}

func (a *panicAgent) Make(op nixl.Op, local nixl.ListID, li []int32, remote nixl.ListID, ri []int32, notif []byte) (nixl.XferID, error) {
	x, err := a.Agent.Make(op, local, li, remote, ri, notif)
	a.mu.Lock()
	a.reqs[x] = a.lists[remote]
	a.mu.Unlock()
	return x, err
}

func (a *panicAgent) Create(op nixl.Op, lk nixl.MemKind, local []nixl.Desc, peer string, rk nixl.MemKind, remote []nixl.Desc, notif []byte) (nixl.XferID, error) {
	x, err := a.Agent.Create(op, lk, local, peer, rk, remote, notif)
	a.mu.Lock()
	a.reqs[x] = peer
	a.mu.Unlock()
	return x, err
}

func (a *panicAgent) targetsBad(xs ...nixl.XferID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, x := range xs {
		if a.reqs[x] == a.bad {
			return true
		}
	}
	return false
}

func (a *panicAgent) Post(x nixl.XferID) (nixl.State, error) {
	if !a.onPoll && a.targetsBad(x) {
		a.hits.Add(1)
		panic("agent bug in Post")
	}
	return a.Agent.Post(x)
}

func (a *panicAgent) Poll(xs []nixl.XferID, out []nixl.Status) error {
	if a.onPoll && a.targetsBad(xs...) {
		a.hits.Add(1)
		panic("agent bug in Poll")
	}
	return a.Agent.Poll(xs, out)
}

// A NIXL agent call that panics for one decode peer fails only the rooms
// that write to it (internal_error); the same pool actor keeps serving the
// rooms of the other peer, before and after, byte for byte.
func TestPanickingAgentFailsOnlyAffectedRooms(t *testing.T) {
	for _, onPoll := range []bool{false, true} {
		name := "post"
		if onPoll {
			name = "poll"
		}
		t.Run(name, func(t *testing.T) {
			var ag *panicAgent
			r := newRigOpts(t, rigOpts{actors: 1, wrap: func(a nixl.Agent) nixl.Agent {
				ag = &panicAgent{Agent: a, onPoll: onPoll, lists: map[nixl.ListID]string{}, reqs: map[nixl.XferID]string{}}
				return ag
			}})
			ag.bad = r.dec[1].Agent.Name()
			healthy := []*roomCase{
				{id: 601, chunks: []int{2, 2}, srcBase: 0, dstBase: 0, aux: 1, dummyB: true},
				{id: 603, chunks: []int{1, 1, 1}, srcBase: 20, dstBase: 20, aux: 3, dummyB: true},
			}
			hit := &roomCase{id: 602, chunks: []int{2, 1}, srcBase: 10, dstBase: 10, aux: 2}
			r.start(healthy[0])
			r.start(hit)
			r.start(healthy[1])
			if rep := r.wait(hit.id, kv.StatusFailed); rep.Reason != kv.ReasonInternalError {
				t.Fatalf("room on the panicking peer failed with %v, want internal_error", rep.Reason)
			}
			for _, c := range healthy {
				r.wait(c.id, kv.StatusSuccess)
				r.verify(c)
			}
			if ag.hits.Load() == 0 {
				t.Fatal("the agent never panicked")
			}
			after := &roomCase{id: 604, chunks: []int{3}, srcBase: 30, dstBase: 30, aux: 4, dummyB: true}
			r.start(after)
			r.wait(after.id, kv.StatusSuccess)
			r.verify(after)
			deadline := time.Now().Add(20 * time.Second)
			for r.pool.Stats().InFlight != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("pool still holds transfers: %+v", r.pool.Stats())
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
}
