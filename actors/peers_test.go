package actors

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/peer"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/internal/testrig"
)

// recExec records every peer's effects, in order, and answers loads when the
// test says so (slow work off the actor, reported back as a message).
type recExec struct {
	mu      sync.Mutex
	fx      map[string][]peer.Effects
	reports map[string]func(peer.Msg)
	panicOn func(agent string, fx peer.Effects) bool
	seen    chan string
}

func newRecExec() *recExec {
	return &recExec{fx: map[string][]peer.Effects{}, reports: map[string]func(peer.Msg){}, seen: make(chan string, 1024)}
}

func (r *recExec) Exec(p *PeerCtx, fx peer.Effects) {
	agent, report := p.Agent, p.Report
	if r.panicOn != nil && r.panicOn(agent, fx) {
		panic("exec fault for " + agent)
	}
	r.mu.Lock()
	r.fx[agent] = append(r.fx[agent], fx)
	r.reports[agent] = report
	r.mu.Unlock()
	r.seen <- agent
}

// await waits (bounded) until agent's effects satisfy cond.
func (r *recExec) await(t *testing.T, agent, what string, cond func(peer.Effects) bool) peer.Effects {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		for _, fx := range r.fx[agent] {
			if cond(fx) {
				r.mu.Unlock()
				return fx
			}
		}
		r.mu.Unlock()
		select {
		case <-r.seen:
		case <-deadline:
			t.Fatalf("%s: never saw %s", agent, what)
		}
	}
}

func (r *recExec) report(agent string, msg peer.Msg) {
	r.mu.Lock()
	f := r.reports[agent]
	r.mu.Unlock()
	f(msg)
}

var peersRules = peer.Config{Interval: time.Second, SafeAfter: 2 * time.Second, Budget: 4 * time.Second,
	FenceHold: 3 * time.Second, MaxQueued: 8}

func TestPeerActorLoadsOffTheActorAndProbesOnItsTimer(t *testing.T) {
	clk, ex := clock.NewFake(time.Unix(0, 0)), newRecExec()
	ps := NewPeers(PeersConfig{Rules: peersRules, Exec: ex, Clock: clk})
	defer ps.Close(context.Background())
	ep := peer.Endpoint{IP: "10.0.0.2", Port: 7000}
	ps.Send("a", peer.Register{From: ep, Reg: "r"})
	ps.Send("a", peer.Info{Room: 1}) // queued while the load is out
	load := ex.await(t, "a", "a load", func(fx peer.Effects) bool { return fx.Load != nil })
	ex.report("a", peer.LoadDone{Inc: load.Load.Inc})
	fx := ex.await(t, "a", "ready", func(fx peer.Effects) bool { return fx.Dial })
	if len(fx.Apply) != 1 || fx.Apply[0].Room != 1 || fx.Persist != "r" {
		t.Fatalf("ready effects %+v", fx)
	}
	// The actor arms the probe timer after its Exec returned: advance once it is.
	testrig.Eventually(t, 10*time.Second, "the probe timer armed", func() bool { return clk.Pending() > 0 })
	clk.Advance(time.Second) // the probe tick, as a message with its generation
	ex.await(t, "a", "a probe", func(fx peer.Effects) bool { return fx.Probe })
	st, ok, err := ps.Describe(context.Background(), "a")
	if err != nil || !ok || st.State != "ready" || st.Inc != 1 || st.Endpoint != ep {
		t.Fatalf("describe %+v %v %v", st, ok, err)
	}
}

// A panic while a peer's effects execute fails that peer (dropped: its rooms
// fail) and no other; the directory and the other peers go on.
func TestPeerActorPanicFailsThatPeerOnly(t *testing.T) {
	ex := newRecExec()
	ex.panicOn = func(agent string, fx peer.Effects) bool { return agent == "bad" && fx.Dial }
	var panics sync.WaitGroup
	panics.Add(1)
	ps := NewPeers(PeersConfig{Rules: peersRules, Exec: ex, Clock: clock.NewFake(time.Unix(0, 0)),
		OnPanic: func(string, any) { panics.Done() }})
	defer ps.Close(context.Background())
	for _, a := range []string{"bad", "good"} {
		ps.Send(a, peer.Register{From: peer.Endpoint{IP: a, Port: 1}})
		ex.await(t, a, "a load", func(fx peer.Effects) bool { return fx.Load != nil })
		ex.report(a, peer.LoadDone{Inc: 1})
	}
	fx := ex.await(t, "bad", "the drop", func(fx peer.Effects) bool { return fx.FailRooms })
	if fx.Release != 1 || !fx.Has(peer.NoteDropped) {
		t.Fatalf("drop after the panic %+v", fx)
	}
	panics.Wait()
	ex.await(t, "good", "ready", func(fx peer.Effects) bool { return fx.Dial })
	if st, _, _ := ps.Describe(context.Background(), "bad"); st.State != "gone" {
		t.Fatalf("bad peer %+v", st)
	}
	if st, _, _ := ps.Describe(context.Background(), "good"); st.State != "ready" {
		t.Fatalf("good peer %+v", st)
	}
}

