package cuda_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/nixl/cuda"
	"github.com/kvxfer/kvxfer/nixl/cuda/cudafake"
)

// exported allocates n bytes on dev in the exporter, fills them with a
// pattern and returns the pointer, the handle and the pattern.
func exported(t *testing.T, exp *cudafake.Process, dev int, n uint64, seed byte) (uint64, []byte, []byte) {
	t.Helper()
	p, err := exp.Alloc(dev, n)
	if err != nil {
		t.Fatal(err)
	}
	pat := make([]byte, n)
	for i := range pat {
		pat[i] = seed + byte(i*7)
	}
	if err := exp.CopyHtoD(dev, p, pat); err != nil {
		t.Fatal(err)
	}
	h, err := exp.IpcGet(dev, p)
	if err != nil {
		t.Fatal(err)
	}
	return p, h[:], pat
}

func TestImporterOpensEachHandleOnceAndClosesWithTheLastRange(t *testing.T) {
	g := cudafake.New(2)
	exp, imp := g.Process(), g.Process()
	_, h, pat := exported(t, exp, 1, 8192, 3)
	im := cuda.NewImporter(imp)
	a, err := im.Open(h, 0, 4096, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := im.Open(h, 4096, 4096, 1)
	if err != nil {
		t.Fatal(err)
	}
	if a.Base != b.Base || a.Ptr != a.Base || b.Ptr != a.Base+4096 || a.Dev != 1 {
		t.Fatalf("imports %+v and %+v: want one base, Ptr = Base + Offset, device 1", a, b)
	}
	if got := imp.Calls("cuIpcOpenMemHandle"); got != 1 {
		t.Fatalf("cuIpcOpenMemHandle called %d times for one handle, want 1", got)
	}
	got := make([]byte, 4096)
	if err := imp.CopyDtoH(1, got, b.Ptr); err != nil || !bytes.Equal(got, pat[4096:]) {
		t.Fatalf("the second range does not read the exporter's bytes at offset 4096 (err %v)", err)
	}
	if err := im.Close(a); err != nil {
		t.Fatal(err)
	}
	if im.Handles() != 1 || imp.OpenHandles() != 1 {
		t.Fatalf("after closing one of two ranges: %d handles (driver %d), want 1", im.Handles(), imp.OpenHandles())
	}
	if err := im.Close(a); err != nil || im.Handles() != 1 {
		t.Fatalf("closing a range twice: %v, %d handles", err, im.Handles())
	}
	if err := im.Close(b); err != nil {
		t.Fatal(err)
	}
	if im.Handles() != 0 || imp.OpenHandles() != 0 || imp.Calls("cuIpcCloseMemHandle") != 1 {
		t.Fatalf("after the last range: %d handles, driver %d open, %d closes; want 0, 0, 1",
			im.Handles(), imp.OpenHandles(), imp.Calls("cuIpcCloseMemHandle"))
	}
}

func TestImporterRefusesAtOpen(t *testing.T) {
	type setup struct {
		g        *cudafake.GPU
		exp, imp *cudafake.Process
		h        []byte
	}
	cases := []struct {
		name   string
		prep   func(s *setup) *cudafake.Process // the importing process
		handle func(s *setup) []byte
		off    uint64
		n      uint64
		dev    uint64
		want   string
	}{
		{name: "short handle", handle: func(s *setup) []byte { return s.h[:63] }, n: 64, want: "64 bytes, got 63"},
		{name: "empty range", n: 0, want: "empty"},
		{name: "no GPU", prep: func(s *setup) *cudafake.Process { return s.g.NoGPUProcess() }, n: 64, want: "no GPU access"},
		{name: "device not visible", n: 64, dev: 2, want: "sees 2 GPU(s)"},
		{name: "stale handle", handle: func(s *setup) []byte {
			p, err := s.exp.Alloc(0, 4096)
			if err != nil {
				panic(err)
			}
			h, _ := s.exp.IpcGet(0, p)
			s.exp.Free(0, p)
			return h[:]
		}, n: 64, want: "stale or foreign"},
		{name: "foreign bytes", handle: func(s *setup) []byte { return bytes.Repeat([]byte{9}, 64) }, n: 64, want: "stale or foreign"},
		{name: "wrong device", n: 64, dev: 1, want: "wrong device: this IPC handle's memory is on GPU 0, the registration says GPU 1"},
		{name: "no peer access", prep: func(s *setup) *cudafake.Process { s.g.NoPeerAccess(); return s.imp }, n: 64, dev: 1, want: "no peer access"},
		{name: "past the end", off: 4000, n: 200, want: "past the end of the exported allocation (4096 bytes)"},
		{name: "exporter itself", prep: func(s *setup) *cudafake.Process { return s.exp }, n: 64, want: "exported by this same process"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := cudafake.New(2)
			s := &setup{g: g, exp: g.Process(), imp: g.Process()}
			_, s.h, _ = exported(t, s.exp, 0, 4096, 1)
			imp := s.imp
			if c.prep != nil {
				imp = c.prep(s)
			}
			h := s.h
			if c.handle != nil {
				h = c.handle(s)
			}
			im := cuda.NewImporter(imp)
			x, err := im.Open(h, c.off, c.n, c.dev)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open = %+v, %v; want an error containing %q", x, err, c.want)
			}
			if c.name == "no GPU" && !errors.Is(err, cuda.ErrNoGPU) {
				t.Fatalf("a process without GPU access: %v does not wrap ErrNoGPU", err)
			}
			if im.Handles() != 0 || imp.OpenHandles() != 0 {
				t.Fatalf("a refused Open left %d handles open (driver: %d)", im.Handles(), imp.OpenHandles())
			}
		})
	}
}

