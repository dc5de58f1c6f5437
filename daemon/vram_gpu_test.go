package daemon

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/cuda"
	"github.com/kvxfer/kvxfer/nixl/cuda/cudafake"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// The GPU check (scripts/gpu-check.sh; docs/vram.md). Three processes on one
// NVIDIA machine: this test is kvxferd; a "scheduler" child allocates its KV
// on the GPU, fills it, exports it by CUDA IPC and registers it over the
// control API, then drives rooms; a "decode" child allocates its own GPU KV,
// registers it with its NIXL agent (KVXFER_GPU_BACKEND: loopback VRAM mode,
// or nixl, the real library), sends SGLang's registration and transfer
// infos, waits for every room's notification and checks every byte of its
// GPU memory with device-to-host copies. Needs KVXFER_GPU=1; skips otherwise.

// gpuShape is the KV geometry of the check (env overrides for quick runs).
type gpuShape struct {
	Layers, Item, Pages, Rooms int
}

func (s gpuShape) bufs() int         { return 2 * s.Layers }
func (s gpuShape) srcBufLen() uint64 { return uint64(s.Pages * s.Item) }
func (s gpuShape) dstSlots() int     { return s.Pages * s.Rooms }
func (s gpuShape) dstBufLen() uint64 { return uint64(s.dstSlots() * s.Item) }
func (s gpuShape) roomBytes() uint64 { return uint64(s.bufs() * s.Pages * s.Item) }
func gpuRoomID(r int) uint64         { return uint64(7000 + r) }
func gpuAuxItems() []uint64          { return kvmem.DefaultShape().AuxItems }
func (s gpuShape) auxSlots() int     { return max(s.Rooms, 1) }
func (s gpuShape) String() string {
	return fmt.Sprintf("%d layers (K+V), %d-byte pages, %d pages/room, %d rooms", s.Layers, s.Item, s.Pages, s.Rooms)
}
func (s gpuShape) srcAddr(base uint64, b int) uint64 { return base + uint64(b)*s.srcBufLen() }
func (s gpuShape) dstAddr(base uint64, b int) uint64 { return base + uint64(b)*s.dstBufLen() }

func envOr(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func shapeFromEnv() gpuShape {
	return gpuShape{Layers: envOr("KVXFER_GPU_LAYERS", 16), Item: envOr("KVXFER_GPU_ITEM", 64<<10),
		Pages: envOr("KVXFER_GPU_PAGES", 64), Rooms: envOr("KVXFER_GPU_ROOMS", 16)}
}

func needGPU(t *testing.T) cuda.Driver {
	t.Helper()
	if os.Getenv("KVXFER_GPU") != "1" {
		t.Skip("needs an NVIDIA GPU: set KVXFER_GPU=1 on a GPU machine (scripts/gpu-check.sh)")
	}
	d, err := cuda.Open("")
	if err != nil {
		t.Fatalf("KVXFER_GPU=1 but the CUDA driver does not load: %v", err)
	}
	return d
}

// gpuChild is one role: a process (this test binary, TestGPURole) on the
// GPU, a goroutine on cudafake (TestGPUCheckOnFake).
type gpuChild struct {
	in    io.WriteCloser
	lines chan string
}

func (c *gpuChild) scan(role string, out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fmt.Fprintf(os.Stderr, "[%s] %s\n", role, sc.Text())
		c.lines <- sc.Text()
	}
	close(c.lines)
}

// goGPURole runs a role body on a goroutine, wired like a process.
func goGPURole(t *testing.T, role string, body func(in io.Reader, out io.Writer) error) *gpuChild {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &gpuChild{in: inW, lines: make(chan string, 64)}
	go c.scan(role, outR)
	go func() {
		err := body(inR, outW)
		if err != nil {
			fmt.Fprintf(outW, "ERROR %v\n", err)
		}
		outW.Close()
	}()
	t.Cleanup(func() { inW.Close() })
	return c
}

func startGPURole(t *testing.T, role string, env ...string) *gpuChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestGPURole$", "-test.v")
	cmd.Env = append(append(os.Environ(), "KVXFER_GPU_ROLE="+role), env...)
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &gpuChild{in: in, lines: make(chan string, 64)}
	go c.scan(role, out)
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	return c
}

