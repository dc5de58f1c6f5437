package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
)

// fields reads the frames of one message by their upstream index. Upstream numbers the
// frames of GUARD messages after stripping GUARD ("msg[i]"), so base is 1 for those and 0
// for tag-first messages; errors report both numbers.
type fields struct {
	kind    Kind
	frames  [][]byte
	base    int
	room    uint64
	hasRoom bool
	strs    *Decoder // reuses repeated strings; nil: none
}

func (f *fields) n() int { return len(f.frames) - f.base }

func (f *fields) has(i int) bool { return i < f.n() }

// present is upstream's `len(msg) > i and msg[i] != b""`: the optional-frame test.
func (f *fields) present(i int) bool { return i < f.n() && len(f.frames[f.base+i]) > 0 }

func (f *fields) raw(i int) []byte { return f.frames[f.base+i] }

func (f *fields) fail(i int, name string, err error) *FrameError {
	field := name
	if f.base > 0 {
		field = fmt.Sprintf("msg[%d] %s", i, name)
	}
	frame := -1
	if i >= 0 {
		frame = f.base + i
	}
	return &FrameError{Kind: f.kind, Frame: frame, Field: field, Room: f.room, HasRoom: f.hasRoom, Err: err}
}

func (f *fields) need(i int, name string) error {
	if !f.has(i) {
		return f.fail(i, name, detail(ErrTooFewFrames, "message has %d frames, need at least %d", len(f.frames), f.base+i+1))
	}
	return nil
}

func (f *fields) bad(i int, name string, err error) *FrameError {
	return f.fail(i, name, detail(ErrBadFrame, "%v", err))
}

// int parses a required ASCII integer frame and checks it lies in [lo, hi].
func (f *fields) int(i int, name string, lo, hi int64) (int64, error) {
	if err := f.need(i, name); err != nil {
		return 0, err
	}
	v, err := ParsePyInt(f.raw(i))
	if err != nil {
		return 0, f.bad(i, name, err)
	}
	if v < lo || v > hi {
		return 0, f.bad(i, name, fmt.Errorf("%d outside [%d, %d]", v, lo, hi))
	}
	return v, nil
}

func (f *fields) nonNeg(i int, name string) (int, error) {
	v, err := f.int(i, name, 0, math.MaxInt64)
	return int(v), err
}

func (f *fields) port(i int, name string) (int, error) {
	v, err := f.int(i, name, 0, 65535)
	return int(v), err
}

// roomAt parses a bootstrap room (0 <= room < 2^63) and remembers it for later errors.
func (f *fields) roomAt(i int) (uint64, error) {
	v, err := f.int(i, "bootstrap_room", 0, math.MaxInt64)
	if err != nil {
		return 0, err
	}
	f.room, f.hasRoom = uint64(v), true
	return f.room, nil
}

func (f *fields) ascii(i int, name string) (string, error) {
	if err := f.need(i, name); err != nil {
		return "", err
	}
	b := f.raw(i)
	if s, ok := f.strs.lookup(b); ok {
		return s, nil // only ASCII strings are kept
	}
	s, err := asciiString(b)
	if err != nil {
		return "", f.bad(i, name, err)
	}
	f.strs.keep(s)
	return s, nil
}

// u64s decodes concatenated native (little-endian) u64s: upstream struct.unpack("<n>Q").
func (f *fields) u64s(i int, name string) ([]uint64, error) {
	b := f.raw(i)
	if len(b)%8 != 0 {
		return nil, f.bad(i, name, fmt.Errorf("length %d is not a multiple of 8", len(b)))
	}
	out := make([]uint64, len(b)/8)
	for k := range out {
		out[k] = binary.LittleEndian.Uint64(b[8*k:])
	}
	return out, nil
}

// u32s decodes concatenated native (little-endian) u32s.
func (f *fields) u32s(i int, name string) ([]uint32, error) {
	b := f.raw(i)
	if len(b)%4 != 0 {
		return nil, f.bad(i, name, fmt.Errorf("length %d is not a multiple of 4", len(b)))
	}
	out := make([]uint32, len(b)/4)
	for k := range out {
		out[k] = binary.LittleEndian.Uint32(b[4*k:])
	}
	return out, nil
}

// i32s decodes numpy int32 page indices (np.frombuffer(.., np.int32), little-endian).
func (f *fields) i32s(i int, name string) ([]int32, error) {
	b := f.raw(i)
	if len(b)%4 != 0 {
		return nil, f.bad(i, name, fmt.Errorf("length %d is not a multiple of 4", len(b)))
	}
	out := make([]int32, len(b)/4)
	for k := range out {
		out[k] = int32(binary.LittleEndian.Uint32(b[4*k:]))
	}
	return out, nil
}

// Encoding helpers: Python's str(int).encode("ascii") and struct.pack("<nQ"/"<nI"/np.int32).

func itoa(v int64) []byte  { return strconv.AppendInt(nil, v, 10) }
func utoa(v uint64) []byte { return strconv.AppendUint(nil, v, 10) }
func intb(v int) []byte    { return itoa(int64(v)) }

func packU64s(v []uint64) []byte {
	out := make([]byte, 8*len(v))
	for k, x := range v {
		binary.LittleEndian.PutUint64(out[8*k:], x)
	}
	return out
}

func packU32s(v []uint32) []byte {
	out := make([]byte, 4*len(v))
	for k, x := range v {
		binary.LittleEndian.PutUint32(out[4*k:], x)
	}
	return out
}

func packI32s(v []int32) []byte {
	out := make([]byte, 4*len(v))
	for k, x := range v {
		binary.LittleEndian.PutUint32(out[4*k:], uint32(x))
	}
	return out
}