func TestImporterRefusesAHandleClaimedOnTwoDevices(t *testing.T) {
	g := cudafake.New(2)
	exp, imp := g.Process(), g.Process()
	_, h, _ := exported(t, exp, 0, 4096, 1)
	im := cuda.NewImporter(imp)
	x, err := im.Open(h, 0, 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := im.Open(h, 64, 64, 1); err == nil || !strings.Contains(err.Error(), "wrong device") {
		t.Fatalf("the same handle on another device: %v, want wrong device", err)
	}
	if _, err := im.Open(h, 4000, 200, 0); err == nil {
		t.Fatal("a range past the end of an already open handle was accepted")
	}
	if im.Handles() != 1 {
		t.Fatalf("refusals closed or leaked the open handle: %d open", im.Handles())
	}
	im.Close(x)
	if imp.OpenHandles() != 0 {
		t.Fatalf("%d handles open after the last close", imp.OpenHandles())
	}
}

func TestImporterCloseAll(t *testing.T) {
	g := cudafake.New(1)
	exp, imp := g.Process(), g.Process()
	im := cuda.NewImporter(imp)
	var xs []*cuda.Import
	for i := range 3 {
		_, h, _ := exported(t, exp, 0, 4096, byte(i))
		x, err := im.Open(h, 0, 4096, 0)
		if err != nil {
			t.Fatal(err)
		}
		xs = append(xs, x)
	}
	if err := im.CloseAll(); err != nil {
		t.Fatal(err)
	}
	if imp.OpenHandles() != 0 {
		t.Fatalf("CloseAll left %d handles", imp.OpenHandles())
	}
	if err := im.Close(xs[0]); err != nil {
		t.Fatalf("Close after CloseAll: %v", err)
	}
	if imp.Calls("cuIpcCloseMemHandle") != 3 {
		t.Fatalf("%d closes, want 3 (one per handle, none after CloseAll)", imp.Calls("cuIpcCloseMemHandle"))
	}
	_, h, _ := exported(t, exp, 0, 64, 0)
	if _, err := im.Open(h, 0, 64, 0); err == nil {
		t.Fatal("Open after CloseAll succeeded")
	}
}
