package wire

import (
	"errors"
	"reflect"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// Golden frames below are written by hand from the tables of the protocol spec
// (§4.3a/b/c/e, §9.2): every binary frame is spelled out byte by byte, little-endian,
// independently of the encoders under test.

func fr(ss ...string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

const agentUUID = "7f1c9a5e-0000-4000-8000-000000000001"

// Baseline registration: GUARD + msg[0..18] (§4.3a).
func goldenRegistrationFrames() [][]byte {
	return fr(
		"NixlMsgGuard",
		"None",           // [0]
		"10.0.0.7",       // [1] local_ip
		"41235",          // [2] rank_port
		agentUUID,        // [3] agent name
		"\x00\x01MD\xff", // [4] opaque agent metadata
		// [5] kv ptrs: 0x00007f0000001000, 0x00007f0000002000 (u64 LE)
		"\x00\x10\x00\x00\x00\x7f\x00\x00"+"\x00\x20\x00\x00\x00\x7f\x00\x00",
		"\x00\x50\x00\x00\x00\x00\x00\x00", // [6] aux ptrs: 0x5000
		// [7] state ptrs pack_int_lists([[0x1000], []], "Q"): n=2, lens 8 and 0, payload
		"\x02\x00\x00\x00"+"\x08\x00\x00\x00"+"\x00\x00\x00\x00"+"\x00\x10\x00\x00\x00\x00\x00\x00",
		"3",    // [8] gpu_id
		"2",    // [9] attn_tp_size
		"1",    // [10] engine_rank
		"4096", // [11] kv_item_lens[0]
		// [12] state item lens pack_int_lists([[64, 128]], "I")
		"\x01\x00\x00\x00"+"\x08\x00\x00\x00"+"\x40\x00\x00\x00"+"\x80\x00\x00\x00",
		"",          // [13] state dims: none
		"",          // [14] staging base ptr: none
		"",          // [15] staging size: none
		"1000",      // [16] dst_num_slots
		"VRAM,DRAM", // [17] mem kinds
		// [18] kv item lens u64 LE: 4096, 8192
		"\x00\x10\x00\x00\x00\x00\x00\x00"+"\x00\x20\x00\x00\x00\x00\x00\x00",
	)
}

func goldenRegistration() *Registration {
	return &Registration{
		DecodeIP: "10.0.0.7", DecodePort: 41235, AgentName: agentUUID,
		AgentMetadata: []byte("\x00\x01MD\xff"),
		KVDataPtrs:    []uint64{0x00007f0000001000, 0x00007f0000002000},
		AuxDataPtrs:   []uint64{0x5000},
		StateDataPtrs: [][]uint64{{0x1000}, {}},
		GPUID:         3, DecodeTPSize: 2, DecodeTPRank: 1, DstKVItemLen: 4096,
		StateItemLens: [][]uint32{{64, 128}},
		DstNumSlots:   1000, HasDstNumSlots: true,
		KVMemKinds: []MemKind{MemVRAM, MemDRAM},
		KVItemLens: []uint64{4096, 8192},
		DCPSize:    1,
	}
}

func mustInbound(t *testing.T, frames [][]byte) Inbound {
	t.Helper()
	m, err := DecodeInbound(frames)
	if err != nil {
		t.Fatalf("DecodeInbound: %v", err)
	}
	return m
}

func TestGoldenRegistrationBaseline(t *testing.T) {
	frames := goldenRegistrationFrames()
	got, ok := mustInbound(t, frames).(*Registration)
	if !ok {
		t.Fatalf("not a registration")
	}
	want := goldenRegistration()
	want.Frames = len(frames) - 1
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
	if enc := got.Encode(); !reflect.DeepEqual(enc, frames) {
		t.Fatalf("Encode is not byte-exact:\n%q\nwant\n%q", enc, frames)
	}
}

func TestGoldenRegistrationLater(t *testing.T) {
	frames := append(goldenRegistrationFrames(), fr(
		"\x01\x00\x00\x00"+"\x04\x00\x00\x00"+"\x05\x00\x00\x00", // [19] state_layer_ids [[5]]
		"\x00\x00\x00\x00"+"\x01\x00\x00\x00",                    // [20] kv_layer_ids [0, 1] (u32 LE)
		"2",                                                      // [21] dcp_size
		"1",                                                      // [22] dcp_rank
	)...)
	got := mustInbound(t, frames).(*Registration)
	want := goldenRegistration()
	want.HasLayerInfo = true
	want.StateLayerIDs = [][]uint32{{5}}
	want.KVLayerIDs = []uint32{0, 1}
	want.DCPSize, want.DCPRank = 2, 1
	want.Frames = len(frames) - 1
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
	if enc := got.Encode(); !reflect.DeepEqual(enc, frames) {
		t.Fatalf("Encode is not byte-exact:\n%q\nwant\n%q", enc, frames)
	}
	// A trailing frame that is not 0.5.23's state_data_lens is ignored (but counted).
	got2 := mustInbound(t, append(frames, []byte("future"))).(*Registration)
	want.Frames++
	if !reflect.DeepEqual(got2, want) {
		t.Fatalf("trailing frame changed the result: %+v", got2)
	}
}

// The oldest layout upstream still parses: msg[0..11] only. Every optional frame falls back.
func TestGoldenRegistrationFallbacks(t *testing.T) {
	minimal := goldenRegistrationFrames()[:13] // GUARD + msg[0..11]
	want := &Registration{
		DecodeIP: "10.0.0.7", DecodePort: 41235, AgentName: agentUUID,
		AgentMetadata: []byte("\x00\x01MD\xff"),
		KVDataPtrs:    []uint64{0x00007f0000001000, 0x00007f0000002000},
		AuxDataPtrs:   []uint64{0x5000},
		StateDataPtrs: [][]uint64{{0x1000}, {}},
		GPUID:         3, DecodeTPSize: 2, DecodeTPRank: 1, DstKVItemLen: 4096,
		KVMemKinds: []MemKind{MemVRAM, MemVRAM}, // absent -> all VRAM
		KVItemLens: []uint64{4096, 4096},        // absent -> [dst_kv_item_len] * len(kv_ptrs)
		DCPSize:    1,
		Frames:     12,
	}
	if got := mustInbound(t, minimal).(*Registration); !reflect.DeepEqual(got, want) {
		t.Fatalf("minimal:\n%+v\nwant\n%+v", got, want)
	}
	// All optional frames present but empty: same fallbacks, state ptrs empty too.
	empty := goldenRegistrationFrames()
	for _, i := range []int{7, 12, 13, 14, 15, 16, 17, 18} {
		empty[1+i] = []byte{}
	}
	want.StateDataPtrs = nil
	want.Frames = len(empty) - 1
	if got := mustInbound(t, empty).(*Registration); !reflect.DeepEqual(got, want) {
		t.Fatalf("empty optionals:\n%+v\nwant\n%+v", got, want)
	}
	// Staging fields.
	st := goldenRegistrationFrames()
	st[1+14] = []byte("\x00\x00\x00\x10\x00\x00\x00\x00") // 0x10000000
	st[1+15] = []byte("67108864")
	got := mustInbound(t, st).(*Registration)
	if got.StagingBasePtr != 0x10000000 || got.StagingTotalSize != 67108864 {
		t.Fatalf("staging = %#x, %d", got.StagingBasePtr, got.StagingTotalSize)
	}
	if enc := got.Encode(); !reflect.DeepEqual(enc, st) {
		t.Fatalf("staging Encode:\n%q\nwant\n%q", enc, st)
	}
	// A staging base ptr that is not 8 bytes reads as 0, as upstream.
	st[1+14] = []byte("\x01\x02")
	if got := mustInbound(t, st).(*Registration); got.StagingBasePtr != 0 {
		t.Fatalf("short staging ptr = %#x", got.StagingBasePtr)
	}
}

func TestRegistrationLayerInfoFromOtherFork(t *testing.T) {
	// A fork that puts an ASCII count at msg[19]: ignored, registration still accepted.
	frames := append(goldenRegistrationFrames(), []byte("32"))
	got := mustInbound(t, frames).(*Registration)
	if got.HasLayerInfo || got.LayerInfoErr == nil || got.DCPSize != 1 {
		t.Fatalf("HasLayerInfo=%v LayerInfoErr=%v DCPSize=%d", got.HasLayerInfo, got.LayerInfoErr, got.DCPSize)
	}
}

func TestRegistrationErrors(t *testing.T) {
	cases := []struct {
		name  string
		mut   func([][]byte) [][]byte
		frame int
		want  error
	}{
		{"too few", func(f [][]byte) [][]byte { return f[:12] }, 12, ErrTooFewFrames},
		{"kv ptrs not multiple of 8", func(f [][]byte) [][]byte { f[6] = f[6][:15]; return f }, 6, ErrBadFrame},
		{"aux ptrs not multiple of 8", func(f [][]byte) [][]byte { f[7] = []byte("abc"); return f }, 7, ErrBadFrame},
		{"bad port", func(f [][]byte) [][]byte { f[3] = []byte("70000"); return f }, 3, ErrBadFrame},
		{"non-ascii ip", func(f [][]byte) [][]byte { f[2] = []byte("\xff"); return f }, 2, ErrBadFrame},
		{"bad gpu", func(f [][]byte) [][]byte { f[9] = []byte("x"); return f }, 9, ErrBadFrame},
		{"negative item len", func(f [][]byte) [][]byte { f[12] = []byte("-1"); return f }, 12, ErrBadFrame},
		{"bad state ptrs", func(f [][]byte) [][]byte { f[8] = []byte("\x05\x00\x00\x00"); return f }, 8, ErrBadFrame},
		{"mem kinds count", func(f [][]byte) [][]byte { f[18] = []byte("VRAM"); return f }, 18, ErrBadFrame},
		{"mem kind unknown", func(f [][]byte) [][]byte { f[18] = []byte("VRAM,HBM"); return f }, 18, ErrBadFrame},
		{"item lens count", func(f [][]byte) [][]byte { f[19] = f[19][:8]; return f }, 19, ErrBadFrame},
		{"bad num slots", func(f [][]byte) [][]byte { f[17] = []byte("many"); return f }, 17, ErrBadFrame},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeInbound(c.mut(goldenRegistrationFrames()))
			var fe *FrameError
			if !errors.As(err, &fe) || !errors.Is(err, c.want) || fe.Frame != c.frame || fe.Kind != KindRegistration {
				t.Fatalf("err = %v (frame %d); want %v at frame %d", err, frameOf(err), c.want, c.frame)
			}
		})
	}
}

