package control

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/tinylib/msgp/msgp"
)

// The control protocol's msgpack (https://github.com/msgpack/msgpack/blob/master/spec.md):
// nil, bool, int, float64, str, bin, array and map; no ext types or timestamps. The bytes
// are read and written by tinylib/msgp's in-place []byte API (msgp.Read*Bytes,
// msgp.Append*). This file only adapts it to the protocol's field-by-field decoding.
//
// Why msgp, and its runtime API rather than generated code or vmihailenco/msgpack:
//
//   - Allocation on hostile input is bounded by the message itself. The Read*Bytes
//     functions check every str/bin length against the bytes actually present before
//     slicing and return views into the message (zero copy), so a 10-byte message that
//     announces a 4 GiB bin allocates nothing. vmihailenco/msgpack decodes from an
//     io.Reader: it copies every str/bin and, with its fixed limits, may still allocate
//     1 MiB for a bin header or 1e6 elements for an array header before it finds the
//     message short.
//   - Nesting is bounded. vmihailenco/msgpack has no depth limit (a message of nested
//     one-element arrays recurses until the stack overflows, a fatal error no recover
//     catches); msgp stops at 100 000, and our reader at maxDepth.
//   - Array and map headers are checked against the bytes left (container): every
//     element takes at least one byte, so a count cannot ask for more than the message.
//   - Generated msgp code (UnmarshalMsg) stops at the first mistyped field. The protocol
//     needs more: a mistyped field is a request error that still echoes the id, and a
//     batch goes on with its next sub-request (decodeRequestMap), so the field switch in
//     protocol.go stays ours and reads values through this reader.
//
// The encoder picks the shortest form, non-negative integers in the unsigned forms, and
// float64 for floats: what Python's msgpack.packb writes, so golden bytes match across
// languages. Encoding appends to a caller-owned slice, so the server's reply loop and the
// client reuse one buffer and allocate nothing per message.

// maxDepth bounds nesting so that hostile input cannot exhaust the stack. The protocol
// itself nests at most four deep (batch → request → buffers → buffer).
const maxDepth = 32

type wireError string

func (e wireError) Error() string { return "msgpack: " + string(e) }

const errShort = wireError("unexpected end of input")

// reader walks one message in place: str and bin results alias the input, which the
// caller owns for the duration of one request. A read that fails leaves off where it
// was. Errors are plain values; reader never panics.
type reader struct {
	b     []byte
	off   int
	depth int
}

func (r *reader) left() int  { return len(r.b) - r.off }
func (r *reader) done() bool { return r.off >= len(r.b) }

// step runs one msgp read on the rest of the message and advances past what it read.
func step[T any](r *reader, read func([]byte) (T, []byte, error)) (T, error) {
	in := r.b[r.off:]
	v, rest, err := read(in)
	if err != nil {
		var zero T
		return zero, wrap(err)
	}
	r.off += len(in) - len(rest)
	return v, nil
}

// wrap turns msgp's errors into the protocol's wording (a short message costs no
// allocation: errShort is a constant).
func wrap(err error) error {
	if errors.Is(err, msgp.ErrShortBytes) {
		return errShort
	}
	return typeError(err)
}

func typeError(err error) error {
	var te msgp.TypeError
	if errors.As(err, &te) {
		return wireError(fmt.Sprintf("want %s, got %s", te.Method, te.Encoded))
	}
	return wireError(err.Error())
}

// isNil consumes a nil and reports true, or leaves the input alone.
func (r *reader) isNil() bool {
	if r.off < len(r.b) && msgp.IsNil(r.b[r.off:]) {
		r.off++
		return true
	}
	return false
}

func (r *reader) readBool() (bool, error)       { return step(r, msgp.ReadBoolBytes) }
func (r *reader) readInt() (int64, error)       { return step(r, msgp.ReadInt64Bytes) }
func (r *reader) readUint() (uint64, error)     { return step(r, msgp.ReadUint64Bytes) }
func (r *reader) readFloat() (float64, error)   { return step(r, msgp.ReadFloat64Bytes) }
func (r *reader) strBytes() ([]byte, error)     { return step(r, msgp.ReadStringZC) }
func (r *reader) readBin() ([]byte, error)      { return step(r, msgp.ReadBytesZC) }
func (r *reader) readArrayHeader() (int, error) { return r.container(msgp.ReadArrayHeaderBytes, 1) }
func (r *reader) readMapHeader() (int, error)   { return r.container(msgp.ReadMapHeaderBytes, 2) }

