package daemon

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// TestTruncatedMemoryFailsTheRoomNotTheDaemon is the second half of attack F1:
// a file kvxferd maps is truncated under it, by the scheduler (its KV pool) or
// by a decode (its segment). Before, the next WRITE killed kvxferd with SIGBUS;
// now that room fails, the daemon answers /healthz, and rooms on healthy
// memory still succeed.
func TestTruncatedMemoryFailsTheRoomNotTheDaemon(t *testing.T) {
	cases := []struct {
		name string
		cut  func(t *testing.T, d *Daemon, bad *decodeRank)
	}{
		{"scheduler's KV file", func(t *testing.T, d *Daemon, bad *decodeRank) {
			if err := os.Truncate(kvPath(t, d), 0); err != nil {
				t.Fatal(err)
			}
		}},
		{"decode's segments", func(t *testing.T, d *Daemon, bad *decodeRank) {
			segs, _ := filepath.Glob(filepath.Join(bad.node.Agent.Dir(), "m*"))
			if len(segs) == 0 {
				t.Fatal("decode has no segments")
			}
			for _, p := range segs {
				if err := os.Truncate(p, 0); err != nil {
					t.Fatal(err)
				}
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t, wire.Dialect0518)
			s := newScheduler(t, d)
			bad, good := newDecode(t, d), newDecode(t, d)
			const id, okID = 700, 701
			bad.send(t, bad.info(id, seqPages(0, 2), 0, 1))
			for j, slot := range seqPages(0, 2) {
				s.fill(id, int(slot), j)
			}
			s.writeAux(0, id)
			// The scheduler's own view of the file is not touched after this.
			tc.cut(t, d, bad)
			if _, err := s.cli.Open(id, ""); err != nil {
				t.Fatal(err)
			}
			s.cli.Init(id, 2, 0)
			s.cli.Send(id, seqPages(0, 2), nil)
			rep := s.waitTerminal(t, id)
			if rep.Status != kv.StatusFailed {
				t.Fatalf("room over truncated memory ended %v/%v, want Failed", rep.Status, rep.Reason)
			}
			t.Logf("room failed: %v", rep.Reason)
			resp, err := http.Get("http://" + d.DebugAddr() + "/healthz")
			if err != nil {
				t.Fatalf("daemon gone after the fault: %v", err)
			}
			resp.Body.Close()
			if !d.Live() {
				t.Fatal("daemon no longer live")
			}
			if tc.name == "decode's segments" {
				// The scheduler's memory is intact: a healthy decode still gets its bytes.
				good.checker.Expect(okID, 1, false)
				good.send(t, good.info(okID, seqPages(10, 2), 1, 1))
				s.start(t, roomSpec{id: okID, src: seqPages(4, 2), chunks: []int{2}, aux: 1})
				if rep := s.waitTerminal(t, okID); rep.Status != kv.StatusSuccess {
					t.Fatalf("healthy room: %v/%v", rep.Status, rep.Reason)
				}
				good.verify(t, okID, seqPages(10, 2), 1)
			}
		})
	}
}

// kvPath finds the scheduler's KV file among the files the daemon attached.
func kvPath(t *testing.T, d *Daemon) string {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for p := range d.mem.attached {
		if filepath.Base(p) == "kv" {
			return p
		}
	}
	t.Fatal("the daemon attached no kv file")
	return ""
}

// TestRegisterMemoryRefusesFilesNotTheSchedulers: register_memory naming a
// symlink, a world-writable file, another user's file or a device is refused,
// and the file is untouched.
func TestRegisterMemoryRefusesFilesNotTheSchedulers(t *testing.T) {
	cases := []struct {
		name string
		make func(t *testing.T, dir string) (shm, victim string)
	}{
		{"symlink to an ordinary file", func(t *testing.T, dir string) (string, string) {
			v := writeVictim(t, dir, "notes.txt", 0o644)
			if err := os.Symlink(v, filepath.Join(dir, "kv")); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(dir, "kv"), v
		}},
		{"world-writable file", func(t *testing.T, dir string) (string, string) {
			v := writeVictim(t, dir, "kv", 0o666)
			return v, v
		}},
		{"another user's file", func(t *testing.T, dir string) (string, string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			v := writeVictim(t, dir, "kv", 0o600)
			if err := os.Chown(v, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return v, v
		}},
		{"a device", func(t *testing.T, dir string) (string, string) {
			return "/dev/zero", writeVictim(t, dir, "unrelated", 0o600)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t, wire.DialectUnknown)
			cli, err := control.Dial(d.ControlEndpoint())
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			shm, v := tc.make(t, t.TempDir())
			before, _ := os.ReadFile(v)
			st0, _ := os.Stat(v)
			kv := &control.MemoryRegistration{Kind: control.KindKV}
			for b := range 2 * layers {
				kv.Buffers = append(kv.Buffers, control.Region{Shm: shm, Offset: uint64(b * slots * item), Length: slots * item, ItemLen: item, Mem: nixl.DRAM})
			}
			if _, err := cli.RegisterMemory(kv); err == nil {
				t.Fatal("register_memory accepted it")
			} else {
				t.Logf("refused: %v", err)
			}
			after, _ := os.ReadFile(v)
			st1, _ := os.Stat(v)
			if !bytes.Equal(before, after) || !st0.ModTime().Equal(st1.ModTime()) || st0.Mode() != st1.Mode() {
				t.Fatalf("%s changed", v)
			}
		})
	}
}

