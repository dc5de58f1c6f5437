package loopback

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// victim is an ordinary file the attacks aim at; check reports whether its
// bytes, mode and mtime are what they were.
type victim struct {
	path  string
	data  []byte
	mtime time.Time
	mode  os.FileMode
}

func newVictim(t *testing.T, dir, name string, mode os.FileMode, n int) *victim {
	t.Helper()
	v := &victim{path: filepath.Join(dir, name), data: bytes.Repeat([]byte("precious"), n/8)}
	if err := os.WriteFile(v.path, v.data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(v.path, mode); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(v.path, old, old); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(v.path)
	if err != nil {
		t.Fatal(err)
	}
	v.mtime, v.mode = st.ModTime(), st.Mode()
	return v
}

func (v *victim) check(t *testing.T) {
	t.Helper()
	got, err := os.ReadFile(v.path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(v.path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, v.data) || !st.ModTime().Equal(v.mtime) || st.Mode() != v.mode {
		t.Fatalf("%s changed: %d bytes (want %d), mtime %v (want %v), mode %v (want %v)",
			v.path, len(got), len(v.data), st.ModTime(), v.mtime, st.Mode(), v.mode)
	}
}

// hostileAgents: a is kvxferd's side (it loads metadata and writes); b is an
// honest peer with one registered 8 KiB segment whose metadata the attacks
// rewrite.
func hostileAgents(t *testing.T) (a, b *Agent, md *metadata) {
	t.Helper()
	var err error
	if a, err = New("prefill", Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if b, err = New("decode", Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if _, _, err := b.AllocRegistered(nixl.DRAM, 0, 8192); err != nil {
		t.Fatal(err)
	}
	blob, err := b.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	if md, err = decodeMetadata(blob); err != nil {
		t.Fatal(err)
	}
	if len(md.Files) != 1 || md.Files[0].Size != 8192 {
		t.Fatalf("honest metadata: %+v", md.Files)
	}
	return a, b, md
}

// TestLoadPeerRefusesFilesOutsideTheNamespace is attack F1: decode metadata
// naming a file a loopback agent did not create. Each is refused by LoadPeer
// with ErrInvalid (or ErrRemoteDisconnect where nothing exists), and the file
// it names is left exactly as it was.
func TestLoadPeerRefusesFilesOutsideTheNamespace(t *testing.T) {
	cases := []struct {
		name string
		// aim rewrites md to point at v (created by it, in a place of its choosing).
		aim     func(t *testing.T, a, b *Agent, md *metadata) *victim
		wantErr error
	}{
		{"ordinary 0644 file elsewhere", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			v := newVictim(t, t.TempDir(), "notes.txt", 0o644, 8192)
			md.Files[0].Path = v.path
			return v
		}, nixl.ErrInvalid},
		{"ordinary 0600 file elsewhere", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			v := newVictim(t, t.TempDir(), "m1", 0o600, 8192)
			md.Files[0].Path = v.path
			return v
		}, nixl.ErrInvalid},
		{"dot-dot out of the namespace", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			v := newVictim(t, t.TempDir(), "m1", 0o600, 8192)
			md.Files[0].Path = b.Dir() + "/../../../../../../../.." + v.path
			return v
		}, nixl.ErrInvalid},
		{"relative path", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			v := newVictim(t, b.Dir(), "m77", 0o600, 8192)
			md.Files[0].Path = "m77"
			return v
		}, nixl.ErrInvalid},
		{"symlink segment to an ordinary file", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			v := newVictim(t, t.TempDir(), "target", 0o600, 8192)
			if err := os.Symlink(v.path, filepath.Join(b.Dir(), "m900")); err != nil {
				t.Fatal(err)
			}
			md.Files[0].Path = filepath.Join(b.Dir(), "m900")
			return v
		}, nixl.ErrInvalid},
		{"symlinked agent directory", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			other := t.TempDir()
			v := newVictim(t, other, "m1", 0o600, 8192)
			link := filepath.Join(a.ns, agentPrefix+"4242424242")
			if err := os.Symlink(other, link); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(link) })
			md.Files[0].Path = filepath.Join(link, "m1")
			md.Socket = filepath.Join(link, sockName)
			return v
		}, nixl.ErrInvalid},
		{"segment of mode 0644 in the peer's directory", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			v := newVictim(t, b.Dir(), "m901", 0o644, 8192)
			md.Files[0].Path = v.path
			return v
		}, nixl.ErrInvalid},
		{"segment of mode 0666 in the peer's directory", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			v := newVictim(t, b.Dir(), "m906", 0o666, 8192)
			md.Files[0].Path = v.path
			return v
		}, nixl.ErrInvalid},
		{"segment owned by another user", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			if os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			v := newVictim(t, b.Dir(), "m902", 0o600, 8192)
			if err := os.Chown(v.path, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			md.Files[0].Path = v.path
			return v
		}, nixl.ErrInvalid},
		{"hard link to a file of ours", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			v := newVictim(t, b.Dir(), "m903", 0o600, 8192)
			if err := os.Link(v.path, filepath.Join(b.Dir(), "m904")); err != nil {
				t.Fatal(err)
			}
			md.Files[0].Path = filepath.Join(b.Dir(), "m904")
			return v
		}, nixl.ErrInvalid},
		{"file smaller than the metadata says", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			v := newVictim(t, b.Dir(), "m905", 0o600, 4096)
			md.Files[0].Path = v.path // md says 8192 bytes, a region covers them
			return v
		}, nixl.ErrInvalid},
		{"FIFO named like a segment", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			if err := syscall.Mkfifo(filepath.Join(b.Dir(), "m907"), 0o600); err != nil {
				t.Fatal(err)
			}
			md.Files[0].Path = filepath.Join(b.Dir(), "m907")
			return newVictim(t, t.TempDir(), "unrelated", 0o600, 8)
		}, nixl.ErrInvalid},
		{"name not shaped like a segment", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			v := newVictim(t, b.Dir(), "kv.bin", 0o600, 8192)
			md.Files[0].Path = v.path
			return v
		}, nixl.ErrInvalid},
		{"this agent's own segment", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			own, err := a.Alloc(8192)
			if err != nil {
				t.Fatal(err)
			}
			copy(own, bytes.Repeat([]byte("precious"), 1024))
			a.mu.Lock()
			path := a.allocs[uint64(nixl.DescOf(own, 0).Addr)].path
			a.mu.Unlock()
			md.Files[0].Path = path
			md.Socket = filepath.Join(a.Dir(), sockName)
			// The victim here is our own memory: compared through the mapping.
			t.Cleanup(func() {
				if !bytes.Equal(own, bytes.Repeat([]byte("precious"), 1024)) {
					t.Error("own allocation changed")
				}
			})
			return newVictim(t, t.TempDir(), "unrelated", 0o600, 8)
		}, nixl.ErrInvalid},
		{"socket outside the namespace", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			v := newVictim(t, t.TempDir(), "sock", 0o600, 8)
			md.Socket = v.path
			return v
		}, nixl.ErrInvalid},
		{"socket that is a regular file", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			dir, err := os.MkdirTemp(a.ns, agentPrefix)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			v := newVictim(t, dir, sockName, 0o600, 8)
			seg := newVictim(t, dir, "m1", 0o600, 8192)
			t.Cleanup(func() { seg.check(t) })
			md.Socket, md.Files[0].Path = v.path, seg.path
			return v
		}, nixl.ErrInvalid},
		{"segment in another agent's directory than the socket", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			c, err := New("third", Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			v := newVictim(t, c.Dir(), "m908", 0o600, 8192)
			md.Files[0].Path = v.path
			return v
		}, nixl.ErrInvalid},
		{"peer directory gone", func(t *testing.T, a, b *Agent, md *metadata) *victim {
			dir := filepath.Join(a.ns, agentPrefix+"1")
			md.Files[0].Path, md.Socket = filepath.Join(dir, "m1"), filepath.Join(dir, sockName)
			return newVictim(t, t.TempDir(), "unrelated", 0o600, 8)
		}, nixl.ErrRemoteDisconnect},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b, md := hostileAgents(t)
			v := tc.aim(t, a, b, md)
			name, err := a.LoadPeer(md.encode())
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("LoadPeer = %q, %v; want %v", name, err, tc.wantErr)
			}
			t.Logf("refused: %v", err)
			if _, err := a.Prep(md.Name, nixl.DRAM, []nixl.Desc{{Addr: uintptr(md.Regions[0].Addr), Len: 64}}); !errors.Is(err, nixl.ErrPeerUnknown) {
				t.Fatalf("the refused peer is usable: %v", err)
			}
			v.check(t)
			// The honest metadata still loads afterwards.
			blob, _ := b.LocalMetadata()
			if _, err := a.LoadPeer(blob); err != nil {
				t.Fatalf("honest LoadPeer after the refusal: %v", err)
			}
		})
	}
}

