package loopback

import (
	"bytes"
	"encoding/binary"

	"github.com/kvxfer/kvxfer/nixl"
)

// Metadata blob, version 1, little endian:
//
//	magic   "KVXLOOP" (7 bytes)
//	version u8 = 1
//	name    str            agent name
//	socket  str            absolute path of the notification socket
//	nfiles  u16, then per file:   path str, size u64
//	nregs   u32, then per region: kind u8, dev u64, addr u64, len u64, file u16, off u64
//
// str is a u16 length plus bytes. The blob is trusted input (as in NIXL), but the
// decoder still rejects anything malformed instead of panicking: it is fuzzed.
const (
	metaMagic   = "KVXLOOP"
	metaVersion = 1
	maxStr      = 4096
	maxFiles    = 1 << 14
	maxRegions  = 1 << 20
)

// metaFile is one shared-memory file a peer must map.
type metaFile struct {
	Path string
	Size uint64
}

// metaRegion is one registered region: where it is for its owner (Addr) and
// where its bytes are in the owner's file (File, Off).
type metaRegion struct {
	Kind nixl.MemKind
	Dev  uint64
	Addr uint64
	Len  uint64
	File uint16
	Off  uint64
}

// metadata is the decoded form of a blob.
type metadata struct {
	Name    string
	Socket  string
	Files   []metaFile
	Regions []metaRegion
}

func putStr(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// encode serializes md. Callers guarantee string lengths below maxStr.
func (md *metadata) encode() []byte {
	b := make([]byte, 0, 64+len(md.Files)*64+len(md.Regions)*41)
	b = append(b, metaMagic...)
	b = append(b, metaVersion)
	b = putStr(b, md.Name)
	b = putStr(b, md.Socket)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(md.Files)))
	for _, f := range md.Files {
		b = putStr(b, f.Path)
		b = binary.LittleEndian.AppendUint64(b, f.Size)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(md.Regions)))
	for _, r := range md.Regions {
		b = append(b, byte(r.Kind))
		b = binary.LittleEndian.AppendUint64(b, r.Dev)
		b = binary.LittleEndian.AppendUint64(b, r.Addr)
		b = binary.LittleEndian.AppendUint64(b, r.Len)
		b = binary.LittleEndian.AppendUint16(b, r.File)
		b = binary.LittleEndian.AppendUint64(b, r.Off)
	}
	return b
}

// reader is a bounds-checked cursor; the first short read sticks as an error.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || n < 0 || len(r.b) < n {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() uint8 {
	if v := r.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (r *reader) str() string {
	n := int(r.u16())
	if n > maxStr {
		r.bad = true
		return ""
	}
	return string(r.take(n))
}

// decodeMetadata parses and validates a blob. Every failure wraps nixl.ErrInvalid.
func decodeMetadata(blob []byte) (*metadata, error) {
	if !bytes.HasPrefix(blob, []byte(metaMagic)) {
		return nil, nixl.Errorf(nixl.ErrInvalid, "loopback metadata: bad magic")
	}
	r := &reader{b: blob[len(metaMagic):]}
	if v := r.u8(); v != metaVersion {
		return nil, nixl.Errorf(nixl.ErrInvalid, "loopback metadata: version %d, want %d", v, metaVersion)
	}
	md := &metadata{Name: r.str(), Socket: r.str()}
	nf := int(r.u16())
	if r.bad || nf > maxFiles || nf*10 > len(r.b) {
		return nil, nixl.Errorf(nixl.ErrInvalid, "loopback metadata: truncated header or %d files", nf)
	}
	md.Files = make([]metaFile, nf)
	for i := range md.Files {
		md.Files[i] = metaFile{Path: r.str(), Size: r.u64()}
		if md.Files[i].Path == "" || md.Files[i].Size == 0 {
			r.bad = true
		}
	}
	nr := int(r.u32())
	const regBytes = 1 + 8 + 8 + 8 + 2 + 8
	if r.bad || nr > maxRegions || nr*regBytes != len(r.b) {
		return nil, nixl.Errorf(nixl.ErrInvalid, "loopback metadata: truncated files or %d regions for %d bytes", nr, len(r.b))
	}
	md.Regions = make([]metaRegion, nr)
	for i := range md.Regions {
		g := metaRegion{Kind: nixl.MemKind(r.u8()), Dev: r.u64(), Addr: r.u64(), Len: r.u64(), File: r.u16(), Off: r.u64()}
		switch {
		case !g.Kind.Valid():
			return nil, nixl.Errorf(nixl.ErrInvalid, "loopback metadata: region %d kind %d", i, g.Kind)
		case g.Len == 0 || g.Addr+g.Len < g.Addr:
			return nil, nixl.Errorf(nixl.ErrInvalid, "loopback metadata: region %d addr %#x len %d", i, g.Addr, g.Len)
		case int(g.File) >= nf:
			return nil, nixl.Errorf(nixl.ErrInvalid, "loopback metadata: region %d file %d of %d", i, g.File, nf)
		case g.Off+g.Len < g.Off || g.Off+g.Len > md.Files[g.File].Size:
			return nil, nixl.Errorf(nixl.ErrInvalid, "loopback metadata: region %d [%d,+%d) outside file of %d bytes", i, g.Off, g.Len, md.Files[g.File].Size)
		}
		md.Regions[i] = g
	}
	if md.Name == "" || md.Socket == "" {
		return nil, nixl.Errorf(nixl.ErrInvalid, "loopback metadata: empty name or socket")
	}
	return md, nil
}
