package daemon

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/cuda"
	"github.com/kvxfer/kvxfer/nixl/cuda/cudafake"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// These tests run the GPU path on cudafake: three "processes" of one fake
// host (scheduler, kvxferd, decode) with their own address spaces. They
// prove the bookkeeping, the messages and the refusals; the GPU check
// (scripts/gpu-check.sh) proves the real driver path.

func startVRAMDaemon(t *testing.T, kp *cudafake.Process) *Daemon {
	return startDaemonWith(t, func(c *Config) {
		c.NewAgent = func(name string) (Agent, error) {
			a, err := loopback.NewVRAM(name, loopback.Options{}, kp)
			if err != nil {
				return nil, err
			}
			return WithCUDAIPC(a, kp), nil
		}
	})
}

// vramScheduler holds its KV in one fake GPU allocation (as a torch caching
// allocator segment does: one handle, a buffer per layer at its offset) and
// its aux in a shared file, and registers both over the control API.
type vramScheduler struct {
	p   *cudafake.Process
	kv  uint64
	h   cuda.Handle
	cli *control.Client
	aux *scheduler // aux writer (only its aux field is used)
}

func kvRegion(h cuda.Handle, b int, dev uint64) control.Region {
	return control.Region{CUDAIPC: h[:], Offset: uint64(b * slots * item), Length: slots * item, ItemLen: item, Mem: nixl.VRAM, Dev: dev}
}

func newVRAMScheduler(t *testing.T, d *Daemon, p *cudafake.Process) *vramScheduler {
	t.Helper()
	s := &vramScheduler{p: p, aux: &scheduler{}}
	var err error
	if s.kv, err = p.Alloc(0, 2*layers*slots*item); err != nil {
		t.Fatal(err)
	}
	if s.h, err = p.IpcGet(0, s.kv); err != nil {
		t.Fatal(err)
	}
	if s.cli, err = control.Dial(d.ControlEndpoint()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.cli.Close() })
	kv := &control.MemoryRegistration{Kind: control.KindKV}
	for b := range 2 * layers {
		kv.Buffers = append(kv.Buffers, kvRegion(s.h, b, 0))
	}
	if _, err := s.cli.RegisterMemory(kv); err != nil {
		t.Fatal(err)
	}
	auxPath := filepath.Join(t.TempDir(), "aux")
	auxLen := 0
	for _, it := range kvmem.DefaultShape().AuxItems {
		auxLen += int(it) * auxSlots
	}
	if err := os.WriteFile(auxPath, make([]byte, auxLen), 0o600); err != nil {
		t.Fatal(err)
	}
	view, err := loopback.New(fmt.Sprintf("vsched-view-%d", seq.Add(1)), loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { view.Close() })
	if s.aux.aux, err = view.Attach(auxPath); err != nil {
		t.Fatal(err)
	}
	aux := &control.MemoryRegistration{Kind: control.KindAux}
	off := uint64(0)
	for _, it := range kvmem.DefaultShape().AuxItems {
		aux.Buffers = append(aux.Buffers, control.Region{Shm: auxPath, Offset: off, Length: it * auxSlots, ItemLen: it, Mem: nixl.DRAM})
		off += it * auxSlots
	}
	if _, err := s.cli.RegisterMemory(aux); err != nil {
		t.Fatal(err)
	}
	if !d.Live() {
		t.Fatal("not live after GPU KV and aux were registered")
	}
	return s
}

// fill writes page j of room r into prefill slot of every layer buffer, on the GPU.
func (s *vramScheduler) fill(t *testing.T, r uint64, slot, j int) {
	page := make([]byte, item)
	for b := range 2 * layers {
		for k := range page {
			page[k] = kvmem.Pattern(r, b, j, k)
		}
		if err := s.p.CopyHtoD(0, s.kv+uint64((b*slots+slot)*item), page); err != nil {
			t.Fatal(err)
		}
	}
}

// vramDecode is a decode rank whose KV is on GPU 1 of its own process,
// registered with NIXL (loopback VRAM mode) as SGLang's decode does.
type vramDecode struct {
	p       *cudafake.Process
	agent   *loopback.VRAM
	kv      uint64
	checker *sglang.Checker
	push    *zmqio.PushLink
	port    int
}

