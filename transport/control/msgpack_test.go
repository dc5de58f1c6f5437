package control

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// prefixed is a header followed by n filler bytes, for the long str/bin goldens.
func prefixed(t testing.TB, head string, fill byte, n int) []byte {
	return append(unhex(t, head), bytes.Repeat([]byte{fill}, n)...)
}

func anys(n int, v any) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func keys(n int) map[string]any {
	m := make(map[string]any, n)
	for i := 0; i < n; i++ {
		m[string(rune('A'+i/26))+string(rune('a'+i%26))] = nil
	}
	return m
}

// TestGolden checks the encoder against the byte layouts of the msgpack spec
// (https://github.com/msgpack/msgpack/blob/master/spec.md), at every format boundary,
// and that the decoder reads them back.
func TestGolden(t *testing.T) {
	cases := []struct {
		name string
		v    any
		want []byte
	}{
		{"nil", nil, unhex(t, "c0")},
		{"false", false, unhex(t, "c2")},
		{"true", true, unhex(t, "c3")},
		{"fixint 0", int64(0), unhex(t, "00")},
		{"fixint 127", int64(127), unhex(t, "7f")},
		{"uint8", int64(128), unhex(t, "cc 80")},
		{"uint8 max", int64(255), unhex(t, "cc ff")},
		{"uint16", int64(256), unhex(t, "cd 01 00")},
		{"uint16 max", int64(65535), unhex(t, "cd ff ff")},
		{"uint32", int64(65536), unhex(t, "ce 00 01 00 00")},
		{"uint32 max", int64(math.MaxUint32), unhex(t, "ce ff ff ff ff")},
		{"uint64", int64(1 << 32), unhex(t, "cf 00 00 00 01 00 00 00 00")},
		{"int64 max", int64(math.MaxInt64), unhex(t, "cf 7f ff ff ff ff ff ff ff")},
		{"uint64 max", uint64(math.MaxUint64), unhex(t, "cf ff ff ff ff ff ff ff ff")},
		{"negative fixint -1", int64(-1), unhex(t, "ff")},
		{"negative fixint -32", int64(-32), unhex(t, "e0")},
		{"int8", int64(-33), unhex(t, "d0 df")},
		{"int8 min", int64(-128), unhex(t, "d0 80")},
		{"int16", int64(-129), unhex(t, "d1 ff 7f")},
		{"int16 min", int64(-32768), unhex(t, "d1 80 00")},
		{"int32", int64(-32769), unhex(t, "d2 ff ff 7f ff")},
		{"int32 min", int64(math.MinInt32), unhex(t, "d2 80 00 00 00")},
		{"int64", int64(math.MinInt32) - 1, unhex(t, "d3 ff ff ff ff 7f ff ff ff")},
		{"int64 min", int64(math.MinInt64), unhex(t, "d3 80 00 00 00 00 00 00 00")},
		{"float64", 1.5, unhex(t, "cb 3f f8 00 00 00 00 00 00")},
		{"float64 -0", math.Copysign(0, -1), unhex(t, "cb 80 00 00 00 00 00 00 00")},
		{"fixstr empty", "", unhex(t, "a0")},
		{"fixstr", "abc", unhex(t, "a3 61 62 63")},
		{"fixstr utf-8", "é", unhex(t, "a2 c3 a9")},
		{"fixstr 31", strings.Repeat("x", 31), prefixed(t, "bf", 'x', 31)},
		{"str8", strings.Repeat("x", 32), prefixed(t, "d9 20", 'x', 32)},
		{"str8 max", strings.Repeat("x", 255), prefixed(t, "d9 ff", 'x', 255)},
		{"str16", strings.Repeat("x", 256), prefixed(t, "da 01 00", 'x', 256)},
		{"str32", strings.Repeat("x", 65536), prefixed(t, "db 00 01 00 00", 'x', 65536)},
		{"bin8 empty", []byte{}, unhex(t, "c4 00")},
		{"bin8", []byte{1, 2}, unhex(t, "c4 02 01 02")},
		{"bin16", bytes.Repeat([]byte{7}, 256), prefixed(t, "c5 01 00", 7, 256)},
		{"bin32", bytes.Repeat([]byte{7}, 65536), prefixed(t, "c6 00 01 00 00", 7, 65536)},
		{"fixarray empty", []any{}, unhex(t, "90")},
		{"fixarray", []any{int64(1), "a", nil}, unhex(t, "93 01 a1 61 c0")},
		{"fixarray 15", anys(15, nil), prefixed(t, "9f", 0xc0, 15)},
		{"array16", anys(16, nil), prefixed(t, "dc 00 10", 0xc0, 16)},
		{"array32", anys(65536, nil), prefixed(t, "dd 00 01 00 00", 0xc0, 65536)},
		{"fixmap empty", map[string]any{}, unhex(t, "80")},
		// The spec's own example: {"compact": true, "schema": 0}.
		{"fixmap spec example", map[string]any{"compact": true, "schema": int64(0)},
			unhex(t, "82 a7 63 6f 6d 70 61 63 74 c3 a6 73 63 68 65 6d 61 00")},
		{"nested", map[string]any{"a": []any{map[string]any{"b": []byte{9}}}},
			unhex(t, "81 a1 61 91 81 a1 62 c4 01 09")},
	}
	for _, c := range cases {
		got, ok := appendValue(nil, c.v)
		if !ok || !bytes.Equal(got, c.want) {
			t.Errorf("%s: encoded % x (ok %v), want % x", c.name, head(got), ok, head(c.want))
			continue
		}
		back, err := decodeValue(c.want)
		if err != nil {
			t.Errorf("%s: decode: %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(back, c.v) && !(c.name == "float64 -0" && math.Signbit(back.(float64))) {
			t.Errorf("%s: decoded %#v, want %#v", c.name, back, c.v)
		}
	}
	// map16 and map32: key order is sorted, so check the header and count only.
	for n, hdr := range map[int]string{16: "de 00 10", 65536: "df 00 01 00 00"} {
		got, _ := appendValue(nil, keys(n))
		if !bytes.HasPrefix(got, unhex(t, hdr)) {
			t.Errorf("map of %d: header % x", n, head(got))
		}
		if back, err := decodeValue(got); err != nil || len(back.(map[string]any)) != n {
			t.Errorf("map of %d: decode %v", n, err)
		}
	}
}

func head(b []byte) []byte {
	if len(b) > 12 {
		return b[:12]
	}
	return b
}

// TestDecodeLenient covers forms other encoders produce that the decoder must accept:
// non-minimal integers and float32.
func TestDecodeLenient(t *testing.T) {
	cases := []struct {
		in   string
		want any
	}{
		{"cc 05", int64(5)},
		{"cd 00 05", int64(5)},
		{"cf 00 00 00 00 00 00 00 05", int64(5)},
		{"d0 05", int64(5)},
		{"d3 ff ff ff ff ff ff ff ff", int64(-1)},
		{"ca 3f c0 00 00", 1.5},
		{"d9 01 61", "a"},
		{"dc 00 01 c3", []any{true}},
		{"de 00 01 a1 6b c0", map[string]any{"k": nil}},
	}
	for _, c := range cases {
		got, err := decodeValue(unhex(t, c.in))
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("% s: %#v, %v; want %#v", c.in, got, err, c.want)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	deep := strings.Repeat("91", maxDepth+1) + "c0"
	for _, in := range []string{
		"", "c1", "c7 01 00 00", "d4 00 00", "d8 00" + strings.Repeat("00", 16),
		"cc", "cd 00", "ce 00 00 00", "cf 00", "d0", "d3 00",
		"ca 00 00", "cb 00", "a1", "d9", "d9 05 61", "da 00", "db 00 00 00 09 61",
		"c4", "c4 02 00", "c5 00", "c6 ff ff ff ff",
		"91", "dc 00", "dd 7f ff ff ff c0", "81 a1 61", "df 00 00 10 00",
		"81 01 02", // non-str key
		"c0 c0",    // trailing bytes
		deep,
	} {
		if v, err := decodeValue(unhex(t, in)); err == nil {
			t.Errorf("% s decoded to %#v, want an error", in, v)
		}
	}
	// Depth just inside the limit is fine.
	if _, err := decodeValue(unhex(t, strings.Repeat("91", maxDepth)+"c0")); err != nil {
		t.Errorf("depth %d: %v", maxDepth, err)
	}
}

func TestTypedReadersRejectMismatch(t *testing.T) {
	r := reader{b: unhex(t, "a1 61")}
	if _, err := r.readUint(); err == nil || r.off != 0 {
		t.Fatalf("readUint on str: %v, off %d", err, r.off)
	}
	r = reader{b: unhex(t, "ff")}
	if _, err := r.readUint(); err == nil {
		t.Fatal("readUint of -1 succeeded")
	}
	r = reader{b: unhex(t, "cf ff ff ff ff ff ff ff ff")}
	if _, err := r.readInt(); err == nil {
		t.Fatal("readInt of MaxUint64 succeeded")
	}
}

// randValue builds a random value tree of the subset's types.
func randValue(rng *rand.Rand, depth int) any {
	k := rng.IntN(9)
	if depth > 3 && k >= 7 {
		k = rng.IntN(7)
	}
	switch k {
	case 0:
		return nil
	case 1:
		return rng.IntN(2) == 1
	case 2:
		shift := rng.IntN(64)
		v := int64(rng.Uint64() >> shift)
		if rng.IntN(2) == 1 {
			v = -v
		}
		return v
	case 3:
		return rng.Uint64() | 1<<63
	case 4:
		return rng.NormFloat64() * 1e6
	case 5:
		b := make([]byte, rng.IntN(300))
		for i := range b {
			b[i] = byte('a' + rng.IntN(26))
		}
		return string(b)
	case 6:
		b := make([]byte, rng.IntN(300))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return b
	case 7:
		a := make([]any, rng.IntN(20))
		for i := range a {
			a[i] = randValue(rng, depth+1)
		}
		return a
	}
	m := map[string]any{}
	for i := rng.IntN(20); i > 0; i-- {
		m[fmt.Sprintf("k%d", rng.IntN(1000))] = randValue(rng, depth+1)
	}
	return m
}

func TestRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 500; i++ {
		v := randValue(rng, 0)
		b, ok := appendValue(nil, v)
		if !ok {
			t.Fatalf("encode %#v failed", v)
		}
		back, err := decodeValue(b)
		if err != nil {
			t.Fatalf("decode of %#v: %v", v, err)
		}
		if !reflect.DeepEqual(normalize(v), normalize(back)) {
			t.Fatalf("round trip: %#v became %#v", v, back)
		}
	}
}

// normalize maps empty byte slices to a canonical non-nil form for DeepEqual.
func normalize(v any) any {
	switch x := v.(type) {
	case []byte:
		return append([]byte{}, x...)
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = normalize(x[i])
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	}
	return v
}

func TestInt32sBin(t *testing.T) {
	in := []int32{0, 1, -1, math.MaxInt32, math.MinInt32}
	b := appendInt32sBin(nil, in)
	if want := unhex(t, "c4 14 00000000 01000000 ffffffff ffffff7f 00000080"); !bytes.Equal(b, want) {
		t.Fatalf("packed % x, want % x", b, want)
	}
	r := reader{b: b}
	got, err := readInt32sBin(&r)
	if err != nil || !reflect.DeepEqual(got, in) {
		t.Fatalf("unpacked %v, %v", got, err)
	}
}

// TestHostileHeadersAllocateNothing: a short message whose str, bin, array or map header
// announces up to 4 GiB is refused before anything is allocated for it, whether it is a
// whole value, an unknown request field (skipped) or a known one. (Nesting past maxDepth
// is refused too; building the levels before it allocates one small slice each.)
func TestHostileHeadersAllocateNothing(t *testing.T) {
	for _, in := range []string{
		"c6 ff ff ff ff 00", "db ff ff ff ff 61", "dd ff ff ff ff c0", "df ff ff ff ff a1 61 c0",
		"dc ff ff c0", "de ff ff a1 61", strings.Repeat("91", 4*maxDepth) + "c0",
	} {
		b := unhex(t, in)
		if b[0] != 0x91 && testing.AllocsPerRun(100, func() {
			if _, err := decodeValue(b); err == nil {
				t.Fatalf("% s decoded", in)
			}
		}) != 0 {
			t.Errorf("decodeValue(% s) allocated", in)
		}
		for _, key := range []string{"junk", "pages", "rooms", "reqs", "buffers"} {
			msg := append(appendStr(appendMapHeader(nil, 1), key), b...)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range 100 {
				if q, err := decodeRequest(msg); err == nil && q.err == nil {
					t.Fatalf("%s: % s accepted", key, in)
				}
			}
			runtime.ReadMemStats(&after)
			if per := (after.TotalAlloc - before.TotalAlloc) / 100; per > 4096 {
				t.Errorf("%s: % s: %d bytes allocated per request", key, in, per)
			}
		}
	}
}
