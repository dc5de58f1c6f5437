package decode

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/bootstrap"
	"github.com/kvxfer/kvxfer/transport/wire"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// testShape is the memory of both sides in tests: small, so poisoning and
// verification stay cheap.
func testShape() kvmem.Shape {
	sh := kvmem.DefaultShape()
	sh.Layers, sh.Slots, sh.Item, sh.AuxSlots = 2, 128, 256, 32
	sh.StateSlots, sh.StateItem, sh.StateBufs = 16, 64, 2
	return sh
}

var prefillSeq atomic.Int64

// prefillOpts say how the test prefill serves decode. The zero value is
// kvxferd in auto mode: each decode's dialect from its registration (23
// frames: legacy, default 0.5.20), raised to 0.5.22 by an ABORT with a
// generation; notices written as daemon.Notify writes them.
type prefillOpts struct {
	legacy wire.Dialect // what a 23-frame registration is taken for
	// An older or broken prefill: ABORT_ACKs without the generation
	// (stripGen), no KV_STATUS "4" even for 0.5.23 (noSuccessStatus), or no
	// notifications and KV_STATUS "4" to every decode that reads it
	// (statusOnly).
	stripGen, noSuccessStatus, statusOnly bool
	// notifsToAll: notifications for every decode, 0.5.23 included (a
	// prefill that took a 0.5.23 decode for an older one).
	notifsToAll bool
}

// prefill is a minimal prefill rank built from kvxfer's own pieces: the
// bootstrap server, a ZMQ ingest feeding an actors.Engine with the NIXL
// transfer pool (completion notifications held back until the room
// succeeds, as kvxferd does), and PUSH links back to decode for the engine's
// notices. The test plays the prefill scheduler with serve.
type prefill struct {
	t      *testing.T
	node   *kvmem.Node
	pool   *xfer.Pool
	eng    *actors.Engine
	ingest *zmqio.Ingest
	boot   *bootstrap.BootstrapServer
	http   *httptest.Server

	healthDown atomic.Bool
	sendState  bool // the scheduler sends a state slot with the last chunk
	regs       atomic.Int64
	infos      atomic.Int64
	regFrames  atomic.Int64 // frames after GUARD of the last registration
	o          prefillOpts
	rank       int // _prefill_unique_rank (pp 1, cp 1: the TP rank)

	mu     sync.Mutex
	aborts map[uint64]int
	gens   map[uint64]uint64            // last ABORT generation per room
	peers  map[kv.Endpoint]wire.Dialect // decode PULL endpoint -> dialect
	links  map[string]*zmqio.PushLink
	free   []int32 // prefill pages
	auxes  []int
}

func newPrefill(t *testing.T, o prefillOpts) *prefill { return newPrefillRank(t, o, 1, 0, nil) }