// expect waits for a line starting with prefix and returns the rest.
func (c *gpuChild) expect(t *testing.T, prefix string, limit time.Duration) string {
	t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before %q", prefix)
			}
			if strings.HasPrefix(l, "ERROR ") {
				t.Fatalf("waiting for %q: %s", prefix, l)
			}
			if strings.HasPrefix(l, prefix) {
				return strings.TrimSpace(strings.TrimPrefix(l, prefix))
			}
		case <-deadline:
			t.Fatalf("no %q within %v", prefix, limit)
		}
	}
}

type gpuSchedResult struct {
	Rooms      int       `json:"rooms"`
	RoomBytes  uint64    `json:"room_bytes"`
	Failed     []string  `json:"failed"`
	SendToDone []float64 `json:"send_to_done_ms"`
}

type gpuDecodeResult struct {
	Verified   uint64 `json:"verified_bytes"`
	Mismatches uint64 `json:"mismatches"`
	First      string `json:"first_mismatch,omitempty"`
}

func TestGPUEndToEnd(t *testing.T) {
	if os.Getenv("KVXFER_GPU_ROLE") != "" {
		t.Skip("a role process runs TestGPURole only")
	}
	drv := needGPU(t)
	sh := shapeFromEnv()
	backend := os.Getenv("KVXFER_GPU_BACKEND")
	if backend == "" {
		backend = "loopback"
	}
	d := startDaemonWith(t, func(c *Config) {
		c.NewAgent = func(name string) (Agent, error) { return gpuAgent(drv, backend, name, true) }
	})
	summary := runGPUCheck(t, d, sh, backend,
		func() *gpuChild { return startGPURole(t, "scheduler", "KVXFER_CONTROL="+d.ControlEndpoint()) },
		func() *gpuChild {
			return startGPURole(t, "decode", "KVXFER_PULL_PORT="+strconv.Itoa(d.PullPort()), "KVXFER_GPU_BACKEND="+backend)
		})
	if p := os.Getenv("KVXFER_GPU_OUT"); p != "" {
		if f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(f, summary)
			f.Close()
		}
	}
}

// TestGPUCheckOnFake runs the GPU check's three roles on cudafake (as
// goroutines with their own fake address spaces), so that the check itself
// is known to work before it spends GPU time. It proves the orchestration
// and the byte check, not CUDA.
func TestGPUCheckOnFake(t *testing.T) {
	if os.Getenv("KVXFER_GPU_ROLE") != "" {
		t.Skip("a role process runs TestGPURole only")
	}
	g := cudafake.New(1)
	kp, sp, dp := g.Process(), g.Process(), g.Process()
	sh := gpuShape{Layers: 2, Item: 4096, Pages: 4, Rooms: 3}
	d := startDaemonWith(t, func(c *Config) {
		c.NewAgent = func(name string) (Agent, error) { return gpuAgent(kp, "loopback", name, true) }
	})
	runGPUCheck(t, d, sh, "loopback",
		func() *gpuChild {
			return goGPURole(t, "scheduler", func(in io.Reader, out io.Writer) error {
				return gpuSchedulerRun(sp, sh, d.ControlEndpoint(), t.TempDir(), in, out)
			})
		},
		func() *gpuChild {
			return goGPURole(t, "decode", func(in io.Reader, out io.Writer) error {
				return gpuDecodeRun(dp, sh, "loopback", d.PullPort(), out)
			})
		})
}

