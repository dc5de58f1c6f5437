package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig/schedmem"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

var seq atomic.Int64

const (
	layers, slots, item   = 2, 64, 512
	auxSlots              = 16
	stateSlots, stateItem = 8, 256
)

// scheduler plays the SGLang prefill scheduler: it owns the KV and aux memory
// (files another process maps) and drives kvxferd over the control API.
type scheduler struct {
	kv, aux []byte
	state   []byte
	cli     *control.Client
}

func newScheduler(t testing.TB, d *Daemon) *scheduler { return newSchedulerState(t, d, false) }

// newSchedulerState also registers one state list (one buffer of stateSlots
// items) when state is set; the daemon must expect it (StateComponents 1).
func newSchedulerState(t testing.TB, d *Daemon, state bool) *scheduler {
	return newSchedulerOn(t, d, state, fileBacking(t))
}

// backing makes the scheduler's memory for one buffer list: the region that
// names it (Offset and lengths filled in by the caller) and the scheduler's view.
type backing func(name string, n int) (control.Region, []byte)

// fileBacking: files in a temporary directory, registered by path.
func fileBacking(t testing.TB) backing {
	dir := t.TempDir()
	view, err := loopback.New(fmt.Sprintf("sched-view-%d", seq.Add(1)), loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { view.Close() })
	return func(name string, n int) (control.Region, []byte) {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, make([]byte, n), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := view.Attach(path)
		if err != nil {
			t.Fatal(err)
		}
		return control.Region{Shm: path}, b
	}
}

// schedGeo is the scheduler's KV and aux memory.
var schedGeo = schedmem.Layout{Layers: layers, Slots: slots, Item: item, AuxSlots: auxSlots, AuxItems: kvmem.DefaultShape().AuxItems}

// schedulerSizes are the bytes of the scheduler's KV, aux and state lists.
func schedulerSizes() (kv, aux, state int) {
	return schedGeo.KVLen(), schedGeo.AuxLen(), stateSlots * stateItem
}

func newSchedulerOn(t testing.TB, d *Daemon, state bool, mem backing) *scheduler {
	t.Helper()
	kvLen, auxLen, stLen := schedulerSizes()
	s := &scheduler{}
	kvReg, kvView := mem("kv", kvLen)
	auxReg, auxView := mem("aux", auxLen)
	s.kv, s.aux = kvView, auxView
	var err error
	if s.cli, err = control.Dial(d.ControlEndpoint()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cli.Close() })
	at := func(r control.Region, off, n, it uint64) control.Region {
		r.Offset, r.Length, r.ItemLen, r.Mem = off, n, it, nixl.DRAM
		return r
	}
	kv, aux := schedGeo.Registrations(kvReg, auxReg)
	if _, err := s.cli.RegisterMemory(kv); err != nil {
		t.Fatal(err)
	}
	if state {
		stReg, stView := mem("state", stLen)
		s.state = stView
		st := &control.MemoryRegistration{Kind: control.KindState, Buffers: []control.Region{at(stReg, 0, stateSlots*stateItem, stateItem)}}
		if _, err := s.cli.RegisterMemory(st); err != nil {
			t.Fatal(err)
		}
	}
	if d.Live() {
		t.Fatal("live before the aux memory was registered")
	}
	if _, err := s.cli.RegisterMemory(aux); err != nil {
		t.Fatal(err)
	}
	if !d.Live() {
		t.Fatal("not live after KV and aux were registered")
	}
	return s
}

// fill writes request page j of room r into prefill slot, and the aux slot.
func (s *scheduler) fill(r uint64, slot, j int) {
	for b := range 2 * layers {
		page := s.kv[(b*slots+slot)*item : (b*slots+slot+1)*item]
		for k := range page {
			page[k] = kvmem.Pattern(r, b, j, k)
		}
	}
}

