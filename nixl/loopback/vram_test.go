package loopback_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/cuda"
	"github.com/kvxfer/kvxfer/nixl/cuda/cudafake"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/nixltest"
)

func newVRAM(t testing.TB, drv cuda.Driver) *loopback.VRAM {
	t.Helper()
	a, err := loopback.NewVRAM(fmt.Sprintf("vram-%d", agentSeq.Add(1)), loopback.Options{}, drv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return a
}

// TestVRAMConformanceHostMemory: in VRAM mode the host-memory path is the
// plain agent's, so the conformance suite holds unchanged.
func TestVRAMConformanceHostMemory(t *testing.T) {
	g := cudafake.New(1)
	nixltest.Run(t, func(t *testing.T) nixltest.Pair {
		p := pair(t)
		p.A, p.B = newVRAM(t, g.Process()), newVRAM(t, g.Process())
		p.Alloc = func(t testing.TB, ag nixl.Agent, n int) []byte {
			b, err := ag.(*loopback.VRAM).Alloc(n)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		inject := p.Inject
		p.Inject = func(ag nixl.Agent, peer string, f nixltest.Fault) { inject(ag.(*loopback.VRAM).Agent, peer, f) }
		return p
	})
}

// vramRig is three processes on one fake GPU host: the scheduler exports its
// KV, kvxferd (agent K) imports and registers it, the decode (agent D) has
// its own device buffer registered.
type vramRig struct {
	g             *cudafake.GPU
	sched, kp, dp *cudafake.Process
	k, d          *loopback.VRAM
	src           cuda.Import
	pat           []byte
	dst           uint64
	page          uint64
}

func newVRAMRig(t *testing.T, srcDev, dstDev int) *vramRig {
	const pages, page = 8, 4096
	r := &vramRig{g: cudafake.New(2), page: page}
	r.sched, r.kp, r.dp = r.g.Process(), r.g.Process(), r.g.Process()
	sp, err := r.sched.Alloc(srcDev, pages*page)
	if err != nil {
		t.Fatal(err)
	}
	r.pat = make([]byte, pages*page)
	for i := range r.pat {
		r.pat[i] = byte(i*11 + i>>12)
	}
	r.sched.CopyHtoD(srcDev, sp, r.pat)
	h, _ := r.sched.IpcGet(srcDev, sp)
	x, err := cuda.NewImporter(r.kp).Open(h[:], 0, pages*page, uint64(srcDev))
	if err != nil {
		t.Fatal(err)
	}
	r.src = *x
	r.k, r.d = newVRAM(t, r.kp), newVRAM(t, r.dp)
	if _, err := r.k.Register(nixl.VRAM, []nixl.Desc{{Addr: uintptr(x.Ptr), Len: pages * page, DevID: uint64(srcDev)}}); err != nil {
		t.Fatal(err)
	}
	if r.dst, err = r.dp.Alloc(dstDev, pages*page); err != nil {
		t.Fatal(err)
	}
	if _, err := r.d.Register(nixl.VRAM, []nixl.Desc{{Addr: uintptr(r.dst), Len: pages * page, DevID: uint64(dstDev)}}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *vramRig) pages(base uint64, dev uint64, n int) []nixl.Desc {
	ds := make([]nixl.Desc, n)
	for i := range ds {
		ds[i] = nixl.Desc{Addr: uintptr(base + uint64(i)*r.page), Len: r.page, DevID: dev}
	}
	return ds
}

func settleV(t *testing.T, a nixl.Agent, x nixl.XferID) nixl.Status {
	t.Helper()
	out := make([]nixl.Status, 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := a.Poll([]nixl.XferID{x}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].State.Terminal() {
			return out[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("request %d still %v", x, out[0].State)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestVRAMWriteLandsOnTheDecodeGPUThenNotifies(t *testing.T) {
	for _, c := range []struct {
		name     string
		src, dst int
		copyOp   string
	}{{"same device", 0, 0, "cuMemcpyDtoD"}, {"across devices", 0, 1, "cuMemcpyPeer"}} {
		t.Run(c.name, func(t *testing.T) {
			r := newVRAMRig(t, c.src, c.dst)
			md, err := r.d.LocalMetadata()
			if err != nil {
				t.Fatal(err)
			}
			peer, err := r.k.LoadPeer(md)
			if err != nil || peer != r.d.Name() {
				t.Fatalf("LoadPeer = %q, %v", peer, err)
			}
			if r.kp.OpenHandles() != 2 { // the scheduler's and the decode's
				t.Fatalf("kvxferd process holds %d handles, want 2", r.kp.OpenHandles())
			}
			ll, err := r.k.Prep("", nixl.VRAM, r.pages(r.src.Ptr, uint64(c.src), 8))
			if err != nil {
				t.Fatal(err)
			}
			rl, err := r.k.Prep(peer, nixl.VRAM, r.pages(r.dst, uint64(c.dst), 8))
			if err != nil {
				t.Fatal(err)
			}
			// Pages 1,2,3 -> decode slots 4,5,6 (one merged copy) and 7 -> 0.
			x, err := r.k.Make(nixl.Write, ll, []int32{1, 2, 3, 7}, rl, []int32{4, 5, 6, 0}, []byte("room-9"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.k.Post(x); err != nil {
				t.Fatal(err)
			}
			if st := settleV(t, r.k, x); st.State != nixl.Done {
				t.Fatalf("write ended %v: %v", st.State, st.Err)
			}
			// A notification reaches decode after the write ends for the
			// initiator, as NIXL's do: poll for it, with a deadline.
			var ns []nixl.Notif
			testrig.Until(10*time.Second, func() bool {
				got, _ := r.d.Notifs(nil)
				ns = append(ns, got...)
				return len(ns) > 0
			})
			if len(ns) != 1 || ns[0].Msg != "room-9" || ns[0].Peer != r.k.Name() {
				t.Fatalf("decode notifications %+v, want one room-9 from %s", ns, r.k.Name())
			}
			got := make([]byte, 8*r.page)
			if err := r.dp.CopyDtoH(c.dst, got, r.dst); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, 8*r.page)
			copy(want[4*r.page:7*r.page], r.pat[1*r.page:4*r.page])
			copy(want[0:r.page], r.pat[7*r.page:8*r.page])
			if !bytes.Equal(got, want) {
				t.Fatal("decode GPU bytes differ from the pages written (or bytes outside them changed)")
			}
			if n := r.kp.Calls(c.copyOp); n != 2 {
				t.Fatalf("%s called %d times, want 2 (pages 1-3 merged, page 7)", c.copyOp, n)
			}
			if err := r.k.Release(x); err != nil {
				t.Fatal(err)
			}
			if err := r.k.DropPeer(peer); err != nil {
				t.Fatal(err)
			}
			if r.kp.OpenHandles() != 1 {
				t.Fatalf("after DropPeer kvxferd holds %d handles, want 1 (the scheduler's)", r.kp.OpenHandles())
			}
			if _, err := r.k.Make(nixl.Write, ll, []int32{0}, rl, []int32{0}, nil); !errors.Is(err, nixl.ErrPeerUnknown) {
				t.Fatalf("Make on a dropped peer's list: %v, want ErrPeerUnknown", err)
			}
		})
	}
}

func TestVRAMLoadPeerRefusesWhatCannotOpen(t *testing.T) {
	t.Run("stale handle", func(t *testing.T) {
		r := newVRAMRig(t, 0, 0)
		md, _ := r.d.LocalMetadata()
		if err := r.dp.Free(0, r.dst); err != nil {
			t.Fatal(err)
		}
		if _, err := r.k.LoadPeer(md); err == nil || !strings.Contains(err.Error(), "stale") {
			t.Fatalf("LoadPeer of freed decode memory: %v, want a stale-handle refusal", err)
		}
		if r.kp.OpenHandles() != 1 {
			t.Fatalf("a refused LoadPeer left %d handles, want 1 (the scheduler's)", r.kp.OpenHandles())
		}
		if _, err := r.k.Prep(r.d.Name(), nixl.VRAM, r.pages(r.dst, 0, 1)); !errors.Is(err, nixl.ErrPeerUnknown) {
			t.Fatalf("the refused peer is usable: Prep = %v", err)
		}
	})
	t.Run("no GPU in kvxferd", func(t *testing.T) {
		r := newVRAMRig(t, 0, 0)
		md, _ := r.d.LocalMetadata()
		k := newVRAM(t, r.g.NoGPUProcess())
		if _, err := k.LoadPeer(md); err == nil || !strings.Contains(err.Error(), "no GPU access") {
			t.Fatalf("LoadPeer without GPU access: %v", err)
		}
	})
	t.Run("malformed", func(t *testing.T) {
		r := newVRAMRig(t, 0, 0)
		md, _ := r.d.LocalMetadata()
		if _, err := r.k.LoadPeer(md[:len(md)-1]); !errors.Is(err, nixl.ErrInvalid) {
			t.Fatalf("truncated VRAM metadata: %v", err)
		}
	})
}

func TestVRAMRegisterRefusesWrongDeviceAndHostMemory(t *testing.T) {
	g := cudafake.New(2)
	p := g.Process()
	a := newVRAM(t, p)
	ptr, _ := p.Alloc(0, 4096)
	if _, err := a.Register(nixl.VRAM, []nixl.Desc{{Addr: uintptr(ptr), Len: 4096, DevID: 1}}); err == nil || !strings.Contains(err.Error(), "wrong device") {
		t.Fatalf("GPU 0 memory registered as GPU 1: %v", err)
	}
	if _, err := a.Register(nixl.VRAM, []nixl.Desc{{Addr: uintptr(ptr), Len: 8192, DevID: 0}}); err == nil || !strings.Contains(err.Error(), "past its allocation") {
		t.Fatalf("a range past the allocation: %v", err)
	}
	host := make([]byte, 64)
	if _, err := a.Register(nixl.VRAM, []nixl.Desc{nixl.DescOf(host, 0)}); err == nil || !strings.Contains(err.Error(), "not device memory") {
		t.Fatalf("Go heap memory registered as VRAM: %v", err)
	}
	// VRAM-labelled loopback shared memory stays the plain agent's.
	b, err := a.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Register(nixl.VRAM, []nixl.Desc{nixl.DescOf(b, 0)}); err != nil {
		t.Fatalf("VRAM-labelled shared memory: %v", err)
	}
	if md, _ := a.LocalMetadata(); bytes.HasPrefix(md, []byte("KVXVRAM")) {
		t.Fatal("an agent without device regions sent VRAM metadata")
	}
}

func TestVRAMCopyFailureFailsTheRequestWithoutNotifying(t *testing.T) {
	r := newVRAMRig(t, 0, 0)
	md, _ := r.d.LocalMetadata()
	peer, err := r.k.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	r.kp.FailNext("cuMemcpyDtoD", cuda.ErrIllegalAddress)
	x, err := r.k.Create(nixl.Write, nixl.VRAM, r.pages(r.src.Ptr, 0, 1), peer, nixl.VRAM, r.pages(r.dst, 0, 1), []byte("n"))
	if err != nil {
		t.Fatal(err)
	}
	r.k.Post(x)
	st := settleV(t, r.k, x)
	if st.State != nixl.Failed || !errors.Is(st.Err, nixl.ErrBackend) || !strings.Contains(st.Err.Error(), "CUDA_ERROR_ILLEGAL_ADDRESS") {
		t.Fatalf("failed copy ended %v: %v", st.State, st.Err)
	}
	if ns, _ := r.d.Notifs(nil); len(ns) != 0 {
		t.Fatalf("a failed copy notified: %+v", ns)
	}
	// Re-posting after the failure moves the bytes.
	if _, err := r.k.Post(x); err != nil {
		t.Fatal(err)
	}
	if st := settleV(t, r.k, x); st.State != nixl.Done {
		t.Fatalf("re-post: %v %v", st.State, st.Err)
	}
	got := make([]byte, r.page)
	r.dp.CopyDtoH(0, got, r.dst)
	if !bytes.Equal(got, r.pat[:r.page]) {
		t.Fatal("re-posted bytes differ")
	}
}

func TestVRAMMixedListsRefusedAndHostTransfersStillWork(t *testing.T) {
	r := newVRAMRig(t, 0, 0)
	hb, err := r.d.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.d.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(hb, 0)}); err != nil {
		t.Fatal(err)
	}
	kb, _ := r.k.Alloc(4096)
	copy(kb, "host bytes")
	if _, err := r.k.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(kb, 0)}); err != nil {
		t.Fatal(err)
	}
	md, _ := r.d.LocalMetadata()
	peer, err := r.k.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	vl, _ := r.k.Prep("", nixl.VRAM, r.pages(r.src.Ptr, 0, 1))
	hl, err := r.k.Prep(peer, nixl.DRAM, []nixl.Desc{nixl.DescOf(hb[:r.page], 0)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.k.Make(nixl.Write, vl, []int32{0}, hl, []int32{0}, nil); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("device -> host list: %v, want ErrInvalid", err)
	}
	hx, err := r.k.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(kb[:10], 0)}, peer, nixl.DRAM, []nixl.Desc{nixl.DescOf(hb[:10], 0)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	vx, err := r.k.Create(nixl.Write, nixl.VRAM, r.pages(r.src.Ptr, 0, 1), peer, nixl.VRAM, r.pages(r.dst, 0, 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.k.Post(hx)
	r.k.Post(vx)
	out := make([]nixl.Status, 2)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := r.k.Poll([]nixl.XferID{hx, vx}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].State.Terminal() && out[1].State.Terminal() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mixed poll never settled: %+v", out)
		}
		time.Sleep(time.Millisecond)
	}
	if out[0].State != nixl.Done || out[1].State != nixl.Done {
		t.Fatalf("host and device requests ended %+v", out)
	}
	if string(hb[:10]) != "host bytes" {
		t.Fatalf("host transfer wrote %q", hb[:10])
	}
}

// TestVRAMDeviceWriteWakesPollers: a device request that ends wakes the
// agent's OnProgress pollers (nixl.Waker), after its state changed, as host
// requests do; a poller parked on the wake-up (the transfer pool in kvxferd)
// would otherwise never see it end.
func TestVRAMDeviceWriteWakesPollers(t *testing.T) {
	r := newVRAMRig(t, 0, 0)
	woken := make(chan struct{}, 1)
	stop := r.k.OnProgress(func() {
		select {
		case woken <- struct{}{}:
		default:
		}
	})
	defer stop()
	md, err := r.d.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	peer, err := r.k.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	ll, err := r.k.Prep("", nixl.VRAM, r.pages(r.src.Ptr, 0, 8))
	if err != nil {
		t.Fatal(err)
	}
	rl, err := r.k.Prep(peer, nixl.VRAM, r.pages(r.dst, 0, 8))
	if err != nil {
		t.Fatal(err)
	}
	x, err := r.k.Make(nixl.Write, ll, []int32{1}, rl, []int32{2}, []byte("room-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.k.Post(x); err != nil {
		t.Fatal(err)
	}
	out := make([]nixl.Status, 1)
	for {
		select {
		case <-woken:
		case <-time.After(30 * time.Second):
			t.Fatal("no wake-up after the device write was posted")
		}
		if err := r.k.Poll([]nixl.XferID{x}, out); err != nil {
			t.Fatal(err)
		}
		if out[0].State.Terminal() {
			break
		}
	}
	if out[0].State != nixl.Done {
		t.Fatalf("device write ended %v: %v", out[0].State, out[0].Err)
	}
}
