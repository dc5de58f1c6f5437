package wire

import (
	"errors"
	"reflect"
	"testing"
)

// Golden frames of the staging messages, written from the spec's tables (§4.3d of
// sglang-nixl-protocol.md, §1.3 of sglang-versions.md), not from the encoder.
func TestGoldenStaging(t *testing.T) {
	cases := []struct {
		name string
		m    Outbound
		want [][]byte
	}{
		{"STAGING_REQ", &StagingReq{Room: 42, ChunkIdx: 3, ChunkPages: 16, SessionID: agentUUID},
			fr("STAGING_REQ", "42", "3", "16", agentUUID)},
		{"STAGING_REQ+pp", &StagingReq{Room: 42, ChunkIdx: 0, ChunkPages: 1, SessionID: agentUUID, PPRank: 1, HasPPRank: true},
			fr("STAGING_REQ", "42", "0", "1", agentUUID, "1")},
		{"CHUNK_READY", &ChunkReady{Room: 9223372036854775807, ChunkIdx: 2, PageStart: 32, NumPages: 5, WriterID: agentUUID, PrefillRank: 3},
			fr("CHUNK_READY", "9223372036854775807", "2", "32", "5", agentUUID, "3")},
	}
	for _, c := range cases {
		if got := c.m.Encode(); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: encode %q, want %q", c.name, got, c.want)
		}
		got, err := DecodeOutbound(c.want)
		if err != nil || !reflect.DeepEqual(got, c.m) {
			t.Errorf("%s: decode %+v, %v", c.name, got, err)
		}
	}
	// Decode -> prefill staging messages go through DecodeInbound.
	in := []struct {
		frames [][]byte
		want   Inbound
	}{
		{fr("WATERMARK", "2", "4096", agentUUID), &Watermark{Round: 2, Tail: 4096, SessionID: agentUUID}},
		{fr("STAGING_RSP", "42", "1", "8192", "3", "12288", agentUUID),
			&StagingRsp{Room: 42, ChunkIdx: 1, Offset: 8192, Round: 3, End: 12288, SessionID: agentUUID}},
		{fr("STAGING_RSP", "42", "1", "-2", "0", "-1", agentUUID),
			&StagingRsp{Room: 42, ChunkIdx: 1, Offset: AllocOversized, Round: 0, End: -1, SessionID: agentUUID}},
	}
	for _, c := range in {
		got, err := DecodeInbound(c.frames)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q: %+v, %v", c.frames, got, err)
		}
		if enc := c.want.Encode(); !reflect.DeepEqual(enc, c.frames) {
			t.Errorf("encode %q, want %q", enc, c.frames)
		}
	}
	// CHUNK_READY without prefill_rank is accepted (decode reads frames 1-5 only);
	// the other fields are required.
	if m, err := DecodeOutbound(fr("CHUNK_READY", "7", "0", "0", "4", "a")); err != nil || m.(*ChunkReady).NumPages != 4 {
		t.Errorf("5-field CHUNK_READY: %+v %v", m, err)
	}
	for _, bad := range [][][]byte{
		fr("CHUNK_READY", "7", "0", "0", "4"),
		fr("CHUNK_READY", "7", "-1", "0", "4", "a"),
		fr("CHUNK_READY", "x", "0", "0", "4", "a"),
		fr("CHUNK_READY", "7", "0", "0", "4", "\xff"),
		fr("STAGING_REQ", "7", "0", "4", "a", "-1"),
	} {
		if _, err := DecodeOutbound(bad); err == nil {
			t.Errorf("%q: want error", bad)
		}
	}
}

func TestStgNotif(t *testing.T) {
	// The format string of nixl/conn.py (0.5.18) with room 42, chunk_id 3, last,
	// sender 1, chunk_idx 0, page_start 16, num_pages 8 and an agent with '_'.
	const s = "42_stg_3_1_1_0_16_8_agent_with_underscores"
	want := &StgNotif{Room: 42, ChunkID: 3, IsLast: true, Sender: 1, ChunkIdx: 0, PageStart: 16, NumPages: 8, Agent: "agent_with_underscores"}
	got, err := ParseStgNotif(s)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("parse: %+v %v", got, err)
	}
	if want.String() != s {
		t.Fatalf("format %q", want.String())
	}
	if s2 := (&StgNotif{Room: 7, Agent: agentUUID}).String(); s2 != "7_stg_0_0_0_0_0_0_"+agentUUID {
		t.Fatalf("format %q", s2)
	}
	for _, bad := range []string{
		"42_kv_3_1_1", "42_stg_3_1_1_0_16_8", "42_stg_3_1_1_0_16_8_", "42_stg_3_2_1_0_16_8_a",
		"42_stg_-3_1_1_0_16_8_a", "042_stg_3_1_1_0_16_8_a", "42_stg_3_1_1_0_16_99999999999_a",
		"9223372036854775808_stg_0_0_0_0_0_0_a", "x_stg_0_0_0_0_0_0_a",
	} {
		if _, err := ParseStgNotif(bad); !errors.Is(err, ErrBadStgNotif) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestWatermarkReady(t *testing.T) {
	cases := []struct {
		round, end, wr, wt int64
		ok                 bool
	}{
		{0, 1 << 20, 0, 0, true},    // first lap: never overlaps
		{1, 4096, 0, 0, false},      // second lap before anything was freed
		{1, 4096, 0, 4096, true},    // freed up to exactly end
		{1, 4097, 0, 4096, false},   // one byte short
		{2, 100, 1, 99, false},      // previous lap not freed far enough
		{2, 1 << 30, 2, 0, true},    // the watermark is already in this lap
		{3, 100, 1, 1 << 30, false}, // two laps behind
	}
	for _, c := range cases {
		if got := WatermarkReady(c.round, c.end, c.wr, c.wt); got != c.ok {
			t.Errorf("%+v: %v", c, got)
		}
	}
	if !WatermarkAfter(1, 0, 0, 99) || WatermarkAfter(1, 5, 1, 5) || WatermarkAfter(0, 9, 1, 0) || !WatermarkAfter(1, 6, 1, 5) {
		t.Fatal("WatermarkAfter is not the tuple order")
	}
}

// FuzzStgNotif: parsing never panics, and what parses formats back to the same string.
func FuzzStgNotif(f *testing.F) {
	f.Add("42_stg_3_1_1_0_16_8_agent_with_underscores")
	f.Add("0_stg_0_0_0_0_0_0_a")
	f.Add("42_kv_0_1_0")
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseStgNotif(s)
		if err != nil {
			if !errors.Is(err, ErrBadStgNotif) {
				t.Fatalf("error does not wrap ErrBadStgNotif: %v", err)
			}
			return
		}
		if n.String() != s {
			t.Fatalf("%q -> %+v -> %q", s, n, n.String())
		}
	})
}