func writeVictim(t *testing.T, dir, name string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, bytes.Repeat([]byte("precious"), 2*layers*slots*item/8), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	os.Chtimes(p, old, old)
	return p
}

// TestWithFileMappingChecksTheFile: the libnixl backend's Attach (WithFileMapping)
// applies the same checks as the loopback one.
func TestWithFileMappingChecksTheFile(t *testing.T) {
	ag, err := loopback.New("filemap", loopback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fm := WithFileMapping(ag)
	defer fm.Close()
	dir := t.TempDir()
	ok := writeVictim(t, dir, "kv", 0o644)
	if b, err := fm.Attach(ok); err != nil || len(b) != 2*layers*slots*item {
		t.Fatalf("Attach of the scheduler's file: %d bytes, %v", len(b), err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(ok, link); err != nil {
		t.Fatal(err)
	}
	ww := writeVictim(t, dir, "ww", 0o666)
	for _, p := range []string{link, ww, "/dev/zero", dir, "relative"} {
		if _, err := fm.Attach(p); err == nil || !strings.Contains(err.Error(), "attach") {
			t.Fatalf("Attach(%s) = %v, want a refusal", p, err)
		}
	}
}

// TestHostileRegistrationTouchesNoFile is attack F1 end to end: a decode
// registration whose loopback metadata names an ordinary 0644 file instead of
// its segment, then a transfer info. Before, kvxferd overwrote the file with KV
// bytes. Now the registration is rejected, the room fails, and the file keeps
// its bytes and mtime.
func TestHostileRegistrationTouchesNoFile(t *testing.T) {
	var logs logBuf
	d := startDaemonWith(t, func(c *Config) {
		c.Dialect = wire.Dialect0518
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	s := newScheduler(t, d)
	v := writeVictim(t, t.TempDir(), "notes.txt", 0o644)
	before, _ := os.ReadFile(v)
	st0, _ := os.Stat(v)
	dec := newDecodeWith(t, decodeShape(false), func(r *wire.Registration) {
		md := retargetSegments(t, r.AgentMetadata, v)
		r.AgentMetadata = md
	}, d)
	const id = 800
	dec.send(t, dec.info(id, seqPages(0, 2), 0, 1))
	s.start(t, roomSpec{id: id, src: seqPages(0, 2), chunks: []int{2}, aux: 0})
	if rep := s.waitTerminal(t, id); rep.Status != kv.StatusFailed {
		t.Fatalf("room for the hostile decode ended %v/%v, want Failed", rep.Status, rep.Reason)
	} else {
		t.Logf("room failed: %v", rep.Reason)
	}
	after, _ := os.ReadFile(v)
	st1, _ := os.Stat(v)
	if !bytes.Equal(before, after) || !st0.ModTime().Equal(st1.ModTime()) {
		t.Fatalf("%s was written", v)
	}
	if !strings.Contains(logs.String(), "outside the loopback namespace") {
		t.Fatalf("the registration was not refused by the namespace check; log:\n%s", logs.String())
	}
}

// retargetSegments rewrites loopback metadata (magic, version, name, socket,
// then the files: u16-length path and u64 size each) so that every file path
// is path.
func retargetSegments(t *testing.T, md []byte, path string) []byte {
	t.Helper()
	str := func(off int) int { return off + 2 + int(binary.LittleEndian.Uint16(md[off:])) }
	off := str(str(8)) // past magic+version, name, socket
	n := int(binary.LittleEndian.Uint16(md[off:]))
	out := append([]byte{}, md[:off+2]...)
	off += 2
	for range n {
		end := str(off)
		out = binary.LittleEndian.AppendUint16(out, uint16(len(path)))
		out = append(out, path...)
		out = append(out, md[end:end+8]...)
		off = end + 8
	}
	if n == 0 {
		t.Fatal("no files in the metadata")
	}
	return append(out, md[off:]...)
}
