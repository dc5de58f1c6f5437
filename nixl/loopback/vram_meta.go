package loopback

import (
	"bytes"
	"encoding/binary"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/cuda"
)

// VRAM-mode metadata wraps the loopback blob (which still carries the name,
// the notification socket and the host regions) with the device regions a
// peer can import, little endian:
//
//	magic   "KVXVRAM" (7 bytes)
//	version u8 = 1
//	inner   u32 length, then the loopback blob
//	nregs   u32, then per region: dev u32, addr u64, len u64, off u64, handle [64]
//
// addr is the region as its owner sees it, off its offset from the base of
// the allocation the CUDA IPC handle names. An agent with no exportable
// device region sends the plain loopback blob. The blob is trusted input as
// in NIXL, but the decoder rejects anything malformed (fuzzed).
const (
	vramMagic     = "KVXVRAM"
	vramVersion   = 1
	vramRegBytes  = 4 + 8 + 8 + 8 + cuda.HandleSize
	maxVRAMRegion = 4096 // device regions one peer may publish (each distinct handle is one driver mapping)
)

type vramMetaRegion struct {
	Dev  uint32
	Addr uint64
	Len  uint64
	Off  uint64
	H    cuda.Handle
}

func encodeVRAMMeta(inner []byte, rs []vramMetaRegion) []byte {
	b := make([]byte, 0, len(vramMagic)+9+len(inner)+len(rs)*vramRegBytes)
	b = append(b, vramMagic...)
	b = append(b, vramVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(inner)))
	b = append(b, inner...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(rs)))
	for _, r := range rs {
		b = binary.LittleEndian.AppendUint32(b, r.Dev)
		b = binary.LittleEndian.AppendUint64(b, r.Addr)
		b = binary.LittleEndian.AppendUint64(b, r.Len)
		b = binary.LittleEndian.AppendUint64(b, r.Off)
		b = append(b, r.H[:]...)
	}
	return b
}

func isVRAMMeta(blob []byte) bool { return bytes.HasPrefix(blob, []byte(vramMagic)) }

// decodeVRAMMeta splits a VRAM-mode blob. Every failure wraps nixl.ErrInvalid.
func decodeVRAMMeta(blob []byte) ([]byte, []vramMetaRegion, error) {
	if !isVRAMMeta(blob) {
		return nil, nil, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM metadata: bad magic")
	}
	r := &reader{b: blob[len(vramMagic):]}
	if v := r.u8(); v != vramVersion {
		return nil, nil, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM metadata: version %d, want %d", v, vramVersion)
	}
	n := r.u32()
	if r.bad || uint64(n) > uint64(len(r.b)) {
		return nil, nil, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM metadata: inner blob of %d bytes, %d left", n, len(r.b))
	}
	inner := r.take(int(n))
	nr := r.u32()
	if r.bad || nr == 0 || nr > maxVRAMRegion || uint64(nr)*vramRegBytes != uint64(len(r.b)) {
		return nil, nil, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM metadata: %d regions for %d bytes", nr, len(r.b))
	}
	rs := make([]vramMetaRegion, nr)
	for i := range rs {
		g := vramMetaRegion{Dev: r.u32(), Addr: r.u64(), Len: r.u64(), Off: r.u64()}
		copy(g.H[:], r.take(cuda.HandleSize))
		if g.Len == 0 || g.Addr+g.Len < g.Addr || g.Off+g.Len < g.Off {
			return nil, nil, nixl.Errorf(nixl.ErrInvalid, "loopback VRAM metadata: region %d addr %#x off %d len %d", i, g.Addr, g.Off, g.Len)
		}
		rs[i] = g
	}
	return bytes.Clone(inner), rs, nil
}