func frameOf(err error) int {
	var fe *FrameError
	if errors.As(err, &fe) {
		return fe.Frame
	}
	return -2
}

// Baseline transfer info: GUARD + msg[0..8] (§4.3b).
func goldenTransferInfoFrames() [][]byte {
	return fr(
		"NixlMsgGuard",
		"12345678901234", // [0] room
		"10.0.0.7",       // [1]
		"41235",          // [2]
		agentUUID,        // [3]
		"\x07\x00\x00\x00"+"\x08\x00\x00\x00"+"\x09\x00\x00\x00", // [4] int32 LE [7, 8, 9]
		"5", // [5] aux index
		"1", // [6] required_dst_info_num
		// [7] pack_int_lists([[3], [-1]], "i")
		"\x02\x00\x00\x00"+"\x04\x00\x00\x00"+"\x04\x00\x00\x00"+"\x03\x00\x00\x00"+"\xff\xff\xff\xff",
		"0", // [8] decode_prefix_len
	)
}

func goldenTransferInfo() *TransferInfo {
	return &TransferInfo{
		Room: 12345678901234, DecodeIP: "10.0.0.7", DecodePort: 41235, AgentName: agentUUID,
		DstKVIndices: []int32{7, 8, 9}, DstAuxIndex: 5, RequiredDstInfoNum: 1,
		DstStateIndices: [][]int32{{3}, {-1}},
		DecodePrefixLen: 0, HasDecodePrefixLen: true,
	}
}