// writeAux mirrors kvmem.Node.WriteAux on the scheduler's raw aux file.
func (s *scheduler) writeAux(slot int, r uint64) {
	off := 0
	items := kvmem.DefaultShape().AuxItems
	for i, it := range items {
		buf := s.aux[off : off+int(it)*auxSlots]
		itemBytes := buf[slot*int(it) : (slot+1)*int(it)]
		for k := range itemBytes {
			itemBytes[k] = byte(r) + byte(i) + byte(k)
		}
		if i == len(items)-1 {
			for k := range 8 {
				itemBytes[k] = byte(r >> (8 * k))
			}
		}
		off += int(it) * auxSlots
	}
}

func (s *scheduler) waitTerminal(t testing.TB, id uint64) kv.Reply {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		reps, err := s.cli.Poll([]uint64{id}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if reps[0].Status.Terminal() {
			return reps[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("room %d still %v", id, reps[0].Status)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// decodeRank plays one SGLang decode rank with raw frames. It registers with
// every prefill rank it targets and sends each frame to all of them, as a
// decode does.
type decodeRank struct {
	node    *kvmem.Node
	pushes  []*zmqio.PushLink
	pull    *zmqio.Ingest
	checker *sglang.Checker
	reg     *wire.Registration
	mu      sync.Mutex
	got     [][][]byte // frames received on decode's PULL socket
}

func decodeShape(state bool) kvmem.Shape {
	sh := kvmem.DefaultShape()
	sh.Layers, sh.Slots, sh.Item, sh.AuxSlots = layers, slots, item, auxSlots
	if state {
		sh.StateSlots, sh.StateItem, sh.StateBufs = stateSlots, stateItem, 1
	}
	return sh
}

func newDecode(t testing.TB, ds ...*Daemon) *decodeRank {
	return newDecodeShape(t, decodeShape(false), ds...)
}

func newDecodeShape(t testing.TB, sh kvmem.Shape, ds ...*Daemon) *decodeRank {
	t.Helper()
	return newDecodeWith(t, sh, nil, ds...)
}

// newDecodeWith lets mod change the registration before it is sent (the
// SGLang release it looks like).
func newDecodeWith(t testing.TB, sh kvmem.Shape, mod func(*wire.Registration), ds ...*Daemon) *decodeRank {
	t.Helper()
	n, err := kvmem.New(fmt.Sprintf("dec-%d", seq.Add(1)), sh, 0, loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return newDecodeOn(t, n, mod, ds...)
}

// newDecodeOn plays a decode rank on a node the caller made (and closes).
func newDecodeOn(t testing.TB, n *kvmem.Node, mod func(*wire.Registration), ds ...*Daemon) *decodeRank {
	t.Helper()
	var err error
	r := &decodeRank{node: n, checker: sglang.NewChecker()}
	r.pull, err = zmqio.StartPull(zmqio.IngestConfig{Host: "127.0.0.1"}, func(f [][]byte) {
		r.mu.Lock()
		r.got = append(r.got, f)
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.pull.Stop)
	md, err := n.Agent.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	g := n.Peer()
	r.reg = &wire.Registration{
		DecodeIP: "127.0.0.1", DecodePort: r.pull.Port(), AgentName: n.Agent.Name(), AgentMetadata: md,
		KVDataPtrs: g.KVPtrs, AuxDataPtrs: g.AuxPtrs, StateDataPtrs: g.StatePtrs, DecodeTPSize: 1, DstKVItemLen: item,
		DstNumSlots: slots, HasDstNumSlots: true, KVItemLens: g.KVItemLens,
		HasLayerInfo: true, DCPSize: 1, // 23 frames, as SGLang 0.5.18-0.5.22 send
	}
	for range g.KVPtrs {
		r.reg.KVMemKinds = append(r.reg.KVMemKinds, wire.MemDRAM)
	}
	if mod != nil {
		mod(r.reg)
	}
	for _, d := range ds {
		push, err := zmqio.DialPush(zmqio.PushConfig{Endpoint: zmqio.TCPEndpoint("127.0.0.1", d.PullPort())})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(push.Close)
		r.pushes = append(r.pushes, push)
	}
	r.send(t, r.reg.Encode())
	return r
}

func (r *decodeRank) send(t testing.TB, frames [][]byte) {
	t.Helper()
	for _, p := range r.pushes {
		if err := p.Send(frames); err != nil {
			t.Fatal(err)
		}
	}
}

func (r *decodeRank) info(id uint64, dst []int32, aux, required int) [][]byte {
	ti := &wire.TransferInfo{Room: id, DecodeIP: "127.0.0.1", DecodePort: r.pull.Port(), AgentName: r.node.Agent.Name(),
		DstKVIndices: dst, DstAuxIndex: aux, RequiredDstInfoNum: required, HasDecodePrefixLen: true}
	return ti.Encode()
}

func (r *decodeRank) waitDone(t testing.TB, id uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !r.checker.Done(id) {
		ns, err := r.node.Agent.Notifs(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if _, err := r.checker.Feed(n.Msg); err != nil {
				t.Fatalf("notif %q: %v", n.Msg, err)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("decode: room %d not done: %+v", id, r.checker.Status(id))
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// waitFrame waits until decode's PULL socket got a frame for which match holds.
func (r *decodeRank) waitFrame(t testing.TB, match func(wire.Outbound) bool) wire.Outbound {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r.mu.Lock()
		for _, f := range r.got {
			if m, err := wire.DecodeOutbound(f); err == nil && match(m) {
				r.mu.Unlock()
				return m
			}
		}
		r.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("expected frame never reached decode")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// startDaemon pins every decode to one dialect (wire.DialectUnknown: auto).
func startDaemon(t testing.TB, dialect wire.Dialect) *Daemon {
	return startDaemonWith(t, func(c *Config) { c.Dialect = dialect })
}

func startDaemonWith(t testing.TB, mod func(*Config)) *Daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvx") // short: ipc paths are limited to 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := Config{
		HostIP: "127.0.0.1", ServeBootstrap: true, DebugAddr: "127.0.0.1:0",
		ControlEndpoint: "ipc://" + filepath.Join(dir, "ctl.sock"),
	}
	mod(&cfg)
	d, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.Shutdown(ctx)
	})
	return d
}

func TestDaemonMovesARoomEndToEnd(t *testing.T) {
	d := startDaemon(t, wire.DialectUnknown)
	s := newScheduler(t, d)
	dec := newDecode(t, d)

	// The bootstrap server publishes the rank as decode expects.
	resp, err := http.Get("http://" + d.BootstrapAddr() + "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0")
	if err != nil {
		t.Fatal(err)
	}
	var ep struct {
		RankIP   string `json:"rank_ip"`
		RankPort int    `json:"rank_port"`
	}
	json.NewDecoder(resp.Body).Decode(&ep)
	resp.Body.Close()
	if ep.RankIP != "127.0.0.1" || ep.RankPort != d.PullPort() {
		t.Fatalf("GET /route gave %+v, want 127.0.0.1:%d", ep, d.PullPort())
	}

	const id = 1001
	src, dst := []int32{3, 4, 5, 6, 7}, []int32{20, 21, 22, 23, 24}
	dec.checker.Expect(id, 1, false)
	dec.send(t, dec.info(id, dst, 5, 1))
	s.start(t, roomSpec{id: id, src: src, chunks: []int{3, 2}, aux: 2})
	if rep := s.waitTerminal(t, id); rep.Status != kv.StatusSuccess {
		t.Fatalf("room ended %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, id, dst, 5)
	s.cli.Clear(id)
}

func TestDaemonDecodeAbortIsAckedAfterDrainAndBadFramesTouchNothingElse(t *testing.T) {
	d := startDaemon(t, wire.DialectUnknown)
	s := newScheduler(t, d)
	dec := newDecode(t, d)

	// A malformed transfer info for room 7 fails room 7 only.
	bad := dec.info(7, []int32{1}, 1, 1)
	bad[6] = []byte("not-a-number")
	dec.send(t, bad)
	dec.send(t, [][]byte{[]byte("GARBAGE")})
	const id = 2002
	dec.send(t, dec.info(id, []int32{1, 2}, 1, 1))
	s.cli.Open(id, "")
	s.cli.Open(7, "")
	if rep := s.waitTerminal(t, 7); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonInvalidRequest {
		t.Fatalf("room named by a malformed frame: %v/%v", rep.Status, rep.Reason)
	}
	dec.send(t, (&wire.Abort{Room: id, DecodeIP: "127.0.0.1", DecodePort: dec.pull.Port(), HasEndpoint: true}).Encode())
	if rep := s.waitTerminal(t, id); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonDecodeAbort {
		t.Fatalf("aborted room: %v/%v", rep.Status, rep.Reason)
	}
	ack := dec.waitFrame(t, func(m wire.Outbound) bool {
		a, ok := m.(*wire.AbortAck)
		return ok && a.Room == id
	})
	if a := ack.(*wire.AbortAck); a.PrefillRank != 0 {
		t.Fatalf("ABORT_ACK from sender %d", a.PrefillRank)
	}
	fails, err := s.cli.Failure([]uint64{id}, true)
	if err != nil || fails[0].Reason != kv.ReasonDecodeAbort || fails[0].Message == "" {
		t.Fatalf("failure_exception: %+v %v", fails, err)
	}
	// The loop survived both bad frames: another room still succeeds.
	const ok = 2003
	dec.checker.Expect(ok, 1, false)
	dec.send(t, dec.info(ok, []int32{30, 31}, 3, 1))
	s.start(t, roomSpec{id: ok, src: []int32{10, 11}, chunks: []int{2}, aux: 3})
	if rep := s.waitTerminal(t, ok); rep.Status != kv.StatusSuccess {
		t.Fatalf("room after bad frames: %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, ok, []int32{30, 31}, 3)

	resp, err := http.Get("http://" + d.DebugAddr() + "/debug/rooms")
	if err != nil {
		t.Fatal(err)
	}
	var dump struct {
		Counters map[string]int64 `json:"counters"`
	}
	json.NewDecoder(resp.Body).Decode(&dump)
	resp.Body.Close()
	if dump.Counters["bad_frames"] != 2 || dump.Counters["registrations"] != 1 {
		t.Fatalf("counters %+v", dump.Counters)
	}
}

func TestDaemonShutdownFailsLiveRoomsAndTellsDecode(t *testing.T) {
	d := startDaemon(t, wire.DialectUnknown)
	s := newScheduler(t, d)
	dec := newDecode(t, d)
	const id = 4004
	dec.send(t, dec.info(id, []int32{1}, 1, 1))
	s.cli.Open(id, "")
	deadline := time.Now().Add(20 * time.Second)
	for {
		reps, err := s.cli.Poll([]uint64{id}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if reps[0].Status == kv.StatusWaitingForInput {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("room %d is %v", id, reps[0].Status)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	st := dec.waitFrame(t, func(m wire.Outbound) bool {
		k, ok := m.(*wire.KVStatus)
		return ok && k.Room == id
	}).(*wire.KVStatus)
	if st.Status != kv.StatusFailed || st.Reason != "shutdown" {
		t.Fatalf("decode heard %+v, want Failed/shutdown", st)
	}
}

func TestDaemonOnLiveReportsTheRegisteredGeometry(t *testing.T) {
	got := make(chan int64, 1)
	d := startDaemonWith(t, func(c *Config) { c.OnLive = func(l sglang.Local) { got <- BytesPerPage(l) } })
	newScheduler(t, d)
	if n := <-got; n != 2*layers*item {
		t.Fatalf("bytes per page %d, want %d", n, 2*layers*item)
	}
}
