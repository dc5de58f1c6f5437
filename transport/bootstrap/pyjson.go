package bootstrap

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/kvxfer/kvxfer/transport/wire"
)

// JSON the way SGLang's Python peers write it: json.dumps with its default separators
// (", " and ": "), ensure_ascii, keys in insertion order. Decoders only need valid JSON, but
// matching the bytes keeps captures and golden tests comparable with upstream.

type pyObject struct {
	buf []byte
	n   int
}

func (o *pyObject) key(k string) {
	if o.n == 0 {
		o.buf = append(o.buf, '{')
	} else {
		o.buf = append(o.buf, ", "...)
	}
	o.n++
	o.buf = appendPyString(o.buf, k)
	o.buf = append(o.buf, ": "...)
}

func (o *pyObject) Int(k string, v int64) { o.key(k); o.buf = strconv.AppendInt(o.buf, v, 10) }
func (o *pyObject) Str(k, v string)       { o.key(k); o.buf = appendPyString(o.buf, v) }
func (o *pyObject) Bool(k string, v bool) { o.key(k); o.buf = strconv.AppendBool(o.buf, v) }
func (o *pyObject) Null(k string)         { o.key(k); o.buf = append(o.buf, "null"...) }

func (o *pyObject) OptInt(k string, v *int64) {
	if v == nil {
		o.Null(k)
	} else {
		o.Int(k, *v)
	}
}

func (o *pyObject) OptStr(k string, v *string) {
	if v == nil {
		o.Null(k)
	} else {
		o.Str(k, *v)
	}
}

func (o *pyObject) Bytes() []byte {
	if o.n == 0 {
		return []byte("{}")
	}
	return append(o.buf, '}')
}

// appendPyString quotes s like json.dumps(ensure_ascii=True).
func appendPyString(b []byte, s string) []byte {
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"':
			b = append(b, `\"`...)
		case r == '\\':
			b = append(b, `\\`...)
		case r == '\n':
			b = append(b, `\n`...)
		case r == '\r':
			b = append(b, `\r`...)
		case r == '\t':
			b = append(b, `\t`...)
		case r == '\b':
			b = append(b, `\b`...)
		case r == '\f':
			b = append(b, `\f`...)
		case r < 0x20 || (r >= 0x7f && r < 0x10000):
			b = fmt.Appendf(b, `\u%04x`, r)
		case r >= 0x10000:
			r -= 0x10000
			b = fmt.Appendf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

// pyInt converts a decoded JSON value the way Python's int(x) would for the types JSON can
// carry: integers as they are, floats truncated toward zero, booleans as 0/1, strings by
// int()'s grammar. null, lists and objects are errors (TypeError upstream).
func pyInt(v any) (int64, error) {
	switch x := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return i, nil
		}
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) || f >= math.MaxInt64 || f < math.MinInt64 {
			return 0, fmt.Errorf("number %s out of range", x)
		}
		return int64(f), nil
	case bool:
		if x {
			return 1, nil
		}
		return 0, nil
	case string:
		return wire.ParsePyInt([]byte(x))
	case nil:
		return 0, fmt.Errorf("null is not an integer")
	}
	return 0, fmt.Errorf("%T is not an integer", v)
}

// pyTruthy is Python's bool(x) for decoded JSON values.
func pyTruthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case json.Number:
		f, err := x.Float64()
		return err != nil || f != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return true
}