func TestGoldenTransferInfo(t *testing.T) {
	frames := goldenTransferInfoFrames()
	got := mustInbound(t, frames).(*TransferInfo)
	if want := goldenTransferInfo(); !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
	if got.IsDummy() {
		t.Fatal("non-empty indices must not be dummy")
	}
	if enc := got.Encode(); !reflect.DeepEqual(enc, frames) {
		t.Fatalf("Encode:\n%q\nwant\n%q", enc, frames)
	}
	// Later variant: msg[9] is_dummy.
	later := append(goldenTransferInfoFrames(), []byte("0"))
	gotL := mustInbound(t, later).(*TransferInfo)
	if !gotL.HasIsDummy || gotL.DummyFlag || gotL.IsDummy() {
		t.Fatalf("later variant: %+v", gotL)
	}
	if enc := gotL.Encode(); !reflect.DeepEqual(enc, later) {
		t.Fatalf("later Encode:\n%q\nwant\n%q", enc, later)
	}
	// Trailing frames tolerated.
	if _, err := DecodeInbound(append(later, []byte("x"), []byte("y"))); err != nil {
		t.Fatal(err)
	}
}

func TestTransferInfoDummyRule(t *testing.T) {
	mk := func(indices, prefix string, extra ...string) *TransferInfo {
		f := goldenTransferInfoFrames()
		f[5] = []byte(indices)
		f[8] = []byte("") // dummy: no state
		f[9] = []byte(prefix)
		f = append(f, fr(extra...)...)
		return mustInbound(t, f).(*TransferInfo)
	}
	cases := []struct {
		name string
		ti   *TransferInfo
		want bool
	}{
		{"empty, prefix 0", mk("", "0"), true},
		{"empty, prefix None", mk("", ""), true},
		{"empty, prefix 64 (full decode-cache hit)", mk("", "64"), false},
		{"pages, prefix 0", mk("\x01\x00\x00\x00", "0"), false},
		{"explicit 0 overrides rule", mk("", "0", "0"), false},
		{"explicit 1 overrides rule", mk("\x01\x00\x00\x00", "0", "1"), true},
		{"explicit empty frame: rule applies", mk("", "0", ""), true},
	}
	for _, c := range cases {
		if got := c.ti.IsDummy(); got != c.want {
			t.Errorf("%s: IsDummy = %v, want %v", c.name, got, c.want)
		}
	}
	// Legacy 7-frame message (no state, no prefix): prefix is None, state empty.
	legacy := goldenTransferInfoFrames()[:8]
	ti := mustInbound(t, legacy).(*TransferInfo)
	if ti.HasDecodePrefixLen || ti.DstStateIndices != nil || ti.IsDummy() {
		t.Fatalf("legacy: %+v", ti)
	}
}

