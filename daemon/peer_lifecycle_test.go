package daemon

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/peer"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/transport/bootstrap"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// gatedAgent is kvxferd's NIXL agent with LoadPeer held, per peer name, until
// the test releases it, and the control-plane calls counted.
type gatedAgent struct {
	*loopback.Agent
	mu                   sync.Mutex
	gates                map[string]chan struct{}
	entered              map[string]chan struct{}
	registered, deregged atomic.Int64
	dropped              atomic.Int64
}

func newGatedAgent(name string) (Agent, error) {
	a, err := loopback.New(name, loopback.Options{})
	if err != nil {
		return nil, err
	}
	return &gatedAgent{Agent: a, gates: map[string]chan struct{}{}, entered: map[string]chan struct{}{}}, nil
}

// hold makes the next LoadPeer of peer wait for the returned release; entered
// is closed once that LoadPeer is waiting.
func (g *gatedAgent) hold(peer string) (release func(), entered <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gate, in := make(chan struct{}), make(chan struct{})
	g.gates[peer], g.entered[peer] = gate, in
	return func() { close(gate) }, in
}

func (g *gatedAgent) LoadPeer(md []byte) (string, error) {
	name, err := g.Agent.LoadPeer(md)
	g.mu.Lock()
	gate, in := g.gates[name], g.entered[name]
	delete(g.gates, name)
	g.mu.Unlock()
	if gate != nil {
		close(in)
		<-gate
	}
	return name, err
}

func (g *gatedAgent) Register(kind nixl.MemKind, regions []nixl.Desc) (nixl.RegID, error) {
	id, err := g.Agent.Register(kind, regions)
	if err == nil {
		g.registered.Add(1)
	}
	return id, err
}

func (g *gatedAgent) Deregister(id nixl.RegID) error {
	err := g.Agent.Deregister(id)
	if err == nil {
		g.deregged.Add(1)
	}
	return err
}

func (g *gatedAgent) DropPeer(peer string) error {
	err := g.Agent.DropPeer(peer)
	if err == nil {
		g.dropped.Add(1)
	}
	return err
}

// A registration whose NIXL metadata load blocks does not block the
// ingest: another decode's registration and rooms go through meanwhile; the
// held decode's transfer infos (and an ABORT behind them) wait for its load
// and are then applied in order.
func TestIngestNeverBlocksWhileARegistrationLoads(t *testing.T) {
	d := startDaemonWith(t, func(c *Config) { c.NewAgent = newGatedAgent })
	s := newScheduler(t, d)
	g := d.agent.(*gatedAgent)

	slowNode, err := kvmem.New("slow-"+strconv.FormatInt(seq.Add(1), 10), decodeShape(false), 0, loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slowNode.Close() })
	release, entered := g.hold(slowNode.Agent.Name())
	released := false
	t.Cleanup(func() {
		if !released {
			release()
		}
	})
	slow := newDecodeOn(t, slowNode, nil, d)
	<-entered // the load is now blocked inside NIXL

	// Queued behind the blocked load: two rooms and an ABORT for the second.
	slow.checker.Expect(101, 1, false)
	slow.send(t, slow.info(101, seqPages(0, 2), 0, 1))
	slow.send(t, slow.info(102, seqPages(2, 1), 1, 1))
	slow.abortGen(t, 102, 7)

	// Another decode registers and moves a room while the load is held.
	fast := newDecode(t, d)
	fast.checker.Expect(201, 1, false)
	fast.send(t, fast.info(201, seqPages(10, 2), 2, 1))
	s.start(t, roomSpec{id: 201, src: seqPages(10, 2), chunks: []int{2}, aux: 2})
	if rep := s.waitTerminal(t, 201); rep.Status != kv.StatusSuccess {
		t.Fatalf("other decode's room while a load is held: %v/%v", rep.Status, rep.Reason)
	}
	fast.verify(t, 201, seqPages(10, 2), 2)
	s.start(t, roomSpec{id: 101, src: seqPages(20, 2), chunks: []int{1, 1}, aux: 3})
	s.cli.Open(102, "")
	// Nothing of the held decode reached a room yet.
	for _, id := range []uint64{101, 102} {
		reps, err := s.cli.Poll([]uint64{id}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st := reps[0].Status; st != kv.StatusBootstrapping {
			t.Fatalf("room %d is %v before its decode's registration loaded", id, st)
		}
	}
	if c := d.Counters(); c["registrations"] != 1 {
		t.Fatalf("counters while the load is held: %v", c)
	}

	release()
	released = true
	if rep := s.waitTerminal(t, 101); rep.Status != kv.StatusSuccess {
		t.Fatalf("queued room: %v/%v", rep.Status, rep.Reason)
	}
	slow.verify(t, 101, seqPages(0, 2), 0)
	// The ABORT came after 102's info: the room fails decode_abort and the ACK
	// echoes the generation (an ABORT applied first would have found no
	// decode endpoint to answer).
	if rep := s.waitTerminal(t, 102); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonDecodeAbort {
		t.Fatalf("queued ABORT: %v/%v", rep.Status, rep.Reason)
	}
	if ack := slow.waitFrame(t, isAck(102)).(*wire.AbortAck); !ack.HasGen || ack.Generation != 7 {
		t.Fatalf("ACK %+v", ack)
	}
	if c := d.Counters(); c["registrations"] != 2 || c["queued_frames_refused"] != 0 {
		t.Fatalf("counters %v", c)
	}
}