func newVRAMDecode(t *testing.T, d *Daemon, p *cudafake.Process) *vramDecode {
	t.Helper()
	r := &vramDecode{p: p, checker: sglang.NewChecker()}
	var err error
	if r.agent, err = loopback.NewVRAM(fmt.Sprintf("vdec-%d", seq.Add(1)), loopback.Options{}, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.agent.Close() })
	if r.kv, err = p.Alloc(1, 2*layers*slots*item); err != nil {
		t.Fatal(err)
	}
	if _, err := r.agent.Register(nixl.VRAM, []nixl.Desc{{Addr: uintptr(r.kv), Len: 2 * layers * slots * item, DevID: 1}}); err != nil {
		t.Fatal(err)
	}
	reg := &wire.Registration{DecodeIP: "127.0.0.1", AgentName: r.agent.Name(), GPUID: 1, DecodeTPSize: 1, DstKVItemLen: item,
		DstNumSlots: slots, HasDstNumSlots: true, HasLayerInfo: true, DCPSize: 1}
	for b := range 2 * layers {
		reg.KVDataPtrs = append(reg.KVDataPtrs, r.kv+uint64(b*slots*item))
		reg.KVItemLens = append(reg.KVItemLens, item)
		reg.KVMemKinds = append(reg.KVMemKinds, wire.MemVRAM)
	}
	for _, it := range kvmem.DefaultShape().AuxItems {
		b, err := r.agent.Alloc(int(it) * auxSlots)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.agent.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(b, 0)}); err != nil {
			t.Fatal(err)
		}
		reg.AuxDataPtrs = append(reg.AuxDataPtrs, uint64(nixl.DescOf(b, 0).Addr))
	}
	if reg.AgentMetadata, err = r.agent.LocalMetadata(); err != nil {
		t.Fatal(err)
	}
	pull, err := zmqio.StartPull(zmqio.IngestConfig{Host: "127.0.0.1"}, func([][]byte) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pull.Stop)
	r.port, reg.DecodePort = pull.Port(), pull.Port()
	if r.push, err = zmqio.DialPush(zmqio.PushConfig{Endpoint: zmqio.TCPEndpoint("127.0.0.1", d.PullPort())}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.push.Close)
	if err := r.push.Send(reg.Encode()); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *vramDecode) waitDone(t *testing.T, id uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !r.checker.Done(id) {
		ns, err := r.agent.Notifs(nil)
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
		time.Sleep(time.Millisecond)
	}
}

// TestDaemonMovesARoomFromSchedulerGPUToDecodeGPU: the scheduler registers
// its GPU KV by CUDA IPC handle, kvxferd opens it once (one handle for every
// layer buffer), and a room's pages land on the decode's GPU (a device-to-host
// copy checks every byte of every layer buffer, and that nothing else moved).
func TestDaemonMovesARoomFromSchedulerGPUToDecodeGPU(t *testing.T) {
	g := cudafake.New(2)
	sp, kp, dp := g.Process(), g.Process(), g.Process()
	// Registered first, so it runs after the daemon's shutdown: kvxferd closed
	// every handle it opened, the scheduler's and the decode's.
	t.Cleanup(func() {
		if n := kp.OpenHandles(); n != 0 {
			t.Errorf("after shutdown kvxferd still holds %d CUDA IPC handles", n)
		}
	})
	d := startVRAMDaemon(t, kp)
	s := newVRAMScheduler(t, d, sp)
	dec := newVRAMDecode(t, d, dp)
	if n := kp.OpenHandles(); n != 1 {
		t.Fatalf("kvxferd opened %d handles for one exported allocation, want 1", n)
	}
	const id = 3001
	src, dst := []int32{3, 4, 5, 9}, []int32{20, 21, 22, 40}
	for j, slot := range src {
		s.fill(t, id, int(slot), j)
	}
	s.aux.writeAux(2, id)
	dec.checker.Expect(id, 1, false)
	ti := &wire.TransferInfo{Room: id, DecodeIP: "127.0.0.1", DecodePort: dec.port, AgentName: dec.agent.Name(),
		DstKVIndices: dst, DstAuxIndex: 5, RequiredDstInfoNum: 1, HasDecodePrefixLen: true}
	if err := dec.push.Send(ti.Encode()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.cli.Open(id, ""); err != nil {
		t.Fatal(err)
	}
	s.cli.Init(id, len(src), 2)
	s.cli.Send(id, src[:3], nil)
	s.cli.Send(id, src[3:], nil)
	sched := &scheduler{cli: s.cli}
	if rep := sched.waitTerminal(t, id); rep.Status != kv.StatusSuccess {
		t.Fatalf("room ended %v/%v", rep.Status, rep.Reason)
	}
	dec.waitDone(t, id)
	got := make([]byte, 2*layers*slots*item)
	if err := dp.CopyDtoH(1, got, dec.kv); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, len(got))
	for b := range 2 * layers {
		for j, p := range dst {
			page := want[(b*slots+int(p))*item : (b*slots+int(p)+1)*item]
			for k := range page {
				page[k] = kvmem.Pattern(id, b, j, k)
			}
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("decode GPU memory differs from the room's pages (or bytes outside them changed)")
	}
	if kp.Calls("cuMemcpyPeer") == 0 {
		t.Fatal("GPU 0 -> GPU 1 pages were not copied with cuMemcpyPeer")
	}
	if n := kp.OpenHandles(); n != 2 {
		t.Fatalf("kvxferd holds %d handles while live, want 2 (the scheduler's KV, the decode's KV)", n)
	}
}

// TestRegisterMemoryRefusesWhatCannotBeImported: every refusal comes at
// register_memory, says why, and leaves no handle open in kvxferd.
func TestRegisterMemoryRefusesWhatCannotBeImported(t *testing.T) {
	cases := []struct {
		name string
		mod  func(g *cudafake.GPU, sp *cudafake.Process, kv *control.MemoryRegistration)
		kp   func(g *cudafake.GPU) *cudafake.Process
		want string
	}{
		{name: "stale handle", want: "stale or foreign IPC handle"}, // the scheduler freed it
		{name: "wrong device", mod: func(g *cudafake.GPU, sp *cudafake.Process, kv *control.MemoryRegistration) {
			for i := range kv.Buffers {
				kv.Buffers[i].Dev = 1
			}
		}, want: "wrong device"},
		{name: "device kvxferd does not see", mod: func(g *cudafake.GPU, sp *cudafake.Process, kv *control.MemoryRegistration) {
			for i := range kv.Buffers {
				kv.Buffers[i].Dev = 7
			}
		}, want: "this process sees 2 GPU(s)"},
		{name: "no GPU in kvxferd", kp: func(g *cudafake.GPU) *cudafake.Process { return g.NoGPUProcess() }, want: "no GPU access"},
		{name: "last buffer past the allocation", mod: func(g *cudafake.GPU, sp *cudafake.Process, kv *control.MemoryRegistration) {
			kv.Buffers[len(kv.Buffers)-1].Offset += item
		}, want: "past the end of the exported allocation"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := cudafake.New(2)
			sp := g.Process()
			kp := g.Process()
			if c.kp != nil {
				kp = c.kp(g)
			}
			d := startVRAMDaemon(t, kp)
			ptr, _ := sp.Alloc(0, 2*layers*slots*item)
			h, _ := sp.IpcGet(0, ptr)
			kv := &control.MemoryRegistration{Kind: control.KindKV}
			for b := range 2 * layers {
				kv.Buffers = append(kv.Buffers, kvRegion(h, b, 0))
			}
			if c.name == "stale handle" {
				sp.Free(0, ptr)
			}
			if c.mod != nil {
				c.mod(g, sp, kv)
			}
			cli, err := control.Dial(d.ControlEndpoint())
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			_, err = cli.RegisterMemory(kv)
			var ce *control.Error
			if !errors.As(err, &ce) || ce.Code != control.CodeRejected || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("register_memory = %v; want %s containing %q", err, control.CodeRejected, c.want)
			}
			if kp.OpenHandles() != 0 {
				t.Fatalf("a refused registration left %d handles open in kvxferd", kp.OpenHandles())
			}
		})
	}
}