func TestTransferInfoErrors(t *testing.T) {
	cases := []struct {
		name    string
		mut     func([][]byte) [][]byte
		frame   int
		want    error
		hasRoom bool
	}{
		{"GUARD only", func(f [][]byte) [][]byte { return f[:1] }, 1, ErrTooFewFrames, false},
		{"room not int", func(f [][]byte) [][]byte { f[1] = []byte("room"); return f }, 1, ErrBadFrame, false},
		{"room negative", func(f [][]byte) [][]byte { f[1] = []byte("-1"); return f }, 1, ErrBadFrame, false},
		{"room 2^63", func(f [][]byte) [][]byte { f[1] = []byte("9223372036854775808"); return f }, 1, ErrBadFrame, false},
		{"too few", func(f [][]byte) [][]byte { return f[:7] }, 7, ErrTooFewFrames, true},
		{"indices not multiple of 4", func(f [][]byte) [][]byte { f[5] = f[5][:5]; return f }, 5, ErrBadFrame, true},
		{"aux empty", func(f [][]byte) [][]byte { f[6] = nil; return f }, 6, ErrBadFrame, true},
		{"state truncated", func(f [][]byte) [][]byte { f[8] = f[8][:15]; return f }, 8, ErrBadFrame, true},
		{"prefix garbage", func(f [][]byte) [][]byte { f[9] = []byte("1.5"); return f }, 9, ErrBadFrame, true},
		{"is_dummy garbage", func(f [][]byte) [][]byte { return append(f, []byte("yes")) }, 10, ErrBadFrame, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeInbound(c.mut(goldenTransferInfoFrames()))
			var fe *FrameError
			if !errors.As(err, &fe) || !errors.Is(err, c.want) || fe.Frame != c.frame || fe.HasRoom != c.hasRoom {
				t.Fatalf("err = %v; want %v at frame %d (hasRoom %v)", err, c.want, c.frame, c.hasRoom)
			}
			if c.hasRoom && fe.Room != 12345678901234 {
				t.Fatalf("room = %d", fe.Room)
			}
		})
	}
	// Max room is accepted.
	f := goldenTransferInfoFrames()
	f[1] = []byte("9223372036854775807")
	if ti := mustInbound(t, f).(*TransferInfo); ti.Room != 1<<63-1 {
		t.Fatalf("room = %d", ti.Room)
	}
}

