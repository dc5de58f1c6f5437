package loopback

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
)

// TestAttachRegistersAnotherProcesssFile: memory created by someone else (the
// scheduler's KV pool) is attached, registered, written from, and left in place.
func TestAttachRegistersAnotherProcesssFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvpool")
	if err := os.WriteFile(path, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := New("attach-src", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := New("attach-dst", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	buf, err := src.Attach(path)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf[4096:], "written by the scheduler")
	if _, err := src.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(buf, 0)}); err != nil {
		t.Fatal(err)
	}
	out, _, err := dst.AllocRegistered(nixl.DRAM, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	md, _ := dst.LocalMetadata()
	peer, err := src.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	x, err := src.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(buf[4096:4096+64], 0)}, peer, nixl.DRAM, []nixl.Desc{nixl.DescOf(out[:64], 0)}, []byte("n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Post(x); err != nil {
		t.Fatal(err)
	}
	st := []nixl.Status{{}}
	for i := 0; ; i++ {
		if err := src.Poll([]nixl.XferID{x}, st); err != nil {
			t.Fatal(err)
		}
		if st[0].State == nixl.Done {
			break
		}
		if st[0].State == nixl.Failed || i > 1e7 {
			t.Fatalf("transfer %v %v", st[0].State, st[0].Err)
		}
	}
	if got := string(out[:24]); got != "written by the scheduler" {
		t.Fatalf("decode got %q", got)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the attached file was removed: %v", err)
	}
}