// The same agent registering again from its endpoint is its decode coming
// back after it gave its rooms up (SGLang re-registers only after clearing
// its connection pool): the old rooms fail peer_lost, the registration is
// loaded afresh (not ignored as a duplicate), and new rooms succeed.
func TestSameAgentRegisteringAgainIsTheDecodeComingBack(t *testing.T) {
	d := startDaemonWith(t, func(c *Config) { c.NewAgent = newGatedAgent })
	s := newScheduler(t, d)
	g := d.agent.(*gatedAgent)
	dec := newDecode(t, d)
	const old = 301
	dec.send(t, dec.info(old, seqPages(0, 1), 0, 1))
	s.cli.Open(old, "")
	waitRoomStatus(t, s, old, kv.StatusWaitingForInput)
	waitFor(t, "registered", func() bool { return d.Counters()["registrations"] == 1 })

	dec.send(t, dec.reg.Encode())
	if rep := s.waitTerminal(t, old); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
		t.Fatalf("room from before the decode came back: %v/%v", rep.Status, rep.Reason)
	}
	waitFor(t, "loaded again", func() bool { return d.Counters()["registrations"] == 2 })
	if c := d.Counters(); c["peers_returned"] != 1 || c["duplicate_registrations"] != 0 {
		t.Fatalf("counters %v", c)
	}
	if g.dropped.Load() != 1 {
		t.Fatalf("the old load was not dropped from NIXL before the new one: %d drops", g.dropped.Load())
	}
	// A transfer of the old load failing peer_lost now (our own DropPeer
	// invalidated it) does not drop the agent loaded again.
	d.peers.actors.Send(dec.node.Agent.Name(), peer.XferFailed{Inc: 1}) // posted at epoch 1
	if st := peerState(t, d, dec.node.Agent.Name()); st.State != "ready" || d.Counters()["peers_dropped"] != 1 {
		t.Fatalf("the agent loaded again was dropped for its old load's failure: %v", d.Counters())
	}
	const fresh = 302
	dec.checker.Expect(fresh, 1, false)
	dec.send(t, dec.info(fresh, seqPages(5, 2), 1, 1))
	s.start(t, roomSpec{id: fresh, src: seqPages(3, 2), chunks: []int{2}, aux: 1})
	if rep := s.waitTerminal(t, fresh); rep.Status != kv.StatusSuccess {
		t.Fatalf("room after the decode came back: %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, fresh, seqPages(5, 2), 1)
}

// A failed activation (here PUT /route) undoes everything it
// started: the ZMQ socket is closed, the decode agents it accepted (a replayed
// registration) leave the pool and NIXL with their links, the pool stops, the
// memory is deregistered from NIXL; the state file keeps the registration.
// The next register_memory activates again, and the replayed decode is served.
func TestFailedActivationRollsBack(t *testing.T) {
	state := t.TempDir()
	withState := func(c *Config) { c.StateDir = state; c.NewAgent = newGatedAgent }
	d1 := startDaemonWith(t, withState)
	s1 := newScheduler(t, d1)
	dec := newDecode(t, d1)
	waitFor(t, "registered", func() bool { return d1.Counters()["registrations"] == 1 })
	port := d1.PullPort()
	_ = s1
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	d1.Shutdown(ctx)
	cancel()

	var fail atomic.Bool
	fail.Store(true)
	d2 := startDaemonWith(t, func(c *Config) {
		withState(c)
		c.PullPort = port // the decode's PUSH socket reconnects to the same port
	})
	d2.putRoute = func(ctx context.Context, url string, reg bootstrap.RankRegistration, opt bootstrap.RegisterOptions) error {
		if fail.Load() {
			// Fail once the replayed registration is kept: a rollback that
			// comes first drops it mid-load, and it is never counted.
			if !testrig.Until(30*time.Second, func() bool { return d2.Counters()["registrations"] == 1 }) {
				t.Error("waited 30s for the replayed registration") // not the test's goroutine: no Fatal
			}
			return errors.New("bootstrap server unreachable (test)")
		}
		return bootstrap.RegisterRank(ctx, url, reg, opt)
	}
	mem := registerSchedulerMemory(t, d2)
	if err := mem.register(control.KindKV); err != nil {
		t.Fatal(err)
	}
	err := mem.register(control.KindAux)
	if err == nil {
		t.Fatal("activation with a failing PUT /route succeeded")
	}
	g := d2.agent.(*gatedAgent)
	if d2.Live() || d2.PullPort() != 0 || d2.xfers.pool.Load() != nil {
		t.Fatalf("after the rollback: live %v, port %d, pool %v", d2.Live(), d2.PullPort(), d2.xfers.pool.Load() != nil)
	}
	if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
		c.Close()
		t.Fatal("the ZMQ PULL socket still accepts connections after the rollback")
	}
	if r, dr := g.registered.Load(), g.deregged.Load(); r == 0 || r != dr {
		t.Fatalf("NIXL memory registrations %d, deregistrations %d", r, dr)
	}
	if n := acceptedPeers(t, d2); n != 0 {
		t.Fatalf("%d decode agents still accepted", n)
	}
	if g.dropped.Load() != 1 { // the replayed registration had loaded
		t.Fatalf("NIXL peers dropped: %d", g.dropped.Load())
	}
	waitFor(t, "links closed", func() bool { return d2.links.len() == 0 })
	if c := d2.Counters(); c["activations_rolled_back"] != 1 {
		t.Fatalf("counters %v", c)
	}
	if _, err := os.Stat(filepath.Join(state, "registrations")); err != nil {
		t.Fatalf("state file: %v", err)
	}

	// Try again: live, the registration replayed, its decode served.
	fail.Store(false)
	if err := mem.register(control.KindAux); err != nil {
		t.Fatalf("second activation: %v", err)
	}
	if !d2.Live() || d2.PullPort() != port {
		t.Fatalf("second activation: live %v, port %d", d2.Live(), d2.PullPort())
	}
	waitFor(t, "replayed again", func() bool { return d2.Counters()["registrations"] == 2 }) // once per activation
	s2 := &scheduler{kv: mem.kv, aux: mem.aux, cli: mem.cli}
	const id = 401
	dec.checker.Expect(id, 1, false)
	dec.send(t, dec.info(id, seqPages(7, 1), 2, 1))
	s2.start(t, roomSpec{id: id, src: seqPages(1, 1), chunks: []int{1}, aux: 2})
	if rep := s2.waitTerminal(t, id); rep.Status != kv.StatusSuccess {
		t.Fatalf("room after the second activation: %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, id, seqPages(7, 1), 2)
}

// Two register_memory calls at once: the second is refused at once (it does
// not wait behind the first's NIXL calls), and no lock is held meanwhile.
func TestRegisterMemoryIsRefusedWhileAnotherIsAtWork(t *testing.T) {
	d := startDaemonWith(t, func(c *Config) {})
	if err := d.beginMem(); err != nil {
		t.Fatal(err)
	}
	if err := d.beginMem(); !errors.Is(err, errMemBusy) {
		t.Fatalf("second turn: %v", err)
	}
	// The fields stay readable (no lock is held across the turn).
	if d.PullPort() != 0 || d.Live() {
		t.Fatal("live before activation")
	}
	d.endMem()
	if err := d.beginMem(); err != nil {
		t.Fatal(err)
	}
	d.endMem()
}

// memRig registers the scheduler's memory one kind at a time.
type memRig struct {
	kv, aux []byte
	cli     *control.Client
	regs    map[control.BufferKind]*control.MemoryRegistration
}

func (m *memRig) register(k control.BufferKind) error {
	_, err := m.cli.RegisterMemory(m.regs[k])
	return err
}

func registerSchedulerMemory(t *testing.T, d *Daemon) *memRig {
	t.Helper()
	kvPath, auxPath := schedGeo.Files(t, t.TempDir())
	view, err := loopback.New("sched-view-"+strconv.FormatInt(seq.Add(1), 10), loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { view.Close() })
	m := &memRig{regs: map[control.BufferKind]*control.MemoryRegistration{}}
	if m.kv, err = view.Attach(kvPath); err != nil {
		t.Fatal(err)
	}
	if m.aux, err = view.Attach(auxPath); err != nil {
		t.Fatal(err)
	}
	if m.cli, err = control.Dial(d.ControlEndpoint()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.cli.Close() })
	kv, aux := schedGeo.FileRegistrations(kvPath, auxPath)
	m.regs[control.KindKV], m.regs[control.KindAux] = kv, aux
	return m
}

// fakeProbes answers liveness probes per endpoint (default ProbeOK).
type fakeProbes struct {
	mu  sync.Mutex
	res map[kv.Endpoint]ProbeResult
	n   atomic.Int64
}

func (f *fakeProbes) set(at kv.Endpoint, r ProbeResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.res == nil {
		f.res = map[kv.Endpoint]ProbeResult{}
	}
	f.res[at] = r
}

func (f *fakeProbes) probe(_ context.Context, at kv.Endpoint) ProbeResult {
	f.n.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.res[at]
}

var _ = clock.NewFake

// peerState asks the agent's actor for its state (after every message sent
// to it before).
func peerState(t testing.TB, d *Daemon, agent string) actors.PeerState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, _, err := d.peers.actors.Describe(ctx, agent)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// acceptedPeers counts the agents loading or loaded.
func acceptedPeers(t testing.TB, d *Daemon) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := d.peers.actors.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range l {
		if p.State == "loading" || p.State == "ready" || p.State == "suspect" {
			n++
		}
	}
	return n
}