// runGPUCheck drives the roles and checks their results; it returns the
// summary line (bytes verified, throughput).
func runGPUCheck(t *testing.T, d *Daemon, sh gpuShape, backend string, sched, dec func() *gpuChild) string {
	t.Helper()
	s := sched()
	s.expect(t, "LIVE", time.Minute)
	if !d.Live() {
		t.Fatal("the scheduler registered its GPU KV and aux, but kvxferd is not live")
	}
	c := dec()
	c.expect(t, "READY", time.Minute)
	fmt.Fprintln(s.in, "GO")
	var sr gpuSchedResult
	if err := json.Unmarshal([]byte(s.expect(t, "RESULT", 5*time.Minute)), &sr); err != nil {
		t.Fatal(err)
	}
	var dr gpuDecodeResult
	if err := json.Unmarshal([]byte(c.expect(t, "RESULT", 5*time.Minute)), &dr); err != nil {
		t.Fatal(err)
	}
	if len(sr.Failed) > 0 {
		t.Fatalf("rooms failed: %v", sr.Failed)
	}
	if want := uint64(sh.Rooms) * sh.roomBytes(); dr.Verified != want || dr.Mismatches != 0 {
		t.Fatalf("decode verified %d of %d bytes, %d mismatches (first: %s)", dr.Verified, want, dr.Mismatches, dr.First)
	}
	ms := slices.Clone(sr.SendToDone)
	slices.Sort(ms)
	med := ms[len(ms)/2]
	summary := fmt.Sprintf("kvxferd %s backend, GPU->GPU by CUDA IPC: %s; %d bytes verified on the decode GPU (device-to-host copy), 0 mismatches; per room (send -> Success, %.1f MiB): median %.3f ms = %.2f GB/s, min %.3f ms, max %.3f ms",
		backend, sh, dr.Verified, float64(sr.RoomBytes)/(1<<20), med, float64(sr.RoomBytes)/(med/1e3)/1e9, ms[0], ms[len(ms)-1])
	t.Log(summary)
	return summary
}

// gpuAgent is the NIXL agent of kvxferd (withIPC) or of the decode.
func gpuAgent(drv cuda.Driver, backend, name string, withIPC bool) (Agent, error) {
	switch backend {
	case "loopback":
		a, err := loopback.NewVRAM(name, loopback.Options{}, drv)
		if err != nil {
			return nil, err
		}
		if withIPC {
			return WithCUDAIPC(a, drv), nil
		}
		return a, nil
	case "nixl":
		a, err := libnixl.New(name, libnixl.Options{})
		if err != nil {
			return nil, err
		}
		if withIPC {
			return WithCUDAIPC(WithFileMapping(a), drv), nil
		}
		return WithFileMapping(a), nil
	}
	return nil, fmt.Errorf("KVXFER_GPU_BACKEND %q: want loopback or nixl", backend)
}

// TestGPURole is the body of a role process.
func TestGPURole(t *testing.T) {
	var err error
	switch os.Getenv("KVXFER_GPU_ROLE") {
	case "scheduler":
		err = gpuSchedulerRun(needGPU(t), shapeFromEnv(), os.Getenv("KVXFER_CONTROL"), t.TempDir(), os.Stdin, os.Stdout)
	case "decode":
		port, _ := strconv.Atoi(os.Getenv("KVXFER_PULL_PORT"))
		err = gpuDecodeRun(needGPU(t), shapeFromEnv(), os.Getenv("KVXFER_GPU_BACKEND"), port, os.Stdout)
	default:
		t.Skip("a role process of TestGPUEndToEnd")
	}
	if err != nil {
		fmt.Printf("ERROR %v\n", err)
		t.Fatal(err)
	}
}

// fillRoom writes room id's pages (the pattern of page j) into the
// scheduler's source slots 0..Pages-1 of every buffer.
func fillRoom(drv cuda.Driver, sh gpuShape, base uint64, id uint64) error {
	host := make([]byte, sh.srcBufLen())
	for b := range sh.bufs() {
		for j := range sh.Pages {
			page := host[j*sh.Item : (j+1)*sh.Item]
			for k := range page {
				page[k] = kvmem.Pattern(id, b, j, k)
			}
		}
		if err := drv.CopyHtoD(0, sh.srcAddr(base, b), host); err != nil {
			return err
		}
	}
	return nil
}

