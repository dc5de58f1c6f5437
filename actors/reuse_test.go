package actors

import (
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvxfer/kvxfer/kv"
)

// doneRecorder keeps the completions the Observer is told of, per room.
type doneRecorder struct {
	*recorder
	mu   sync.Mutex
	done map[uint64][]uint32
}

func (r *doneRecorder) TransferDone(id uint64, seq uint32, _ kv.Reason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done[id] = append(r.done[id], seq)
}

func (r *doneRecorder) of(id uint64) []uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint32(nil), r.done[id]...)
}

// roomActorPIDs lists the engine's room actors, as its (one-bucket)
// process registry has them.
func roomActorPIDs(e *Engine) []*actor.PID {
	var pids []*actor.PID
	e.system.ProcessRegistry.LocalPIDs.LocalPIDs[0].IterCb(func(id string, _ any) {
		if pid := (&actor.PID{Id: id, Address: e.system.Address()}); isRoomActor(pid) {
			pids = append(pids, pid)
		}
	})
	return pids
}

// onlyRoomActor is the one room actor of a one-shard engine.
func onlyRoomActor(t *testing.T, e *Engine) *actor.PID {
	t.Helper()
	pids := roomActorPIDs(e)
	if len(pids) != 1 {
		t.Fatalf("room actors: %d, want 1", len(pids))
	}
	return pids[0]
}

// TestReusedRoomActorDropsTheEarlierRoomsMessages: a room actor that served
// a room which retired serves the next room of its shard. A completion of the
// earlier room that reaches it after that is the earlier room's late
// completion, not the new room's; a timer firing before the new room's
// deadline is dropped; the new room's own deadline still comes, on time.
func TestReusedRoomActorDropsTheEarlierRoomsMessages(t *testing.T) {
	rec := &doneRecorder{recorder: newRecorder(), done: map[uint64][]uint32{}}
	f := newFixture(t, &transfersDouble{}, func(c *Config) {
		c.Shards = 1
		c.Observer = Flat(rec)
	})
	boot := f.eng.cfg.Room.Bootstrap
	f.eng.Open(1)
	f.eng.Clear(1)
	if r := f.eng.PollSync([]uint64{1}, nil)[0]; r.Status != kv.StatusFailed {
		t.Fatalf("room 1 after Clear polls %+v", r)
	}
	f.clk.Advance(10 * time.Second)
	f.eng.Open(2)
	if r := f.eng.PollSync([]uint64{2}, nil)[0]; r.Status != kv.StatusBootstrapping {
		t.Fatalf("room 2 polls %+v", r)
	}
	pid := onlyRoomActor(t, f.eng) // room 1's, now room 2's
	ignored := rec.ignored.Load()

	// Room 1's completion, sent after its done function saw it live.
	f.eng.system.Root.Send(pid, &postDone{lr: &live{id: 1}, seq: 7})
	f.eng.system.Root.Send(pid, deadline{}) // a timer that could not be stopped
	if r := f.eng.PollSync([]uint64{2}, nil)[0]; r.Status != kv.StatusBootstrapping {
		t.Fatalf("room 2 polls %+v after room 1's completion and a stale timer", r)
	}
	if got := rec.of(1); len(got) != 1 || got[0] != 7 {
		t.Fatalf("room 1's late completions: %v, want [7]", got)
	}
	if got := rec.of(2); len(got) != 0 {
		t.Fatalf("room 2 took completions %v", got)
	}
	if n := rec.ignored.Load() - ignored; n != 1 {
		t.Fatalf("ignored messages: %d, want 1 (the late completion)", n)
	}

	// Room 1's bootstrap deadline passes: nothing happens to room 2.
	f.clk.Advance(boot - 10*time.Second)
	if r := f.eng.PollSync([]uint64{2}, nil)[0]; r.Status != kv.StatusBootstrapping {
		t.Fatalf("room 2 polls %+v at room 1's deadline", r)
	}
	f.clk.Advance(10 * time.Second)
	if r := f.waitStatus(2, kv.StatusFailed); r.Reason != kv.ReasonBootstrapTimeout {
		t.Fatalf("room 2 at its own deadline: %+v, want Failed/bootstrap_timeout", r)
	}
	if got := rec.terminal(1); len(got) != 1 {
		t.Fatalf("room 1's terminal statuses: %v, want one", got)
	}
}