// TestRegisterMemoryCUDAIPCNeedsAnImporter: an agent without CUDA IPC
// support (a custom Config.NewAgent) refuses GPU buffers by name.
func TestRegisterMemoryCUDAIPCNeedsAnImporter(t *testing.T) {
	d := startDaemon(t, wire.DialectUnknown)
	cli, err := control.Dial(d.ControlEndpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	kv := &control.MemoryRegistration{Kind: control.KindKV, Buffers: []control.Region{kvRegion(cuda.Handle{1}, 0, 0)}}
	if _, err := cli.RegisterMemory(kv); err == nil || !strings.Contains(err.Error(), "does not") {
		t.Fatalf("register_memory of a GPU buffer on a host-only agent: %v", err)
	}
}

// TestPythonVRAMRegistration runs python/tests/test_vram.py's
// RegisterMemoryTest against this kvxferd: kvxfer.vram's buffer entries go
// through the Python control client, and kvxferd imports what they name (a
// handle the fake scheduler exported): it refuses a foreign handle and a
// wrong device at registration, then opens the handle once for four buffers.
// Skipped without a Python that has pyzmq and msgpack.
func TestPythonVRAMRegistration(t *testing.T) {
	py := os.Getenv("KVXFER_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if err := exec.Command(py, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skipf("no %s with zmq and msgpack (apt install python3-zmq python3-msgpack, or set KVXFER_PYTHON)", py)
	}
	g := cudafake.New(2)
	sp, kp := g.Process(), g.Process()
	d := startVRAMDaemon(t, kp)
	ptr, _ := sp.Alloc(0, 4*4096)
	h, _ := sp.IpcGet(0, ptr)
	cmd := exec.Command(py, "-m", "unittest", "-v", "tests.test_vram.RegisterMemoryTest")
	cmd.Dir = filepath.Join("..", "python")
	cmd.Env = append(os.Environ(), "KVXFER_CONTROL="+d.ControlEndpoint(), "KVXFER_IPC_HANDLE="+hex.EncodeToString(h[:]))
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("OK")) || bytes.Contains(out, []byte("skipped")) {
		t.Fatalf("python VRAM registration: %v\n%s", err, out)
	}
	if n := kp.OpenHandles(); n != 1 {
		t.Fatalf("kvxferd holds %d handles after Python registered four buffers of one allocation, want 1", n)
	}
	if n := kp.Calls("cuIpcOpenMemHandle"); n != 3 { // foreign, wrong device (opened, checked, closed), accepted
		t.Fatalf("cuIpcOpenMemHandle called %d times, want 3", n)
	}
}
