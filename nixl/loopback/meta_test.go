package loopback

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
)

func sampleMeta() *metadata {
	return &metadata{
		Name: "agent-x", Socket: "/dev/shm/kvxfer-nixl-1/notif.sock",
		Files: []metaFile{{Path: "/dev/shm/kvxfer-nixl-1/m1", Size: 8192}, {Path: "/dev/shm/kvxfer-nixl-1/m2", Size: 4096}},
		Regions: []metaRegion{
			{Kind: nixl.VRAM, Dev: 1, Addr: 0x7f0000000000, Len: 8192, File: 0, Off: 0},
			{Kind: nixl.DRAM, Dev: 0, Addr: 0x7f0000100000, Len: 100, File: 1, Off: 3900},
		},
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	md := sampleMeta()
	got, err := decodeMetadata(md.encode())
	if err != nil || !reflect.DeepEqual(got, md) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	blob := md.encode()
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"magic", append([]byte("KVXLOOQ"), blob[7:]...)},
		{"version", append(append([]byte(metaMagic), 2), blob[8:]...)},
		{"truncated", blob[:len(blob)-1]},
		{"trailing", append(bytes.Clone(blob), 0)},
	} {
		if _, err := decodeMetadata(c.b); !errors.Is(err, nixl.ErrInvalid) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	for name, mod := range map[string]func(*metadata){
		"region outside file": func(m *metadata) { m.Regions[1].Off = 4000 },
		"bad file index":      func(m *metadata) { m.Regions[0].File = 2 },
		"bad kind":            func(m *metadata) { m.Regions[0].Kind = 7 },
		"zero length":         func(m *metadata) { m.Regions[0].Len = 0 },
		"address wraps":       func(m *metadata) { m.Regions[0].Addr = 1<<64 - 10 },
		"no name":             func(m *metadata) { m.Name = "" },
		"no socket":           func(m *metadata) { m.Socket = "" },
		"empty file path":     func(m *metadata) { m.Files[0].Path = "" },
	} {
		m := sampleMeta()
		mod(m)
		if _, err := decodeMetadata(m.encode()); !errors.Is(err, nixl.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzDecodeMetadata: the decoder never panics, rejects with ErrInvalid, and
// what it accepts re-encodes to the same bytes.
func FuzzDecodeMetadata(f *testing.F) {
	f.Add(sampleMeta().encode())
	f.Add([]byte(metaMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		md, err := decodeMetadata(b)
		if err != nil {
			if !errors.Is(err, nixl.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if !bytes.Equal(md.encode(), b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func TestNotifFrame(t *testing.T) {
	n, ok := decodeNotif(encodeNotif("peer", []byte("1_aux")))
	if !ok || n.Peer != "peer" || n.Msg != "1_aux" {
		t.Fatalf("%+v %v", n, ok)
	}
	for _, b := range [][]byte{nil, {1}, {0, 0}, {5, 0, 'a'}} {
		if _, ok := decodeNotif(b); ok {
			t.Errorf("decodeNotif(%v) accepted", b)
		}
	}
}
