package loopback

import (
	"bytes"
	"testing"

	"github.com/kvxfer/kvxfer/nixl/cuda"
)

func TestVRAMMetadataRoundTrip(t *testing.T) {
	inner := sampleMeta().encode()
	rs := []vramMetaRegion{{Dev: 1, Addr: 0x7f0000001000, Len: 4096, Off: 4096, H: cuda.Handle{1, 2, 3}}, {Dev: 0, Addr: 5, Len: 1}}
	b := encodeVRAMMeta(inner, rs)
	gi, grs, err := decodeVRAMMeta(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gi, inner) || len(grs) != 2 || grs[0] != rs[0] || grs[1] != rs[1] {
		t.Fatalf("round trip: %d inner bytes, %+v", len(gi), grs)
	}
	for n := range len(b) {
		if _, _, err := decodeVRAMMeta(b[:n]); err == nil {
			t.Fatalf("a blob cut to %d of %d bytes decoded", n, len(b))
		}
	}
}

func TestVRAMMetadataCapsRegions(t *testing.T) {
	rs := make([]vramMetaRegion, maxVRAMRegion+1)
	for i := range rs {
		rs[i] = vramMetaRegion{Addr: uint64(i) << 20, Len: 1}
	}
	if _, _, err := decodeVRAMMeta(encodeVRAMMeta(nil, rs)); err == nil {
		t.Fatalf("metadata with %d device regions decoded", len(rs))
	}
	if _, got, err := decodeVRAMMeta(encodeVRAMMeta(nil, rs[:maxVRAMRegion])); err != nil || len(got) != maxVRAMRegion {
		t.Fatalf("%d regions (the cap): %d, %v", maxVRAMRegion, len(got), err)
	}
}

func FuzzDecodeVRAMMetadata(f *testing.F) {
	f.Add(encodeVRAMMeta(sampleMeta().encode(), []vramMetaRegion{{Dev: 1, Addr: 4096, Len: 4096}}))
	f.Add([]byte("KVXVRAM\x01\x00\x00\x00\x00\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		inner, rs, err := decodeVRAMMeta(b)
		if err != nil {
			return
		}
		again := encodeVRAMMeta(inner, rs)
		if !bytes.Equal(again, b) {
			t.Fatalf("decode/encode is not the identity")
		}
	})
}
