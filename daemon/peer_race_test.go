package daemon

import (
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// The register/restore race: a fenced agent's decode registers again at the
// moment its endpoint has answered for the fence hold. The restore (once the
// liveness goroutine's, now the agent's own fence hold deadline) lands between the registration's look-up of the agent and the
// rest of it (the hook fixes that ordering, and the gated NIXL agent holds
// the restore's load until the registration reached the agent). At most one
// registration of the agent may be live, and the one that is must work: no
// load may take the agent out of NIXL or the pool under it. (On the tree
// before peers had one owner, the restore's load released the agent by
// name after the registration's load: the room failed invalid_request.)
func TestRegisterAndRestoreOfOneAgentLeaveOneWorkingRegistration(t *testing.T) {
	clk, probes := clock.NewFake(time.Unix(0, 0)), &fakeProbes{}
	d := startDaemonWith(t, func(c *Config) {
		c.NewAgent = newGatedAgent
		c.Liveness = LivenessConfig{Interval: time.Second, Budget: 4 * time.Second, FenceHold: 6 * time.Second,
			Clock: clk, Probe: probes.probe}
	})
	s := newScheduler(t, d)
	g := d.agent.(*gatedAgent)
	dec := newDecode(t, d)
	at := endpointOf(dec)
	agent := dec.reg.AgentName
	waitWatched(t, d, at)

	probes.set(at, ProbeUnreachable)
	advance(t, d, clk, 4)
	waitFor(t, "fenced and dropped", func() bool {
		return d.Counters()["peers_fenced"] == 1 && d.Counters()["peers_dropped"] == 1 &&
			peerState(t, d, agent).State == "fenced"
	})
	probes.set(at, ProbeOK)
	droppedBefore := g.dropped.Load()

	var once sync.Once
	rel, entered := g.hold(agent)
	release := func() { once.Do(rel) }
	// Released at the end whatever happened, before the daemon shuts down
	// (it waits for the loads).
	t.Cleanup(release)
	afterRegisterCheck = func(a string) {
		if a != agent {
			return
		}
		afterRegisterCheck = nil
		// The endpoint answers from 5 s on: the fence hold (6 s) ends at
		// 11 s, now, and the agent's actor starts the restore.
		advance(t, d, clk, 7)
		select { // the restore's load is held in LoadPeer
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Error("the restore's load never reached NIXL")
		}
	}
	t.Cleanup(func() { afterRegisterCheck = nil })
	m, err := wire.DecodeInbound(dec.reg.Encode()) // as the ingest hands it over
	if err != nil {
		t.Fatal(err)
	}
	d.peers.register(m.(*wire.Registration), nil, false)
	// The registration reaches the agent's actor while the restore loads:
	// one of them is the agent's registration, the other a duplicate.
	waitFor(t, "the registration stepped", func() bool { return d.Counters()["duplicate_registrations"] == 1 })
	release()
	waitFor(t, "the agent loaded", func() bool { return peerState(t, d, agent).State == "ready" })

	if n := d.Counters()["registrations"]; n != 2 {
		t.Errorf("%d registrations counted: want the first and one after the fence", n)
	}
	if n := g.dropped.Load() - droppedBefore; n != 0 {
		t.Errorf("the live registration was taken out of NIXL %d time(s)", n)
	}
	const id = 701
	dec.checker.Expect(id, 1, false)
	dec.send(t, dec.info(id, seqPages(0, 1), 0, 1))
	s.start(t, roomSpec{id: id, src: seqPages(0, 1), chunks: []int{1}, aux: 0})
	if rep := s.waitTerminal(t, id); rep.Status != kv.StatusSuccess {
		t.Fatalf("room of the registered decode: %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, id, seqPages(0, 1), 0)
}
