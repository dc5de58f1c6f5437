package control

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// fuzzSeeds are requests of every op plus a few malformed ones; the checked-in corpus
// under testdata/fuzz adds more.
func fuzzSeeds(t testing.TB) [][]byte {
	reqs := []map[string]any{
		{"id": int64(1), "op": "hello", "version": int64(1), "rank": int64(0)},
		{"id": int64(2), "op": "open", "room": int64(7), "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{"id": int64(3), "op": "init", "room": int64(7), "num_pages": int64(3), "aux_index": int64(1)},
		{"id": int64(4), "op": "send", "room": int64(7), "pages": appendInt32sBin(nil, []int32{1, 2})[2:], "state": []any{[]byte{1, 0, 0, 0}, nil}},
		{"id": int64(5), "op": "poll", "rooms": []any{int64(7), int64(8)}},
		{"id": int64(6), "op": "failure", "rooms": []any{int64(7)}, "clear": true},
		{"id": int64(7), "op": "abort", "room": int64(7)},
		{"id": int64(8), "op": "register_memory", "kind": "kv", "buffers": []any{
			map[string]any{"shm": "psm_1", "offset": int64(0), "length": int64(4096), "item_len": int64(256), "mem": "DRAM", "dev": int64(0)}}},
		{"id": int64(10), "op": "register_memory", "kind": "aux", "buffers": []any{
			map[string]any{"memfd": int64(5), "offset": int64(4096), "length": int64(4096), "item_len": int64(64), "mem": "DRAM", "dev": int64(0)}}},
		{"id": int64(11), "op": "lost", "rooms": []any{int64(7), int64(8)}},
		{"id": int64(9), "op": "batch", "reqs": []any{map[string]any{"op": "clear", "rooms": []any{int64(7)}}, map[string]any{"op": "pop_decode_prefix_len", "room": int64(7)}}},
	}
	var out [][]byte
	for _, r := range reqs {
		out = append(out, enc(t, r))
	}
	return append(out, []byte{}, []byte{0xc1}, []byte{0x81, 0xa2, 'i', 'd'}, []byte{0xdf, 0xff, 0xff, 0xff, 0xff})
}

// FuzzDecodeRequest feeds arbitrary bytes to the request decoder and then to the
// server's handler (with a stub engine and memory callback, no socket): neither may
// panic, and every reply must be a msgpack map with a bool ok and, on failure, a code.
// fuzz-smoke: 50000x
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	stub := newStub()
	stub.replies[7] = kv.Reply{Status: kv.StatusFailed, Reason: kv.ReasonPeerLost, PrefixLen: 3}
	s := &Server{cfg: Config{Engine: stub, MaxMessage: 1 << 20, Memory: func(*MemoryRegistration) error { return nil },
		Lost: func(rooms []uint64) int { return len(rooms) }},
		log: slog.New(slog.DiscardHandler)}
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := decodeRequest(b)
		if err != nil {
			q = &request{err: errorf(CodeBadRequest, "%v", err)}
		}
		out := s.handle(nil, q, true)
		v, err := decodeValue(out)
		if err != nil {
			t.Fatalf("reply does not decode: %v (% x)", err, out)
		}
		m, _ := v.(map[string]any)
		ok, isBool := m["ok"].(bool)
		if !isBool {
			t.Fatalf("reply without ok: %v", m)
		}
		if !ok {
			if code, _ := m["code"].(string); code == "" {
				t.Fatalf("error reply without code: %v", m)
			}
		}
		if s.panics.Load() != 0 {
			t.Fatal("handler panicked")
		}
	})
}

// FuzzMsgpack checks the generic decoder: no panic, and whatever decodes re-encodes to
// a canonical form that is a fixed point (decode∘encode is the identity on it).
// fuzz-smoke: 50000x
func FuzzMsgpack(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Add([]byte{0xca, 0x7f, 0xc0, 0, 0}) // float32 NaN
	f.Add([]byte{0xd0, 0x05})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeValue(b)
		if err != nil {
			return
		}
		b1, ok := appendValue(nil, v)
		if !ok {
			t.Fatalf("decoded %#v does not encode", v)
		}
		v2, err := decodeValue(b1)
		if err != nil {
			t.Fatalf("re-encoding does not decode: %v", err)
		}
		b2, _ := appendValue(nil, v2)
		if !bytes.Equal(b1, b2) {
			t.Fatalf("not a fixed point:\n% x\n% x", b1, b2)
		}
	})
}