func (r *reader) readStr() (string, error) {
	s, err := r.strBytes()
	return string(s), err
}

// container reads an array or map header whose elements take at least per bytes each,
// refusing a count larger than the bytes left.
func (r *reader) container(read func([]byte) (uint32, []byte, error), per uint64) (int, error) {
	start := r.off
	n, err := step(r, read)
	if err != nil {
		return 0, err
	}
	if uint64(n)*per > uint64(r.left()) {
		r.off = start
		return 0, errShort
	}
	return int(n), nil
}

func (r *reader) enter() error {
	if r.depth >= maxDepth {
		return wireError("nesting too deep")
	}
	r.depth++
	return nil
}

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
	if r.done() {
		return nil, errShort
	}
	switch t := msgp.NextType(r.b[r.off:]); t {
	case msgp.NilType:
		r.off++
		return nil, nil
	case msgp.BoolType:
		return built(r.readBool())(build)
	case msgp.IntType:
		return built(r.readInt())(build)
	case msgp.UintType:
		u, err := r.readUint()
		if err != nil || !build {
			return nil, err
		}
		if u <= math.MaxInt64 {
			return int64(u), nil
		}
		return u, nil
	case msgp.Float32Type, msgp.Float64Type:
		return built(r.readFloat())(build)
	case msgp.StrType:
		s, err := r.strBytes()
		if err != nil || !build {
			return nil, err
		}
		return string(s), nil
	case msgp.BinType:
		b, err := r.readBin()
		if err != nil || !build {
			return nil, err
		}
		return append([]byte{}, b...), nil
	case msgp.ArrayType:
		return r.array(build)
	case msgp.MapType:
		return r.mapValue(build)
	default:
		return nil, wireError(fmt.Sprintf("unsupported type byte %#02x (%s)", r.b[r.off], t))
	}
}

// built returns v as a value when building, and nothing (no allocation) otherwise.
func built[T any](v T, err error) func(build bool) (any, error) {
	return func(build bool) (any, error) {
		if err != nil || !build {
			return nil, err
		}
		return v, nil
	}
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
	for range n {
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
	for range n {
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

// Encoding: msgp's appenders under the names the protocol code uses.

var (
	appendNil   = msgp.AppendNil
	appendBool  = msgp.AppendBool
	appendUint  = msgp.AppendUint64
	appendFloat = msgp.AppendFloat64
	appendStr   = msgp.AppendString
	appendBin   = msgp.AppendBytes
)

// appendInt writes a signed integer; non-negative values use the unsigned forms, as
// msgpack-python does (msgp.AppendInt64 would write 200 as int16).
func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(b, uint64(v))
	}
	return msgp.AppendInt64(b, v)
}

func appendArrayHeader(b []byte, n int) []byte { return msgp.AppendArrayHeader(b, uint32(n)) }
func appendMapHeader(b []byte, n int) []byte   { return msgp.AppendMapHeader(b, uint32(n)) }

// appendInt32sBin packs int32 values little-endian into one bin: the wire form of
// page and state indices (numpy int32 .tobytes() on every host SGLang runs on).
func appendInt32sBin(b []byte, v []int32) []byte {
	b = msgp.AppendBytesHeader(b, uint32(4*len(v)))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, uint32(x))
	}
	return b
}

// appendValue encodes a generic value tree (the types decodeValue returns, plus the
// common Go integer types), map keys sorted. It exists for tests, fuzzing and debugging;
// the protocol paths use the typed appenders. Unsupported types encode as nil and
// report false.
func appendValue(b []byte, v any) ([]byte, bool) {
	switch x := v.(type) {
	case nil:
		return appendNil(b), true
	case bool:
		return appendBool(b, x), true
	case int:
		return appendInt(b, int64(x)), true
	case int32:
		return appendInt(b, int64(x)), true
	case int64:
		return appendInt(b, x), true
	case uint64:
		return appendUint(b, x), true
	case float64:
		return appendFloat(b, x), true
	case string:
		return appendStr(b, x), true
	case []byte:
		return appendBin(b, x), true
	case []any:
		b = appendArrayHeader(b, len(x))
		ok := true
		for _, e := range x {
			var k bool
			b, k = appendValue(b, e)
			ok = ok && k
		}
		return b, ok
	case map[string]any:
		b = appendMapHeader(b, len(x))
		ok := true
		for _, k := range sortedKeys(x) {
			b = appendStr(b, k)
			var e bool
			b, e = appendValue(b, x[k])
			ok = ok && e
		}
		return b, ok
	}
	return appendNil(b), false
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
