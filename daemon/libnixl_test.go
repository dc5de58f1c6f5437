package daemon

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/wire"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// newNixlAgent starts a real NIXL agent (UCX over transports every CPU-only box
// has) or skips the test when the library is not installed here.
func newNixlAgent(t *testing.T, name string) *libnixl.Agent {
	t.Helper()
	if _, err := libnixl.Find(""); err != nil {
		t.Skipf("NIXL not available (make deps-nixl): %v", err)
	}
	if _, ok := os.LookupEnv("UCX_TLS"); !ok {
		t.Setenv("UCX_TLS", "tcp,self,sm")
	}
	a, err := libnixl.New(fmt.Sprintf("%s-%d-%d", name, os.Getpid(), seq.Add(1)), libnixl.Options{})
	if err != nil {
		t.Skipf("NIXL could not start: %v", err)
	}
	return a
}

// TestDaemonOverRealNIXL runs kvxferd with the libnixl backend: the scheduler's
// shared-memory files are mapped and registered with NIXL, and a decode rank
// with its own NIXL agent (DRAM, UCX) receives a two-chunk room, checked by
// SGLang's completion rule and byte for byte.
func TestDaemonOverRealNIXL(t *testing.T) {
	newNixlAgent(t, "probe").Close()
	d := startDaemonWith(t, func(c *Config) {
		c.NewAgent = func(name string) (Agent, error) {
			a, err := libnixl.New(name, libnixl.Options{})
			if err != nil {
				return nil, err
			}
			return WithFileMapping(a), nil
		}
	})
	s := newScheduler(t, d)

	// Decode: a NIXL agent with SGLang-shaped DRAM.
	dag := newNixlAgent(t, "decode")
	t.Cleanup(func() { dag.Close() })
	sh := decodeShape(false)
	geo := sglang.Local{KV: sglang.Buffers{NumSlots: slots, Kind: nixl.DRAM}, Aux: sglang.Buffers{NumSlots: auxSlots, Kind: nixl.DRAM}}
	var kvBufs, aux [][]byte
	for range 2 * layers {
		b, err := dag.Alloc(slots * item)
		if err != nil {
			t.Fatal(err)
		}
		kvBufs = append(kvBufs, b)
		geo.KV.Ptrs = append(geo.KV.Ptrs, uint64(nixl.DescOf(b, 0).Addr))
		geo.KV.ItemLens = append(geo.KV.ItemLens, item)
	}
	for _, it := range sh.AuxItems {
		b, err := dag.Alloc(int(it) * auxSlots)
		if err != nil {
			t.Fatal(err)
		}
		aux = append(aux, b)
		geo.Aux.Ptrs = append(geo.Aux.Ptrs, uint64(nixl.DescOf(b, 0).Addr))
		geo.Aux.ItemLens = append(geo.Aux.ItemLens, it)
	}
	if _, err := sglang.RegisterBuffers(dag, &geo.KV, &geo.Aux); err != nil {
		t.Fatal(err)
	}
	md, err := dag.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	push, err := zmqio.DialPush(zmqio.PushConfig{Endpoint: zmqio.TCPEndpoint("127.0.0.1", d.PullPort())})
	if err != nil {
		t.Fatal(err)
	}
	defer push.Close()
	g := geo.AsPeer(dag.Name())
	reg := &wire.Registration{DecodeIP: "127.0.0.1", DecodePort: 1, AgentName: dag.Name(), AgentMetadata: md,
		KVDataPtrs: g.KVPtrs, AuxDataPtrs: g.AuxPtrs, DecodeTPSize: 1, DstKVItemLen: item, DstNumSlots: slots,
		HasDstNumSlots: true, KVItemLens: g.KVItemLens, HasLayerInfo: true, DCPSize: 1}
	for range g.KVPtrs {
		reg.KVMemKinds = append(reg.KVMemKinds, wire.MemDRAM)
	}
	const id = 77
	dst := []int32{9, 10, 11}
	ti := &wire.TransferInfo{Room: id, DecodeIP: "127.0.0.1", DecodePort: 1, AgentName: dag.Name(),
		DstKVIndices: dst, DstAuxIndex: 4, RequiredDstInfoNum: 1, HasDecodePrefixLen: true}
	for _, f := range [][][]byte{reg.Encode(), ti.Encode()} {
		if err := push.Send(f); err != nil {
			t.Fatal(err)
		}
	}
	src := []int32{1, 2, 3}
	for j, slot := range src {
		s.fill(id, int(slot), j)
	}
	s.writeAux(6, id)
	s.cli.Open(id, "")
	s.cli.Init(id, len(src), 6)
	s.cli.Send(id, src[:2], nil)
	s.cli.Send(id, src[2:], nil)
	if rep := s.waitTerminal(t, id); rep.Status != kv.StatusSuccess {
		t.Fatalf("room over real NIXL: %v/%v", rep.Status, rep.Reason)
	}
	checker := sglang.NewChecker()
	checker.Expect(id, 1, false)
	var got []string
	deadline := time.Now().Add(20 * time.Second)
	for !checker.Done(id) {
		ns, err := dag.Notifs(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			got = append(got, n.Msg)
			if _, err := checker.Feed(n.Msg); err != nil {
				t.Fatal(err)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("decode not done by SGLang's rule; notifications %q", got)
		}
		time.Sleep(time.Millisecond)
	}
	for j, p := range dst {
		for b := range 2 * layers {
			page := kvBufs[b][int(p)*item : (int(p)+1)*item]
			for k, v := range page {
				if want := kvmem.Pattern(id, b, j, k); v != want {
					t.Fatalf("decode buffer %d page %d byte %d = %d, want %d", b, p, k, v, want)
				}
			}
		}
	}
	if err := sglang.CheckAuxRoom(aux[len(aux)-1], sglang.AuxRoomItemLen, 4, id); err != nil {
		t.Fatal(err)
	}
	t.Logf("notifications: %q", got)
}
