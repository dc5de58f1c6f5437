package control

import (
	"encoding/binary"
	"math"
)

// The msgpack subset (https://github.com/msgpack/msgpack/blob/master/spec.md) that the
// control protocol uses: nil, bool, int, float64, str, bin, array and map. Ext types and
// timestamps are not part of it. The encoder always picks the shortest form, which is
// what Python's msgpack.packb does, so golden bytes match across languages.
//
// Encoding is append-style on a caller-owned slice so that the server's reply loop and
// the client reuse one buffer and allocate nothing per message.

func appendNil(b []byte) []byte { return append(b, 0xc0) }

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xc3)
	}
	return append(b, 0xc2)
}

// appendInt writes a signed integer; non-negative values use the unsigned forms, as
// the spec recommends and msgpack-python does.
func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return appendUint(b, uint64(v))
	}
	switch {
	case v >= -32:
		return append(b, byte(v))
	case v >= math.MinInt8:
		return append(b, 0xd0, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

func appendUint(b []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

// appendFloat always writes float64 (0xcb), like msgpack-python for a Python float.
func appendFloat(b []byte, v float64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(v))
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n <= 31:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func appendBinHeader(b []byte, n int) []byte {
	switch {
	case n <= math.MaxUint8:
		return append(b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
}

func appendBin(b []byte, v []byte) []byte { return append(appendBinHeader(b, len(v)), v...) }

func appendArrayHeader(b []byte, n int) []byte {
	switch {
	case n <= 15:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

func appendMapHeader(b []byte, n int) []byte {
	switch {
	case n <= 15:
		return append(b, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
}

// appendInt32sBin packs int32 values little-endian into one bin: the wire form of
// page and state indices (numpy int32 .tobytes() on every host SGLang runs on).
func appendInt32sBin(b []byte, v []int32) []byte {
	b = appendBinHeader(b, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, uint32(x))
	}
	return b
}

// appendValue encodes a generic value tree (the types decodeValue returns, plus the
// common Go integer types). It exists for tests, fuzzing and debugging; the protocol
// paths use the typed appenders. Unsupported types encode as nil and report false.
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
