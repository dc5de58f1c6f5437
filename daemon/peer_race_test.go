package daemon

import (
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// The register/restore race: a fenced agent's decode registers again at the
// moment its endpoint has answered for the fence hold. The restore (liveness
// goroutine) lands between the registration's look-up of the agent and the
// rest of it (the hook fixes that ordering, and the gated NIXL agent holds
// the restore's load until the registration's is done). At most one
// registration of the agent may be live, and the one that is must work: the
// restore's load must not take the agent out of NIXL or the pool under it.
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
	advance(clk, 4)
	waitFor(t, "fenced and dropped", func() bool {
		return d.Counters()["peers_fenced"] == 1 && d.Counters()["peers_dropped"] == 1
	})
	probes.set(at, ProbeOK)
	droppedBefore := g.dropped.Load()

	var (
		release func()
		once    sync.Once
	)
	// Released at the end whatever happened, before the daemon shuts down
	// (it waits for the loads).
	t.Cleanup(func() { once.Do(func() { release() }) })
	restored := make(chan struct{})
	afterRegisterCheck = func(a string) {
		if a != agent {
			return
		}
		afterRegisterCheck = nil
		defer close(restored)
		rel, entered := g.hold(agent)
		before := d.peers.entryOf(agent)
		d.peers.restore(agent) // the endpoint answered for FenceHold, now
		if d.peers.entryOf(agent) == before {
			rel() // the restore found the registration under way: nothing to load
			release = func() {}
			return
		}
		release = rel
		select { // its load is held in LoadPeer until the registration's is done
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Error("the restore's load never reached NIXL")
		}
	}
	t.Cleanup(func() { afterRegisterCheck = nil })
	bad := d.Counters()["bad_registrations"]
	m, err := wire.DecodeInbound(dec.reg.Encode()) // as the ingest hands it over
	if err != nil {
		t.Fatal(err)
	}
	d.peers.register(m.(*wire.Registration), nil, false)
	<-restored
	waitFor(t, "the registration loaded or refused", func() bool {
		return d.peers.readyEntry(agent) || d.Counters()["bad_registrations"] > bad
	})
	if n := d.Counters()["bad_registrations"] - bad; n != 0 {
		t.Errorf("the registration was refused: %q", d.dialects.rejection(agent))
	}
	once.Do(func() { release() })
	d.peers.wait()

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
	if rep := s.waitTerminal(t, id); rep.Status != room.Success {
		t.Fatalf("room of the registered decode: %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, id, seqPages(0, 1), 0)
}

// entryOf is the agent's current table entry (nil: none), for tests.
func (p *peers) entryOf(agent string) *peerEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byAgent[agent]
}

// readyEntry says whether the agent's entry is loaded.
func (p *peers) readyEntry(agent string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.byAgent[agent]
	return e != nil && e.ready
}
