package control

import (
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
)

// TestRegionSources: a region names its memory in exactly one way, and a
// memfd number is a plain descriptor number.
func TestRegionSources(t *testing.T) {
	ipc := make([]byte, CUDAIPCHandleSize)
	base := Region{Length: 4096, ItemLen: 64, Mem: nixl.DRAM}
	with := func(f func(*Region)) Region { r := base; f(&r); return r }
	cases := []struct {
		name string
		r    Region
		want string // "" accepted
	}{
		{"shm", with(func(r *Region) { r.Shm = "/dev/shm/kv" }), ""},
		{"memfd", with(func(r *Region) { r.Memfd = 7 }), ""},
		{"cuda_ipc", with(func(r *Region) { r.CUDAIPC, r.Mem = ipc, nixl.VRAM }), ""},
		{"none", base, "exactly one"},
		{"shm and memfd", with(func(r *Region) { r.Shm, r.Memfd = "kv", 7 }), "exactly one"},
		{"memfd and cuda_ipc", with(func(r *Region) { r.Memfd, r.CUDAIPC, r.Mem = 7, ipc, nixl.VRAM }), "exactly one"},
		{"negative memfd", with(func(r *Region) { r.Memfd = -1 }), "out of range"},
		{"huge memfd", with(func(r *Region) { r.Memfd = 1 << 40 }), "out of range"},
	}
	for _, c := range cases {
		m := &MemoryRegistration{Kind: KindKV, Buffers: []Region{c.r}}
		err := m.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestMemfdRegionRoundTrip: what the Go client encodes, the server decodes.
func TestMemfdRegionRoundTrip(t *testing.T) {
	in := &MemoryRegistration{Kind: KindKV, Buffers: []Region{
		{Memfd: 9, Offset: 8192, Length: 4096, ItemLen: 512, Mem: nixl.DRAM},
		{Shm: "/dev/shm/x", Length: 4096, ItemLen: 512, Mem: nixl.DRAM},
	}}
	b := appendMapHeader(nil, 4)
	b = appendMemory(b, in)
	r := &reader{b: b}
	n, err := r.readMapHeader()
	if err != nil || n != 4 {
		t.Fatalf("header %d %v", n, err)
	}
	var out MemoryRegistration
	for range n {
		key, err := r.readStr()
		if err != nil {
			t.Fatal(err)
		}
		if err := out.field(r, key); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
	}
	if len(out.Buffers) != 2 || out.Buffers[0].Memfd != 9 || out.Buffers[0].Offset != 8192 || out.Buffers[0].Shm != "" ||
		out.Buffers[1].Memfd != 0 || out.Buffers[1].Shm != "/dev/shm/x" {
		t.Fatalf("decoded %+v", out.Buffers)
	}
}