func gpuSchedulerRun(drv cuda.Driver, sh gpuShape, endpoint, dir string, in io.Reader, out io.Writer) error {
	base, err := drv.Alloc(0, uint64(sh.bufs())*sh.srcBufLen())
	if err != nil {
		return err
	}
	h, err := drv.IpcGet(0, base)
	if err != nil {
		return fmt.Errorf("cuIpcGetMemHandle on the scheduler's KV: %w", err)
	}
	cli, err := control.Dial(endpoint)
	if err != nil {
		return err
	}
	defer cli.Close()
	kvReg := &control.MemoryRegistration{Kind: control.KindKV}
	for b := range sh.bufs() {
		kvReg.Buffers = append(kvReg.Buffers, control.Region{CUDAIPC: h[:], Offset: uint64(b) * sh.srcBufLen(), Length: sh.srcBufLen(),
			ItemLen: uint64(sh.Item), Mem: nixl.VRAM, Dev: 0})
	}
	if _, err := cli.RegisterMemory(kvReg); err != nil {
		return fmt.Errorf("register_memory of the GPU KV: %w", err)
	}
	auxPath := filepath.Join(dir, "aux")
	auxLen := 0
	for _, it := range gpuAuxItems() {
		auxLen += int(it) * sh.auxSlots()
	}
	if err := os.WriteFile(auxPath, make([]byte, auxLen), 0o600); err != nil {
		return err
	}
	aux := &control.MemoryRegistration{Kind: control.KindAux}
	off := uint64(0)
	for _, it := range gpuAuxItems() {
		aux.Buffers = append(aux.Buffers, control.Region{Shm: auxPath, Offset: off, Length: it * uint64(sh.auxSlots()), ItemLen: it, Mem: nixl.DRAM})
		off += it * uint64(sh.auxSlots())
	}
	if _, err := cli.RegisterMemory(aux); err != nil {
		return err
	}
	fmt.Fprintln(out, "LIVE")
	if l, _ := bufio.NewReader(in).ReadString('\n'); strings.TrimSpace(l) != "GO" {
		return fmt.Errorf("parent said %q, want GO", l)
	}
	res := gpuSchedResult{Rooms: sh.Rooms, RoomBytes: sh.roomBytes()}
	pages := make([]int32, sh.Pages)
	for j := range pages {
		pages[j] = int32(j)
	}
	reps := make([]kv.Reply, 0, 1)
	for r := range sh.Rooms {
		id := gpuRoomID(r)
		if err := fillRoom(drv, sh, base, id); err != nil {
			return err
		}
		if _, err := cli.Open(id, ""); err != nil {
			return err
		}
		if err := cli.Init(id, sh.Pages, r%sh.auxSlots()); err != nil {
			return err
		}
		t0 := time.Now()
		if err := cli.Send(id, pages, nil); err != nil {
			return err
		}
		deadline := t0.Add(time.Minute)
		for {
			if reps, err = cli.Poll([]uint64{id}, reps[:0]); err != nil {
				return err
			}
			if reps[0].Status.Terminal() {
				if reps[0].Status != kv.StatusSuccess {
					res.Failed = append(res.Failed, fmt.Sprintf("%d: %v/%v", id, reps[0].Status, reps[0].Reason))
				}
				break
			}
			if time.Now().After(deadline) {
				res.Failed = append(res.Failed, fmt.Sprintf("%d: still %v after a minute", id, reps[0].Status))
				break
			}
		}
		res.SendToDone = append(res.SendToDone, float64(time.Since(t0).Nanoseconds())/1e6)
		cli.Clear(id)
	}
	b, _ := json.Marshal(res)
	fmt.Fprintf(out, "RESULT %s\n", b)
	return nil
}

