package daemon

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// sealedMemfd is what the plug-in makes (kvxfer.sharedmem.allocate): a memfd
// of n bytes sealed against shrinking and growing, and the scheduler's mapping.
func sealedMemfd(t testing.TB, name string, n int, seals int) (int, []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	b, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return fd, b
}

func TestOpenMemfdsTakesOnlySealedMemfds(t *testing.T) {
	good, _ := sealedMemfd(t, "kv", 4096, requiredSeals)
	unsealed, _ := sealedMemfd(t, "loose", 4096, 0)
	growable, _ := sealedMemfd(t, "grow", 4096, unix.F_SEAL_SHRINK)
	f, err := os.CreateTemp(t.TempDir(), "plain")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(make([]byte, 4096))
	defer f.Close()
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	closed, _ := sealedMemfd(t, "closed", 4096, requiredSeals)
	unix.Close(closed)
	// closed is reused by no one here: the next descriptor the test opens
	// could take it, so it is checked before anything else is opened.
	if _, err := OpenMemfds(strconv.Itoa(closed)); err == nil || !strings.Contains(err.Error(), "not open") {
		t.Fatalf("closed descriptor: %v", err)
	}

	for _, tc := range []struct{ list, want string }{
		{strconv.Itoa(unsealed), "lack F_SEAL_SHRINK"},
		{strconv.Itoa(growable), "lack F_SEAL_SHRINK"},
		{strconv.Itoa(int(f.Fd())), "not a memfd"},
		{strconv.Itoa(p[0]), "not a regular file"},
		{"1", "above 2"},
		{"x", "not a descriptor"},
		{strconv.Itoa(good) + "," + strconv.Itoa(good), "given twice"},
	} {
		if _, err := OpenMemfds(tc.list); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("-memfd %s: %v, want an error with %q", tc.list, err, tc.want)
		}
	}
	m, err := OpenMemfds(" ")
	if err != nil || len(m) != 0 {
		t.Fatalf("empty list: %v %v", m, err)
	}
}

// TestRoomFromMemfdPools: KV and aux in sealed memfds the scheduler passed,
// registered by descriptor number; the room's bytes are the ones the
// scheduler wrote through its own mapping (no copy of the pools).
func TestRoomFromMemfdPools(t *testing.T) {
	kvLen, auxLen, _ := schedulerSizes()
	kvFD, kvView := sealedMemfd(t, "kvxfer-kv", kvLen, requiredSeals)
	auxFD, auxView := sealedMemfd(t, "kvxfer-aux", auxLen, requiredSeals)
	// The daemon owns its copies of the descriptors, as after an exec.
	kvDup, _ := unix.Dup(kvFD)
	auxDup, _ := unix.Dup(auxFD)
	memfds, err := OpenMemfds(strconv.Itoa(kvDup) + "," + strconv.Itoa(auxDup))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(memfds.Close)
	d := startDaemonWith(t, func(c *Config) { c.Dialect = wire.DialectUnknown; c.Memfds = memfds })

	// A descriptor kvxferd was not given is refused, whatever it is.
	cli, err := control.Dial(d.ControlEndpoint())
	if err != nil {
		t.Fatal(err)
	}
	other, _ := sealedMemfd(t, "other", kvLen, requiredSeals)
	bad := &control.MemoryRegistration{Kind: control.KindKV, Buffers: []control.Region{{Memfd: int64(other), Length: slots * item, ItemLen: item, Mem: nixl.DRAM}}}
	if _, err := cli.RegisterMemory(bad); err == nil || !strings.Contains(err.Error(), "not passed") {
		t.Fatalf("memfd %d (not passed): %v", other, err)
	}
	both := &control.MemoryRegistration{Kind: control.KindKV, Buffers: []control.Region{{Memfd: int64(kvDup), Shm: "/dev/shm/x", Length: slots * item, ItemLen: item, Mem: nixl.DRAM}}}
	if _, err := cli.RegisterMemory(both); err == nil || !strings.Contains(err.Error(), "exactly one") {
		t.Fatalf("memfd and shm: %v", err)
	}
	cli.Close()

	fds := map[string]struct {
		fd   int
		view []byte
	}{"kv": {kvDup, kvView}, "aux": {auxDup, auxView}}
	s := newSchedulerOn(t, d, false, func(name string, n int) (control.Region, []byte) {
		m := fds[name]
		return control.Region{Memfd: int64(m.fd)}, m.view
	})
	dec := newDecode(t, d)
	const id = 3003
	src, dst := []int32{1, 2, 3}, []int32{9, 10, 11}
	dec.checker.Expect(id, 1, false)
	dec.send(t, dec.info(id, dst, 4, 1))
	s.start(t, roomSpec{id: id, src: src, chunks: []int{2, 1}, aux: 4})
	if rep := s.waitTerminal(t, id); rep.Status != kv.StatusSuccess {
		t.Fatalf("room ended %v/%v", rep.Status, rep.Reason)
	}
	dec.verify(t, id, dst, 4)
}