// TestNamespaceDirectoryChecked: a namespace directory that is not ours or not
// 0700 (planted by someone else in /dev/shm) is refused by New, loudly.
func TestNamespaceDirectoryChecked(t *testing.T) {
	cases := []struct {
		name  string
		plant func(t *testing.T, ns string)
	}{
		{"mode 0755", func(t *testing.T, ns string) {
			if err := os.Mkdir(ns, 0o755); err != nil {
				t.Fatal(err)
			}
			os.Chmod(ns, 0o755)
		}},
		{"symlink", func(t *testing.T, ns string) {
			if err := os.Symlink(t.TempDir(), ns); err != nil {
				t.Fatal(err)
			}
		}},
		{"a regular file", func(t *testing.T, ns string) {
			if err := os.WriteFile(ns, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"another owner", func(t *testing.T, ns string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			if err := os.Mkdir(ns, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(ns, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.plant(t, filepath.Join(root, nsPrefix+strconv.Itoa(os.Geteuid())))
			a, err := New("ns", Options{Dir: root})
			if err == nil {
				a.Close()
				t.Fatal("New accepted a namespace that is not ours")
			}
			if !strings.Contains(err.Error(), "namespace") {
				t.Fatalf("error does not name the namespace: %v", err)
			}
		})
	}
	// And a fresh root gets a proper one.
	root := t.TempDir()
	a, err := New("ns", Options{Dir: root})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	st, err := os.Lstat(filepath.Join(root, nsPrefix+strconv.Itoa(os.Geteuid())))
	if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
		t.Fatalf("namespace: %v %v", st.Mode(), err)
	}
}

// settle polls x until it leaves InProgress (bounded by count, not by time).
func settle(t *testing.T, a *Agent, x nixl.XferID) nixl.Status {
	t.Helper()
	st := []nixl.Status{{}}
	for i := 0; i < 1e8; i++ {
		if err := a.Poll([]nixl.XferID{x}, st); err != nil {
			t.Fatal(err)
		}
		if st[0].State != nixl.InProgress {
			return st[0]
		}
		if i%1000 == 0 {
			time.Sleep(time.Microsecond) // yield to the worker
		}
	}
	t.Fatal("request never settled")
	return st[0]
}

// TestTruncatedMappingFailsTheRequestNotTheProcess: a file shrunk by its owner
// after it was mapped (a peer's segment, or a scheduler file attached as local
// memory) raises SIGBUS on the lost pages. The request touching them ends
// Failed with an error; the process lives, and the agent keeps working.
func TestTruncatedMappingFailsTheRequestNotTheProcess(t *testing.T) {
	cases := []struct {
		name     string
		op       nixl.Op
		truncate string // "peer" or "local"
		wantErr  error
	}{
		{"WRITE into a truncated peer segment", nixl.Write, "peer", nixl.ErrRemoteDisconnect},
		{"READ from a truncated peer segment", nixl.Read, "peer", nixl.ErrRemoteDisconnect},
		{"WRITE from a truncated attached file", nixl.Write, "local", nixl.ErrBackend},
		{"READ into a truncated attached file", nixl.Read, "local", nixl.ErrBackend},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b, md := hostileAgents(t)
			path := filepath.Join(t.TempDir(), "kvpool")
			if err := os.WriteFile(path, make([]byte, 16384), 0o600); err != nil {
				t.Fatal(err)
			}
			local, err := a.Attach(path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(local, 0)}); err != nil {
				t.Fatal(err)
			}
			blob, _ := b.LocalMetadata()
			peer, err := a.LoadPeer(blob)
			if err != nil {
				t.Fatal(err)
			}
			remote := []nixl.Desc{{Addr: uintptr(md.Regions[0].Addr), Len: 8192}}
			lx := []nixl.Desc{nixl.DescOf(local[8192:], 0)}
			// One good transfer first: the mappings work.
			x, err := a.Create(tc.op, nixl.DRAM, lx, peer, nixl.DRAM, remote, []byte("ok"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Post(x); err != nil {
				t.Fatal(err)
			}
			if st := settle(t, a, x); st.State != nixl.Done {
				t.Fatalf("healthy transfer: %v %v", st.State, st.Err)
			}
			switch tc.truncate {
			case "peer":
				if err := os.Truncate(md.Files[0].Path, 0); err != nil {
					t.Fatal(err)
				}
			case "local":
				if err := os.Truncate(path, 4096); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := a.Post(x); err != nil {
				t.Fatal(err)
			}
			st := settle(t, a, x)
			if st.State != nixl.Failed || !errors.Is(st.Err, tc.wantErr) {
				t.Fatalf("transfer over a truncated file: %v %v; want Failed %v", st.State, st.Err, tc.wantErr)
			}
			t.Logf("failed as it should: %v", st.Err)
			// Still alive and working: a transfer between healthy memory.
			c, err := New("healthy", Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			dst, _, err := c.AllocRegistered(nixl.DRAM, 0, 4096)
			if err != nil {
				t.Fatal(err)
			}
			src, _, err := a.AllocRegistered(nixl.DRAM, 0, 4096)
			if err != nil {
				t.Fatal(err)
			}
			copy(src, "still here")
			cmd, _ := c.LocalMetadata()
			cp, err := a.LoadPeer(cmd)
			if err != nil {
				t.Fatal(err)
			}
			y, err := a.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}, cp, nixl.DRAM, []nixl.Desc{nixl.DescOf(dst, 0)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.Post(y); err != nil {
				t.Fatal(err)
			}
			if st := settle(t, a, y); st.State != nixl.Done || string(dst[:10]) != "still here" {
				t.Fatalf("healthy transfer after the fault: %v %v %q", st.State, st.Err, dst[:10])
			}
		})
	}
}

// TestAttachRefusesFilesNotOwnedAlone: the scheduler's files are checked too.
func TestAttachRefusesFilesNotOwnedAlone(t *testing.T) {
	cases := []struct {
		name string
		make func(t *testing.T, dir string) (path string, v *victim)
	}{
		{"symlink", func(t *testing.T, dir string) (string, *victim) {
			v := newVictim(t, dir, "target", 0o600, 8192)
			link := filepath.Join(dir, "link")
			if err := os.Symlink(v.path, link); err != nil {
				t.Fatal(err)
			}
			return link, v
		}},
		{"world-writable", func(t *testing.T, dir string) (string, *victim) {
			v := newVictim(t, dir, "ww", 0o666, 8192)
			return v.path, v
		}},
		{"group-writable", func(t *testing.T, dir string) (string, *victim) {
			v := newVictim(t, dir, "gw", 0o620, 8192)
			return v.path, v
		}},
		{"another owner", func(t *testing.T, dir string) (string, *victim) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			v := newVictim(t, dir, "theirs", 0o600, 8192)
			if err := os.Chown(v.path, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return v.path, v
		}},
		{"two links", func(t *testing.T, dir string) (string, *victim) {
			v := newVictim(t, dir, "orig", 0o600, 8192)
			if err := os.Link(v.path, filepath.Join(dir, "alias")); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(dir, "alias"), v
		}},
		{"empty", func(t *testing.T, dir string) (string, *victim) {
			v := newVictim(t, dir, "empty", 0o600, 0)
			return v.path, v
		}},
		{"directory", func(t *testing.T, dir string) (string, *victim) {
			return dir, newVictim(t, t.TempDir(), "unrelated", 0o600, 8)
		}},
		{"not clean", func(t *testing.T, dir string) (string, *victim) {
			v := newVictim(t, dir, "kv", 0o600, 8192)
			return dir + "/./kv", v
		}},
	}
	a, err := New("attach", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path, v := tc.make(t, t.TempDir())
			if b, err := a.Attach(path); !errors.Is(err, nixl.ErrInvalid) {
				t.Fatalf("Attach(%s) = %d bytes, %v; want ErrInvalid", path, len(b), err)
			} else {
				t.Logf("refused: %v", err)
			}
			v.check(t)
		})
	}
	// A 0644 file of ours (what Python's open() makes) is fine.
	ok := newVictim(t, t.TempDir(), "py", 0o644, 8192)
	b, err := a.Attach(ok.path)
	if err != nil || len(b) != 8192 {
		t.Fatalf("Attach of an ordinary scheduler file: %d bytes, %v", len(b), err)
	}
}
