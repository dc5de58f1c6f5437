package sglang_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// TestTransferStatusIsDone replays decode's is_done on notification sequences.
func TestTransferStatusIsDone(t *testing.T) {
	for _, c := range []struct {
		name        string
		required    int
		expectState bool
		msgs        []string
		done        bool
	}{
		{"nothing", 1, false, nil, false},
		{"single chunk", 1, false, []string{"1_kv_0_1_0", "1_aux"}, true},
		{"aux first", 1, false, []string{"1_aux", "1_kv_0_1_0"}, true},
		{"no aux", 1, false, []string{"1_kv_0_1_0"}, false},
		{"missing middle chunk", 1, false, []string{"1_kv_0_0_0", "1_kv_2_1_0", "1_aux"}, false},
		{"all chunks out of order", 1, false, []string{"1_kv_2_1_0", "1_aux", "1_kv_1_0_0", "1_kv_0_0_0"}, true},
		{"duplicate chunk does not count twice", 1, false, []string{"1_kv_0_0_0", "1_kv_0_0_0", "1_kv_1_1_0", "1_aux"}, true},
		{"no last chunk", 1, false, []string{"1_kv_0_0_0", "1_kv_1_0_0", "1_aux"}, false},
		{"old form without sender", 1, false, []string{"1_kv_0_0", "1_kv_1_1", "1_aux"}, true},
		{"full prefix hit nokv", 1, false, []string{"1_aux_nokv_0"}, true},
		{"baseline nokv after kv never completes", 1, false, []string{"1_kv_0_0_0", "1_aux_nokv_0"}, false},
		{"counted nokv after kv", 1, false, []string{"1_kv_0_0_0", "1_kv_1_0_0", "1_aux_nokv_0_2"}, true},
		{"counted nokv waits for chunks", 1, false, []string{"1_kv_0_0_0", "1_aux_nokv_0_2"}, false},
		{"two senders, one reported", 2, false, []string{"1_kv_0_1_0", "1_aux"}, false},
		{"two senders", 2, false, []string{"1_kv_0_1_0", "1_kv_0_0_6", "1_kv_1_1_6", "1_aux"}, true},
		{"two senders, same id collide", 2, false, []string{"1_kv_0_1_0", "1_kv_0_1_0", "1_aux"}, false},
		{"two senders, one nokv", 2, false, []string{"1_kv_0_1_0", "1_aux_nokv_1", "1_aux"}, true},
		{"state expected, missing", 1, true, []string{"1_kv_0_1_0", "1_aux"}, false},
		{"state expected", 1, true, []string{"1_kv_0_1_0", "1_state_0_0", "1_aux"}, true},
		{"state from one of two senders", 2, true, []string{"1_kv_0_1_0", "1_kv_0_1_1", "1_state_0_0", "1_aux"}, false},
		{"state from both senders", 2, true, []string{"1_kv_0_1_0", "1_kv_0_1_1", "1_state_0_0", "1_state_1", "1_aux"}, true},
		{"state not expected is ignored", 1, false, []string{"1_state_0_0", "1_kv_0_1_0", "1_aux"}, true},
		{"parts incomplete", 1, false, []string{"1_kv_0_1_0_part_0_2", "1_aux"}, false},
		{"parts complete", 1, false, []string{"1_kv_0_1_0_part_1_2", "1_aux", "1_kv_0_1_0_part_0_2"}, true},
		{"parts duplicate", 1, false, []string{"1_kv_0_1_0_part_1_2", "1_kv_0_1_0_part_1_2", "1_aux"}, false},
		{"default required is one", 0, false, []string{"1_kv_0_1_0", "1_aux"}, true},
		{"other room does not count", 1, false, []string{"2_kv_0_1_0", "2_aux", "1_kv_0_1_0"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ck := sglang.NewChecker()
			ck.Expect(1, c.required, c.expectState)
			for _, m := range c.msgs {
				if _, err := ck.Feed(m); err != nil {
					t.Fatal(err)
				}
			}
			if got := ck.Done(1); got != c.done {
				t.Fatalf("Done = %v, want %v", got, c.done)
			}
		})
	}
	if _, err := sglang.NewChecker().Feed("1_bogus"); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("bad notif: %v", err)
	}
	if sglang.NewChecker().Done(9) {
		t.Fatal("unknown room reported done")
	}
}

func TestCheckAuxRoom(t *testing.T) {
	buf := make([]byte, 4*sglang.AuxRoomItemLen)
	binary.LittleEndian.PutUint64(buf[2*sglang.AuxRoomItemLen:], 77)
	if err := sglang.CheckAuxRoom(buf, sglang.AuxRoomItemLen, 2, 77); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		slot int
		room uint64
	}{{2, 78}, {1, 77}, {4, 77}, {-1, 77}} {
		if err := sglang.CheckAuxRoom(buf, sglang.AuxRoomItemLen, c.slot, c.room); !errors.Is(err, nixl.ErrInvalid) {
			t.Errorf("slot %d room %d: %v", c.slot, c.room, err)
		}
	}
}
