package control

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
)

// maxDepth bounds nesting so that hostile input cannot exhaust the stack. The protocol
// itself nests at most four deep (batch → request → buffers → buffer).
const maxDepth = 32

// reader decodes msgpack from one message in place: bin and str results alias the
// input, which the caller owns for the duration of one request. Every length is checked
// against the bytes left before anything is allocated, so a short hostile message cannot
// ask for a huge slice. Errors are plain values; reader never panics.
type reader struct {
	b     []byte
	off   int
	depth int
}

type wireError string

func (e wireError) Error() string { return "msgpack: " + string(e) }

const errShort = wireError("unexpected end of input")

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) done() bool { return r.off >= len(r.b) }

func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > r.left() {
		return nil, errShort
	}
	s := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return s, nil
}

func (r *reader) byte1() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	return r.b[r.off], nil
}

// uintN reads a big-endian unsigned integer of n bytes (1, 2, 4 or 8).
func (r *reader) uintN(n int) (uint64, error) {
	s, err := r.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(s[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(s)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(s)), nil
	}
	return binary.BigEndian.Uint64(s), nil
}

func typeName(c byte) string {
	switch {
	case c <= 0x7f, c >= 0xe0, c >= 0xcc && c <= 0xd3:
		return "int"
	case c <= 0x8f, c == 0xde, c == 0xdf:
		return "map"
	case c <= 0x9f, c == 0xdc, c == 0xdd:
		return "array"
	case c <= 0xbf, c >= 0xd9 && c <= 0xdb:
		return "str"
	case c == 0xc0:
		return "nil"
	case c == 0xc2, c == 0xc3:
		return "bool"
	case c >= 0xc4 && c <= 0xc6:
		return "bin"
	case c == 0xca, c == 0xcb:
		return "float"
	case c == 0xc1:
		return "reserved byte 0xc1"
	}
	return "ext"
}

func mismatch(want string, c byte) error {
	return wireError(fmt.Sprintf("want %s, got %s", want, typeName(c)))
}

// isNil consumes a nil and reports true, or leaves the input alone.
func (r *reader) isNil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

func (r *reader) readBool() (bool, error) {
	c, err := r.byte1()
	if err != nil {
		return false, err
	}
	switch c {
	case 0xc2:
		return false, nil
	case 0xc3:
		return true, nil
	}
	r.off--
	return false, mismatch("bool", c)
}

// integer reads any int form. signed reports the d0-d3 and negative fixint forms, whose
// value is the int64 stored in v.
func (r *reader) integer() (v uint64, signed bool, err error) {
	c, err := r.byte1()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		return uint64(c), false, nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, nil
	case c >= 0xcc && c <= 0xcf:
		v, err = r.uintN(1 << (c - 0xcc))
		return v, false, err
	case c >= 0xd0 && c <= 0xd3:
		n := 1 << (c - 0xd0)
		v, err = r.uintN(n)
		switch n { // sign-extend
		case 1:
			v = uint64(int64(int8(v)))
		case 2:
			v = uint64(int64(int16(v)))
		case 4:
			v = uint64(int64(int32(v)))
		}
		return v, true, err
	}
	r.off--
	return 0, false, mismatch("int", c)
}

func (r *reader) readInt() (int64, error) {
	v, signed, err := r.integer()
	if err != nil {
		return 0, err
	}
	if !signed && v > math.MaxInt64 {
		return 0, wireError("integer overflows int64")
	}
	return int64(v), nil
}

func (r *reader) readUint() (uint64, error) {
	v, signed, err := r.integer()
	if err != nil {
		return 0, err
	}
	if signed && int64(v) < 0 {
		return 0, wireError("negative integer where unsigned expected")
	}
	return v, nil
}

func (r *reader) readFloat() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.off++
		v, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	case 0xcb:
		r.off++
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	}
	return 0, mismatch("float", c)
}

// strBytes reads a str and returns its bytes, aliasing the input.
func (r *reader) strBytes() ([]byte, error) {
	c, err := r.byte1()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = uint64(c & 0x1f)
	case c >= 0xd9 && c <= 0xdb:
		n, err = r.uintN(1 << (c - 0xd9))
	default:
		r.off--
		return nil, mismatch("str", c)
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(r.left()) {
		return nil, errShort
	}
	return r.take(int(n))
}

func (r *reader) readStr() (string, error) {
	s, err := r.strBytes()
	return string(s), err
}