// newPrefillRank is TP rank tpRank of a prefill instance of TP size tpSize.
// Rank 0 hosts the bootstrap server; other ranks register into first's.
func newPrefillRank(t *testing.T, o prefillOpts, tpSize, tpRank int, first *prefill) *prefill {
	t.Helper()
	if o.legacy == wire.DialectUnknown {
		o.legacy = wire.Dialect0520
	}
	p := &prefill{t: t, o: o, rank: tpRank, aborts: map[uint64]int{}, gens: map[uint64]uint64{},
		peers: map[kv.Endpoint]wire.Dialect{}, links: map[string]*zmqio.PushLink{}}
	node, err := kvmem.New(fmt.Sprintf("emul-prefill-%d", prefillSeq.Add(1)), testShape(), sglang.SenderID(0, tpSize, tpRank), loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p.node = node
	t.Cleanup(func() { node.Close() })
	for i := node.Shape.Slots - 1; i >= 0; i-- {
		p.free = append(p.free, int32(i))
	}
	for i := node.Shape.AuxSlots - 1; i >= 0; i-- {
		p.auxes = append(p.auxes, i)
	}
	signalFailed := func(room uint64, agent string, err error) {
		t.Errorf("prefill: signal room %d to %s: %v", room, agent, err)
	}
	if p.pool, err = xfer.New(xfer.Config{Agent: node.Agent, Local: &node.Geo, SignalFailed: signalFailed}); err != nil {
		t.Fatal(err)
	}
	cfg := actors.Config{Transfers: p.pool, Clock: clock.Real{}, Room: room.DefaultConfig(), Notifier: p}
	cfg.Room.HoldCompletion = true
	if p.eng, err = actors.New(cfg); err != nil {
		t.Fatal(err)
	}
	sink := zmqio.SinkFuncs{
		OnRegistration: p.register,
		OnTransferInfo: func(ti *wire.TransferInfo) {
			p.infos.Add(1)
			if !ti.HasIsDummy {
				t.Errorf("prefill: transfer info without is_dummy (every release sends 10 frames)")
			}
			p.eng.TransferInfo(ti.Room, room.TransferInfo{Agent: ti.AgentName,
				From:     kv.Endpoint{IP: ti.DecodeIP, Port: ti.DecodePort},
				DstPages: ti.DstKVIndices, DstAux: ti.DstAuxIndex, Required: ti.RequiredDstInfoNum,
				DstState: ti.DstStateIndices, PrefixLen: ti.DecodePrefixLen, Dummy: ti.IsDummy()})
		},
		OnAbort: func(a *wire.Abort) {
			from := kv.Endpoint{IP: a.DecodeIP, Port: a.DecodePort}
			p.mu.Lock()
			p.aborts[a.Room]++
			if a.HasGen {
				p.gens[a.Room] = a.Generation
				if d, ok := p.peers[from]; ok && d < wire.Dialect0522 {
					p.peers[from] = wire.Dialect0522
				}
			}
			p.mu.Unlock()
			if a.HasGen {
				p.eng.DecodeAbortGen(a.Room, from, a.Generation)
				return
			}
			p.eng.DecodeAbort(a.Room, from)
		},
		OnBadFrame: func(err error) { t.Errorf("prefill: bad frame: %v", err) },
	}
	if p.ingest, err = zmqio.StartIngest(zmqio.IngestConfig{Host: "127.0.0.1"}, sink); err != nil {
		t.Fatal(err)
	}
	if first != nil {
		p.boot, p.http = first.boot, first.http
	} else {
		p.boot = bootstrap.NewBootstrapServer(bootstrap.BootstrapConfig{})
		h := p.boot.Handler()
		p.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/health" && p.healthDown.Load() {
				http.Error(w, "down", http.StatusServiceUnavailable)
				return
			}
			h.ServeHTTP(w, r)
		}))
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.eng.Close(ctx)
		p.pool.Close()
		p.ingest.Stop()
		if first == nil {
			p.http.Close()
		}
		p.mu.Lock()
		for _, l := range p.links {
			l.Close()
		}
		p.mu.Unlock()
	})
	err = bootstrap.RegisterRank(context.Background(), p.http.URL, bootstrap.RankRegistration{
		AttnTPSize: tpSize, AttnTPRank: tpRank, AttnCPSize: 1, AttnDPSize: 1, PPSize: 1, SystemDPSize: 1,
		RankIP: "127.0.0.1", RankPort: p.ingest.Port(), PageSize: 16, KVCacheDtype: "auto",
	}, bootstrap.RegisterOptions{Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// register is what kvxferd does with a registration: load the agent, then
// hand the peer geometry to the transfer pool.
func (p *prefill) register(reg *wire.Registration) {
	p.regs.Add(1)
	p.regFrames.Store(int64(reg.Frames))
	dl, err := wire.DialectOf(reg, p.o.legacy)
	if err != nil {
		p.t.Errorf("prefill: %v", err)
		return
	}
	p.mu.Lock()
	p.peers[kv.Endpoint{IP: reg.DecodeIP, Port: reg.DecodePort}] = dl
	p.mu.Unlock()
	if _, err := p.node.Agent.LoadPeer(reg.AgentMetadata); err != nil {
		p.t.Errorf("prefill: LoadPeer: %v", err)
		return
	}
	g := sglang.PeerGeometry{Agent: reg.AgentName, KVPtrs: reg.KVDataPtrs, KVItemLens: reg.KVItemLens,
		DstKVItemLen: uint64(reg.DstKVItemLen), GPU: uint64(reg.GPUID), AuxPtrs: reg.AuxDataPtrs,
		StatePtrs: reg.StateDataPtrs, TPSize: reg.DecodeTPSize, NoNotifs: (!dl.Notifs() && !p.o.notifsToAll) || p.o.statusOnly}
	if reg.HasDstNumSlots {
		g.DstNumSlots = reg.DstNumSlots
	}
	for _, k := range reg.KVMemKinds {
		if k == wire.MemVRAM {
			g.KVKinds = append(g.KVKinds, nixl.VRAM)
		} else {
			g.KVKinds = append(g.KVKinds, nixl.DRAM)
		}
	}
	if err := p.pool.AddPeer(g); err != nil {
		p.t.Errorf("prefill: AddPeer: %v", err)
	}
}

// dialectOf is the dialect notices to a decode endpoint are written in.
func (p *prefill) dialectOf(to kv.Endpoint) wire.Dialect {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d, ok := p.peers[to]; ok {
		return d
	}
	return p.o.legacy
}

// Notify writes the engine's notices as daemon.Notify does (modulo prefillOpts).
func (p *prefill) Notify(id uint64, n room.Notice) {
	dl := p.dialectOf(n.To)
	var m wire.Outbound
	switch n.Kind {
	case room.Completion:
		if len(n.Signal) > 0 && (dl.Notifs() || p.o.notifsToAll) && !p.o.statusOnly {
			p.pool.Signal(id, n.Agent, n.Signal)
		}
		if n.To.Port <= 0 || p.o.noSuccessStatus || !dl.CompletesOnStatus() && !(p.o.statusOnly && dl.ReadsStatus()) {
			return
		}
		m = &wire.KVStatus{Room: id, Status: kv.StatusSuccess, PrefillRank: p.rank}
	case room.FailureStatus:
		if n.To.Port <= 0 || !dl.ReadsStatus() {
			return
		}
		m = &wire.KVStatus{Room: id, Status: kv.StatusFailed, PrefillRank: p.rank, Reason: n.Reason.String()}
	case room.AbortAck:
		if n.To.Port <= 0 || !n.HasGen && !dl.AcksWithoutGen() && !p.o.stripGen {
			return
		}
		m = &wire.AbortAck{Room: id, PrefillRank: p.rank, Generation: n.Gen, HasGen: n.HasGen && !p.o.stripGen}
	default:
		return
	}
	p.sendTo(n.To, m.Encode())
}

// sendTo pushes frames to a decode PULL endpoint.
func (p *prefill) sendTo(to kv.Endpoint, frames [][]byte) {
	ep := zmqio.TCPEndpoint(to.IP, to.Port)
	p.mu.Lock()
	l, ok := p.links[ep]
	if !ok {
		var err error
		if l, err = zmqio.DialPush(zmqio.PushConfig{Endpoint: ep}); err != nil {
			p.mu.Unlock()
			p.t.Errorf("prefill: dial %s: %v", ep, err)
			return
		}
		p.links[ep] = l
	}
	p.mu.Unlock()
	_ = l.Send(frames)
}

func (p *prefill) genOf(id uint64) (uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	g, ok := p.gens[id]
	return g, ok
}

func (p *prefill) takePages(n int) ([]int32, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > len(p.free) || len(p.auxes) == 0 {
		p.t.Fatalf("prefill out of pages")
	}
	out := append([]int32(nil), p.free[len(p.free)-n:]...)
	p.free = p.free[:len(p.free)-n]
	a := p.auxes[len(p.auxes)-1]
	p.auxes = p.auxes[:len(p.auxes)-1]
	return out, a
}

func (p *prefill) putPages(ps []int32, a int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free = append(p.free, ps...)
	p.auxes = append(p.auxes, a)
}

// serve plays SGLang's prefill scheduler for one plan: open the sender, init,
// fill and send the chunks (aborting where the plan says), poll until terminal,
// clear. Prefill fills request page j with FillPageAt(room, slot, j).
func (p *prefill) serve(pl workload.Plan) kv.Reply {
	src, aux := p.takePages(pl.Pages)
	defer p.putPages(src, aux)
	for j, s := range src {
		p.node.FillPageAt(pl.Room, int(s), j)
	}
	p.node.WriteAux(aux, pl.Room)
	var state [][]int32
	if p.sendState {
		slot := aux % p.node.Shape.StateSlots
		fillState(p.node, pl.Room, slot)
		state = [][]int32{{int32(slot)}}
	}
	p.eng.Open(pl.Room)
	p.eng.Init(pl.Room, pl.Pages, aux)
	if pl.Abort == workload.AbortPrefillClient {
		p.eng.Abort(pl.Room)
	} else {
		next := 0
		for i, k := range pl.Chunks {
			var st [][]int32
			if i == len(pl.Chunks)-1 {
				st = state
			}
			p.eng.Send(pl.Room, src[next:next+k], st)
			next += k
			if i == 0 && pl.Abort == workload.AbortPrefillMidTransfer {
				p.eng.Abort(pl.Room)
				break
			}
		}
	}
	rep := p.waitTerminal(pl.Room, 20*time.Second)
	p.eng.Clear(pl.Room)
	return rep
}

// waitTerminal polls the engine like the scheduler's inflight queue.
func (p *prefill) waitTerminal(id uint64, limit time.Duration) kv.Reply {
	deadline := time.Now().Add(limit)
	for {
		rep := p.eng.Poll([]uint64{id}, nil)[0]
		if rep.Status.Terminal() || time.Now().After(deadline) {
			return rep
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func (p *prefill) abortsOf(id uint64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.aborts[id]
}

// eventually polls cond (bounded), failing the test with what after limit.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}