func TestGoldenAbort(t *testing.T) {
	full := fr("ABORT", "42", "10.0.0.7", "41235")
	a := mustInbound(t, full).(*Abort)
	if want := (&Abort{Room: 42, DecodeIP: "10.0.0.7", DecodePort: 41235, HasEndpoint: true}); !reflect.DeepEqual(a, want) {
		t.Fatalf("abort = %+v", a)
	}
	if enc := a.Encode(); !reflect.DeepEqual(enc, full) {
		t.Fatalf("Encode = %q", enc)
	}
	two := mustInbound(t, fr("ABORT", "42")).(*Abort)
	if two.Room != 42 || two.HasEndpoint || two.EndpointErr != nil {
		t.Fatalf("2 frames: %+v", two)
	}
	if enc := two.Encode(); !reflect.DeepEqual(enc, fr("ABORT", "42")) {
		t.Fatalf("Encode = %q", enc)
	}
	three := mustInbound(t, fr("ABORT", "42", "10.0.0.7")).(*Abort)
	if three.Room != 42 || three.HasEndpoint || three.EndpointErr == nil {
		t.Fatalf("3 frames: %+v", three)
	}
	five := mustInbound(t, fr("ABORT", "42", "10.0.0.7", "41235", "token")).(*Abort)
	if !five.HasEndpoint || five.Room != 42 {
		t.Fatalf("5 frames: %+v", five)
	}
	badPort := mustInbound(t, fr("ABORT", "42", "10.0.0.7", "port")).(*Abort)
	if badPort.Room != 42 || badPort.HasEndpoint || !errors.Is(badPort.EndpointErr, ErrBadFrame) {
		t.Fatalf("bad port: %+v", badPort)
	}
	for _, bad := range [][][]byte{fr("ABORT"), fr("ABORT", "x", "ip", "1"), fr("ABORT", "-3")} {
		if _, err := DecodeInbound(bad); frameOf(err) != 1 {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
}

func TestGoldenStagingAccepted(t *testing.T) {
	w := mustInbound(t, fr("WATERMARK", "3", "17", agentUUID)).(*Watermark)
	if w.Round != 3 || w.Tail != 17 || w.SessionID != agentUUID || w.Err != nil {
		t.Fatalf("watermark = %+v", w)
	}
	if enc := w.Encode(); !reflect.DeepEqual(enc, fr("WATERMARK", "3", "17", agentUUID)) {
		t.Fatalf("Encode = %q", enc)
	}
	rspFrames := fr("STAGING_RSP", "42", "0", "-2", "1", "4096", agentUUID)
	s := mustInbound(t, rspFrames).(*StagingRsp)
	if s.Room != 42 || s.Offset != -2 || s.End != 4096 || s.Err != nil {
		t.Fatalf("staging rsp = %+v", s)
	}
	if enc := s.Encode(); !reflect.DeepEqual(enc, rspFrames) {
		t.Fatalf("Encode = %q", enc)
	}
	// Malformed staging messages are still accepted (to be dropped), with Err set.
	if w := mustInbound(t, fr("WATERMARK")).(*Watermark); w.Err == nil {
		t.Fatal("want Err on short watermark")
	}
	if s := mustInbound(t, fr("STAGING_RSP", "42", "x")).(*StagingRsp); s.Err == nil || s.Room != 42 {
		t.Fatalf("short staging rsp: %+v", s)
	}
}

func TestDispatchUnknown(t *testing.T) {
	for _, f := range [][][]byte{nil, {}, fr("KV_STATUS", "1", "0", "0", ""), fr("nixlmsgguard", "None"), fr("")} {
		_, err := DecodeInbound(f)
		if len(f) == 0 {
			if !errors.Is(err, ErrEmptyMessage) {
				t.Errorf("%q: %v", f, err)
			}
			continue
		}
		if !errors.Is(err, ErrUnknownTag) || frameOf(err) != 0 {
			t.Errorf("%q: %v", f, err)
		}
	}
}

func TestGoldenOutbound(t *testing.T) {
	reason := "Aborted by decode-side abort notification. \u00e9"
	st := &KVStatus{Room: 42, Status: kv.StatusFailed, PrefillRank: 3, Reason: reason}
	wantSt := fr("KV_STATUS", "42", "0", "3", "Aborted by decode-side abort notification. \xc3\xa9")
	if enc := st.Encode(); !reflect.DeepEqual(enc, wantSt) {
		t.Fatalf("KV_STATUS = %q", enc)
	}
	ack := &AbortAck{Room: 42, PrefillRank: 3}
	if enc := ack.Encode(); !reflect.DeepEqual(enc, fr("ABORT_ACK", "42", "3")) {
		t.Fatalf("ABORT_ACK = %q", enc)
	}
	req := &StagingReq{Room: 42, ChunkIdx: 1, ChunkPages: 8, SessionID: agentUUID}
	if enc := req.Encode(); !reflect.DeepEqual(enc, fr("STAGING_REQ", "42", "1", "8", agentUUID)) {
		t.Fatalf("STAGING_REQ = %q", enc)
	}
	for _, m := range []Outbound{st, ack, req} {
		got, err := DecodeOutbound(m.Encode())
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip %T: %+v, %v", m, got, err)
		}
	}
	// Success status with empty reason, as the ZMQ-only decode expects.
	ok, err := DecodeOutbound(fr("KV_STATUS", "7", "4", "0", ""))
	if err != nil || ok.(*KVStatus).Status != kv.StatusSuccess {
		t.Fatalf("%+v %v", ok, err)
	}
	for _, bad := range [][][]byte{fr("KV_STATUS", "7", "5", "0", ""), fr("KV_STATUS", "7", "4", "0", "\xff"), fr("ABORT_ACK", "7"), fr("ABORT")} {
		if _, err := DecodeOutbound(bad); err == nil {
			t.Errorf("%q: want error", bad)
		}
	}
}
