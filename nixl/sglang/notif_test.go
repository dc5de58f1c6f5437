package sglang_test

import (
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

func TestNotifFormat(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{string(sglang.AppendKVNotif(nil, 42, 0, false, 0)), "42_kv_0_0_0"},
		{string(sglang.AppendKVNotif(nil, 1<<63-1, 7, true, sglang.SenderID(1, 4, 2))), "9223372036854775807_kv_7_1_6"},
		{string(sglang.AppendPartSuffix(sglang.AppendKVNotif(nil, 5, 1, true, 3), 0, 2)), "5_kv_1_1_3_part_0_2"},
		{string(sglang.AppendAuxNotif(nil, 42)), "42_aux"},
		{string(sglang.AppendAuxNoKVNotif(nil, 42, 3, sglang.NoKVBaseline, 9)), "42_aux_nokv_3"},
		{string(sglang.AppendAuxNoKVNotif(nil, 42, 3, sglang.NoKVWithCount, 2)), "42_aux_nokv_3_2"},
		{string(sglang.AppendStateNotif(nil, 42, 1, 0)), "42_state_1_0"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestParseNotif(t *testing.T) {
	ok := []struct {
		in   string
		want sglang.Notif
	}{
		{"5_kv_2_1_0", sglang.Notif{Room: 5, Tag: sglang.TagKV, Chunk: 2, IsLast: true, Component: -1}},
		{"5_kv_2_0", sglang.Notif{Room: 5, Tag: sglang.TagKV, Chunk: 2, Component: -1}}, // old form, sender 0
		{"5_kv_0_1_7_part_1_3", sglang.Notif{Room: 5, Tag: sglang.TagKV, IsLast: true, Sender: 7, Part: 1, NumParts: 3, Component: -1}},
		{"6_aux", sglang.Notif{Room: 6, Tag: sglang.TagAux, Component: -1}},
		{"6_aux_nokv_3", sglang.Notif{Room: 6, Tag: sglang.TagAuxNoKV, Sender: 3, Component: -1}},
		{"6_aux_nokv_3_4", sglang.Notif{Room: 6, Tag: sglang.TagAuxNoKV, Sender: 3, KVChunks: 4, HasCount: true, Component: -1}},
		{"7_state_2", sglang.Notif{Room: 7, Tag: sglang.TagState, Sender: 2, Component: -1}},
		{"7_state_2_1", sglang.Notif{Room: 7, Tag: sglang.TagState, Sender: 2, Component: 1}},
		{"7_state", sglang.Notif{Room: 7, Tag: sglang.TagState, Component: -1}},
		{"18446744073709551615_aux", sglang.Notif{Room: 1<<64 - 1, Tag: sglang.TagAux, Component: -1}},
	}
	for _, c := range ok {
		got, err := sglang.ParseNotif(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseNotif(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{
		"", "5", "x_aux", "5_", "5_foo", "-5_aux", "05_aux", "+5_aux", "5_kv", "5_kv_1", "5_kv_1_2_0", "5_kv_a_1_0",
		"5_kv_1_1_0_part_2_2", "5_kv_1_1_0_part_0_0", "5_kv_1_1_0_prt_0_1", "5_kv_1_1_0_1", "5_aux_3",
		"5_aux_nokv", "5_aux_nokv_x", "5_aux_nokv_1_2_3", "5_state_1_2_3", "5_state_x",
		"18446744073709551616_aux", "5_kv_99999999999_1_0", "5_stg_0_1_0_2_4_8_agent",
	} {
		if _, err := sglang.ParseNotif(in); !errors.Is(err, nixl.ErrInvalid) {
			t.Errorf("ParseNotif(%q) err = %v, want ErrInvalid", in, err)
		}
	}
}

// FuzzParseNotif: the parser never panics, and whatever it accepts formats back
// to a string that parses to the same value.
func FuzzParseNotif(f *testing.F) {
	for _, s := range []string{"5_kv_2_1_0", "5_kv_0_1_7_part_1_3", "6_aux", "6_aux_nokv_3_4", "7_state_2_1", "5_kv_2_0", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := sglang.ParseNotif(s)
		if err != nil {
			if !errors.Is(err, nixl.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		again, err := sglang.ParseNotif(n.String())
		if err != nil || again != n {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, n, n.String(), again, err)
		}
	})
}