func gpuDecodeRun(drv cuda.Driver, sh gpuShape, backend string, pullPort int, out io.Writer) error {
	ag, err := gpuAgent(drv, backend, fmt.Sprintf("gpu-decode-%d-%d", os.Getpid(), seq.Add(1)), false)
	if err != nil {
		return err
	}
	defer ag.Close()
	total := uint64(sh.bufs()) * sh.dstBufLen()
	base, err := drv.Alloc(0, total)
	if err != nil {
		return err
	}
	defer drv.Free(0, base)
	if err := drv.Memset(0, base, 0, total); err != nil {
		return err
	}
	if _, err := ag.Register(nixl.VRAM, []nixl.Desc{{Addr: uintptr(base), Len: total, DevID: 0}}); err != nil {
		return fmt.Errorf("registering the decode's GPU KV with NIXL: %w", err)
	}
	reg := &wire.Registration{DecodeIP: "127.0.0.1", AgentName: ag.Name(), GPUID: 0, DecodeTPSize: 1, DstKVItemLen: sh.Item,
		DstNumSlots: sh.dstSlots(), HasDstNumSlots: true, HasLayerInfo: true, DCPSize: 1}
	for b := range sh.bufs() {
		reg.KVDataPtrs = append(reg.KVDataPtrs, sh.dstAddr(base, b))
		reg.KVItemLens = append(reg.KVItemLens, uint64(sh.Item))
		reg.KVMemKinds = append(reg.KVMemKinds, wire.MemVRAM)
	}
	for _, it := range gpuAuxItems() {
		n := int(it) * sh.auxSlots()
		var buf []byte
		if la, ok := ag.(*loopback.VRAM); ok {
			buf, err = la.Alloc(n)
		} else {
			buf, err = syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANONYMOUS)
		}
		if err != nil {
			return err
		}
		if _, err := ag.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(buf, 0)}); err != nil {
			return err
		}
		reg.AuxDataPtrs = append(reg.AuxDataPtrs, uint64(nixl.DescOf(buf, 0).Addr))
	}
	if reg.AgentMetadata, err = ag.LocalMetadata(); err != nil {
		return err
	}
	pull, err := zmqio.StartPull(zmqio.IngestConfig{Host: "127.0.0.1"}, func([][]byte) {})
	if err != nil {
		return err
	}
	defer pull.Stop()
	reg.DecodePort = pull.Port()
	push, err := zmqio.DialPush(zmqio.PushConfig{Endpoint: zmqio.TCPEndpoint("127.0.0.1", pullPort)})
	if err != nil {
		return err
	}
	defer push.Close()
	if err := push.Send(reg.Encode()); err != nil {
		return err
	}
	checker := sglang.NewChecker()
	for r := range sh.Rooms {
		dst := make([]int32, sh.Pages)
		for j := range dst {
			dst[j] = int32(r*sh.Pages + j)
		}
		checker.Expect(gpuRoomID(r), 1, false)
		ti := &wire.TransferInfo{Room: gpuRoomID(r), DecodeIP: "127.0.0.1", DecodePort: pull.Port(), AgentName: ag.Name(),
			DstKVIndices: dst, DstAuxIndex: r % sh.auxSlots(), RequiredDstInfoNum: 1, HasDecodePrefixLen: true}
		if err := push.Send(ti.Encode()); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "READY")
	deadline := time.Now().Add(4 * time.Minute)
	for r := 0; r < sh.Rooms; {
		if checker.Done(gpuRoomID(r)) {
			r++
			continue
		}
		ns, err := ag.Notifs(nil)
		if err != nil {
			return err
		}
		for _, n := range ns {
			if _, err := checker.Feed(n.Msg); err != nil {
				return fmt.Errorf("notification %q: %w", n.Msg, err)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("room %d never completed at the decode: %+v", gpuRoomID(r), checker.Status(gpuRoomID(r)))
		}
		if len(ns) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	// Every byte of every layer buffer, read back from the GPU: each room's
	// pages hold its pattern; nothing else was written.
	var res gpuDecodeResult
	host := make([]byte, sh.dstBufLen())
	for b := range sh.bufs() {
		if err := drv.CopyDtoH(0, host, sh.dstAddr(base, b)); err != nil {
			return err
		}
		for slot := range sh.dstSlots() {
			r, j := slot/sh.Pages, slot%sh.Pages
			page := host[slot*sh.Item : (slot+1)*sh.Item]
			for k, v := range page {
				if want := kvmem.Pattern(gpuRoomID(r), b, j, k); v != want {
					if res.Mismatches == 0 {
						res.First = fmt.Sprintf("buffer %d slot %d byte %d: %d, want %d", b, slot, k, v, want)
					}
					res.Mismatches++
				}
			}
			res.Verified += uint64(len(page))
		}
	}
	b, _ := json.Marshal(res)
	fmt.Fprintf(out, "RESULT %s\n", b)
	return nil
}