// Shutdown ends every peer: Close returns once each is closed and the load
// still out came back and was released.
func TestPeersCloseWaitsForTheLoadsOut(t *testing.T) {
	ex := newRecExec()
	ps := NewPeers(PeersConfig{Rules: peersRules, Exec: ex, Clock: clock.NewFake(time.Unix(0, 0))})
	ps.Send("a", peer.Register{From: peer.Endpoint{IP: "a", Port: 1}})
	ps.Send("b", peer.Register{From: peer.Endpoint{IP: "b", Port: 1}})
	ex.await(t, "a", "a load", func(fx peer.Effects) bool { return fx.Load != nil })
	ex.await(t, "b", "a load", func(fx peer.Effects) bool { return fx.Load != nil })
	ex.report("b", peer.LoadDone{Inc: 1})
	ex.await(t, "b", "ready", func(fx peer.Effects) bool { return fx.Dial })

	closed := make(chan error, 1)
	go func() { closed <- ps.Close(context.Background()) }()
	ex.await(t, "b", "b closed", func(fx peer.Effects) bool { return fx.CloseLink && fx.Release == 1 })
	select {
	case err := <-closed:
		t.Fatalf("closed with a load out: %v", err)
	default:
	}
	ex.report("a", peer.LoadDone{Inc: 1}) // the load comes back after the shutdown
	ex.await(t, "a", "the late load released", func(fx peer.Effects) bool { return fx.Release == 1 })
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close never returned")
	}
}

// Broadcast steps a message on every peer and returns once none has a load
// out; SendAt reaches only the peers registered from that endpoint; a
// message for an agent that never registered spawns nothing.
func TestPeersBroadcastSendAtAndList(t *testing.T) {
	ex := newRecExec()
	ps := NewPeers(PeersConfig{Rules: peer.Config{NoLiveness: true}, Exec: ex, Clock: clock.NewFake(time.Unix(0, 0))})
	defer ps.Close(context.Background())
	a, b := peer.Endpoint{IP: "a", Port: 1}, peer.Endpoint{IP: "b", Port: 1}
	ps.Send("a", peer.Register{From: a})
	ps.Send("b", peer.Register{From: b})
	ps.Send("nobody", peer.Lost{Why: "x"})
	for _, agent := range []string{"a", "b"} {
		ex.await(t, agent, "a load", func(fx peer.Effects) bool { return fx.Load != nil })
	}
	ex.report("a", peer.LoadDone{Inc: 1})
	ex.await(t, "a", "ready", func(fx peer.Effects) bool { return fx.Dial })
	ps.SendAt(a, peer.Lost{Why: "outage", Fence: true})
	ex.await(t, "a", "fenced", func(fx peer.Effects) bool { return fx.Has(peer.NoteFenced) })

	done := make(chan error, 1)
	go func() { done <- ps.Broadcast(context.Background(), peer.Drop{Why: "rollback", KeepState: true}) }()
	ex.await(t, "b", "dropped while loading", func(fx peer.Effects) bool { return fx.Has(peer.NoteDropped) })
	select {
	case err := <-done:
		t.Fatalf("broadcast returned with b's load out: %v", err)
	default:
	}
	ex.report("b", peer.LoadDone{Inc: 1})
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("broadcast never returned")
	}
	l, err := ps.List(context.Background())
	if err != nil || len(l) != 2 || l[0].Agent != "a" || l[0].State != "gone" || l[1].State != "gone" {
		t.Fatalf("list %+v %v", l, err)
	}
	if _, ok, _ := ps.Describe(context.Background(), "nobody"); ok {
		t.Fatal("an actor for an agent that never registered")
	}
}

// A write reaches its peer's actor straight once the peer has one (the
// machine posts it: ready, not confirming); a write for an agent that never
// registered goes to Orphan, so it still ends.
func TestPeerWritesStraightAndOrphans(t *testing.T) {
	clk, ex := clock.NewFake(time.Unix(0, 0)), newRecExec()
	orphans := make(chan peer.Msg, 1)
	ps := NewPeers(PeersConfig{Rules: peersRules, Exec: ex, Clock: clk,
		Orphan: func(agent string, msg peer.Msg) { orphans <- msg }})
	defer ps.Close(context.Background())
	ps.SendWrite("nobody", peer.Write{ID: 9})
	select {
	case m := <-orphans:
		if w, ok := m.(peer.Write); !ok || w.ID != 9 {
			t.Fatalf("orphan %+v", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write for an agent with no actor never reached Orphan")
	}
	ps.Send("a", peer.Register{From: peer.Endpoint{IP: "10.0.0.2", Port: 7000}, Reg: "r", Epoch: 5})
	load := ex.await(t, "a", "a load", func(fx peer.Effects) bool { return fx.Load != nil })
	ex.report("a", peer.LoadDone{Inc: load.Load.Inc})
	ex.await(t, "a", "ready", func(fx peer.Effects) bool { return fx.Dial })
	ps.SendWrite("a", peer.Write{ID: 1, Inc: 5})
	ex.await(t, "a", "the write posted", func(fx peer.Effects) bool { return len(fx.Post) == 1 && fx.Post[0] == 1 })
}
