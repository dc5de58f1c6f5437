package wire

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// IntElem is the set of element types pack_int_lists is used with upstream (§4.3e):
// int32 ("i", state page indices), uint32 ("I", item lens, dims, layer ids) and
// uint64 ("Q", pointers).
type IntElem interface{ ~int32 | ~uint32 | ~uint64 }

func elemWidth[T IntElem]() int {
	var z T
	return int(unsafe.Sizeof(z))
}

// PackIntLists is SGLang's pack_int_lists (common/utils.py): b"" for an empty outer list,
// else a little-endian u32 count n, n u32 payload byte lengths, then every inner list as
// little-endian fixed-width integers. An empty inner list is a zero-length payload.
func PackIntLists[T IntElem](lists [][]T) []byte {
	if len(lists) == 0 {
		return []byte{}
	}
	w := elemWidth[T]()
	size := 4 + 4*len(lists)
	for _, l := range lists {
		size += w * len(l)
	}
	out := make([]byte, size)
	binary.LittleEndian.PutUint32(out, uint32(len(lists)))
	off := 4 + 4*len(lists)
	for i, l := range lists {
		binary.LittleEndian.PutUint32(out[4+4*i:], uint32(w*len(l)))
		for _, v := range l {
			if w == 8 {
				binary.LittleEndian.PutUint64(out[off:], uint64(v))
			} else {
				binary.LittleEndian.PutUint32(out[off:], uint32(v))
			}
			off += w
		}
	}
	return out
}

// UnpackIntLists is the inverse of PackIntLists. b"" decodes to an empty (nil) list.
//
// It is stricter than upstream's unpack_int_lists, which slices silently: a payload that
// runs past the end of the buffer, a payload length that is not a multiple of the element
// width, or bytes left over after the last payload are all errors here, because upstream
// would either raise or silently decode fewer values than were sent.
func UnpackIntLists[T IntElem](buf []byte) ([][]T, error) {
	if len(buf) == 0 {
		return nil, nil
	}
	if len(buf) < 4 {
		return nil, fmt.Errorf("packed int lists: %d bytes, need a 4-byte count", len(buf))
	}
	n := uint64(binary.LittleEndian.Uint32(buf))
	if 4+4*n > uint64(len(buf)) {
		return nil, fmt.Errorf("packed int lists: count %d needs a %d-byte header, have %d bytes", n, 4+4*n, len(buf))
	}
	w := uint64(elemWidth[T]())
	off := 4 + 4*n
	out := make([][]T, n)
	for i := range n {
		l := uint64(binary.LittleEndian.Uint32(buf[4+4*i:]))
		if l%w != 0 {
			return nil, fmt.Errorf("packed int lists: list %d has %d bytes, not a multiple of %d", i, l, w)
		}
		if off+l > uint64(len(buf)) {
			return nil, fmt.Errorf("packed int lists: list %d (%d bytes at offset %d) runs past the end (%d bytes)", i, l, off, len(buf))
		}
		vals := make([]T, l/w)
		for k := range vals {
			if w == 8 {
				vals[k] = T(binary.LittleEndian.Uint64(buf[off:]))
			} else {
				vals[k] = T(int32(binary.LittleEndian.Uint32(buf[off:])))
			}
			off += w
		}
		out[i] = vals
	}
	if off != uint64(len(buf)) {
		return nil, fmt.Errorf("packed int lists: %d trailing bytes after the last list", uint64(len(buf))-off)
	}
	if n == 0 {
		return nil, nil // a zero count means the same as b"" (an empty outer list)
	}
	return out, nil
}