// readBin reads a bin and returns its bytes, aliasing the input.
func (r *reader) readBin() ([]byte, error) {
	c, err := r.byte1()
	if err != nil {
		return nil, err
	}
	if c < 0xc4 || c > 0xc6 {
		r.off--
		return nil, mismatch("bin", c)
	}
	n, err := r.uintN(1 << (c - 0xc4))
	if err != nil {
		return nil, err
	}
	if n > uint64(r.left()) {
		return nil, errShort
	}
	return r.take(int(n))
}

// container reads an array or map header. Every element takes at least one byte, so
// a count larger than the bytes left is rejected up front (per element: 1 for arrays,
// 2 for maps).
func (r *reader) container(isMap bool) (int, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	var n uint64
	fix, w16, w32, name := byte(0x90), byte(0xdc), byte(0xdd), "array"
	if isMap {
		fix, w16, w32, name = 0x80, 0xde, 0xdf, "map"
	}
	switch {
	case c&0xf0 == fix:
		n = uint64(c & 0x0f)
	case c == w16:
		n, err = r.uintN(2)
	case c == w32:
		n, err = r.uintN(4)
	default:
		r.off--
		return 0, mismatch(name, c)
	}
	if err != nil {
		return 0, err
	}
	per := uint64(1)
	if isMap {
		per = 2
	}
	if n*per > uint64(r.left()) {
		return 0, errShort
	}
	return int(n), nil
}

func (r *reader) readArrayHeader() (int, error) { return r.container(false) }
func (r *reader) readMapHeader() (int, error)   { return r.container(true) }

// skip consumes one value of any supported type (used for unknown fields, which the
// protocol ignores so that newer clients can talk to older servers).
func (r *reader) skip() error {
	_, err := r.value(false)
	return err
}

// value decodes one value into nil, bool, int64 (uint64 above MaxInt64), float64,
// string, []byte (a copy), []any or map[string]any. With build false it only validates
// and consumes. Map keys must be str: the protocol never uses anything else.
func (r *reader) value(build bool) (any, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3):
		v, signed, err := r.integer()
		if err != nil || !build {
			return nil, err
		}
		if !signed && v > math.MaxInt64 {
			return v, nil
		}
		return int64(v), nil
	case c == 0xc0:
		r.off++
		return nil, nil
	case c == 0xc2 || c == 0xc3:
		b, err := r.readBool()
		return b, err
	case c == 0xca || c == 0xcb:
		f, err := r.readFloat()
		return f, err
	case (c >= 0xa0 && c <= 0xbf) || (c >= 0xd9 && c <= 0xdb):
		s, err := r.strBytes()
		if err != nil || !build {
			return nil, err
		}
		return string(s), nil
	case c >= 0xc4 && c <= 0xc6:
		b, err := r.readBin()
		if err != nil || !build {
			return nil, err
		}
		return append([]byte{}, b...), nil
	case (c >= 0x90 && c <= 0x9f) || c == 0xdc || c == 0xdd:
		return r.array(build)
	case (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf:
		return r.mapValue(build)
	}
	return nil, wireError(fmt.Sprintf("unsupported type byte %#02x (%s)", c, typeName(c)))
}

func (r *reader) enter() error {
	if r.depth >= maxDepth {
		return wireError("nesting too deep")
	}
	r.depth++
	return nil
}

func (r *reader) array(build bool) (any, error) {
	n, err := r.readArrayHeader()
	if err != nil {
		return nil, err
	}
	if err := r.enter(); err != nil {
		return nil, err
	}
	defer func() { r.depth-- }()
	var out []any
	if build {
		out = make([]any, 0, n)
	}
	for i := 0; i < n; i++ {
		v, err := r.value(build)
		if err != nil {
			return nil, err
		}
		if build {
			out = append(out, v)
		}
	}
	if !build {
		return nil, nil
	}
	return out, nil
}

func (r *reader) mapValue(build bool) (any, error) {
	n, err := r.readMapHeader()
	if err != nil {
		return nil, err
	}
	if err := r.enter(); err != nil {
		return nil, err
	}
	defer func() { r.depth-- }()
	var out map[string]any
	if build {
		out = make(map[string]any, n)
	}
	for i := 0; i < n; i++ {
		k, err := r.strBytes()
		if err != nil {
			return nil, fmt.Errorf("map key: %w", err)
		}
		v, err := r.value(build)
		if err != nil {
			return nil, err
		}
		if build {
			out[string(k)] = v
		}
	}
	if !build {
		return nil, nil
	}
	return out, nil
}

// decodeValue decodes exactly one value that must span all of b.
func decodeValue(b []byte) (any, error) {
	r := reader{b: b}
	v, err := r.value(true)
	if err != nil {
		return nil, err
	}
	if !r.done() {
		return nil, wireError(fmt.Sprintf("%d trailing bytes", r.left()))
	}
	return v, nil
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
