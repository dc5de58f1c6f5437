package sglang

import (
	"strconv"
	"strings"

	"github.com/kvxfer/kvxfer/nixl"
)

// SenderID is the per-sender integer carried in notifications. SGLang's later
// variant uses pp_rank*tp_size + tp_rank, which stays unique across PP stages
// (the baseline's bare tp_rank collides when PP>1); every decode version treats
// it as an opaque dict key.
func SenderID(ppRank, tpSize, tpRank int) int { return ppRank*tpSize + tpRank }

// NoKVForm selects the aux_nokv notification shape.
type NoKVForm uint8

const (
	// NoKVBaseline is "{room}_aux_nokv_{sender}": decode expects zero KV chunks.
	NoKVBaseline NoKVForm = iota
	// NoKVWithCount is "{room}_aux_nokv_{sender}_{n}" (later variant): decode
	// expects n KV chunks from this sender, fixing the baseline edge case where
	// a sender had sent KV chunks before an empty last chunk.
	NoKVWithCount
)

// AppendKVNotif appends "{room}_kv_{chunk}_{is_last}_{sender}".
func AppendKVNotif(b []byte, room uint64, chunk int, isLast bool, sender int) []byte {
	b = strconv.AppendUint(b, room, 10)
	b = append(b, "_kv_"...)
	b = strconv.AppendInt(b, int64(chunk), 10)
	if isLast {
		b = append(b, "_1_"...)
	} else {
		b = append(b, "_0_"...)
	}
	return strconv.AppendInt(b, int64(sender), 10)
}

// AppendPartSuffix appends "_part_{i}_{n}" (mixed VRAM/DRAM destinations).
func AppendPartSuffix(b []byte, i, n int) []byte {
	b = append(b, "_part_"...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, '_')
	return strconv.AppendInt(b, int64(n), 10)
}

// AppendAuxNotif appends "{room}_aux".
func AppendAuxNotif(b []byte, room uint64) []byte {
	b = strconv.AppendUint(b, room, 10)
	return append(b, "_aux"...)
}

// AppendAuxNoKVNotif appends "{room}_aux_nokv_{sender}" or, with NoKVWithCount,
// "{room}_aux_nokv_{sender}_{kvChunks}".
func AppendAuxNoKVNotif(b []byte, room uint64, sender int, form NoKVForm, kvChunks int) []byte {
	b = strconv.AppendUint(b, room, 10)
	b = append(b, "_aux_nokv_"...)
	b = strconv.AppendInt(b, int64(sender), 10)
	if form == NoKVWithCount {
		b = append(b, '_')
		b = strconv.AppendInt(b, int64(kvChunks), 10)
	}
	return b
}

// AppendStateNotif appends "{room}_state_{sender}_{component}".
func AppendStateNotif(b []byte, room uint64, sender, component int) []byte {
	b = strconv.AppendUint(b, room, 10)
	b = append(b, "_state_"...)
	b = strconv.AppendInt(b, int64(sender), 10)
	b = append(b, '_')
	return strconv.AppendInt(b, int64(component), 10)
}

// Tag is the kind of a parsed notification.
type Tag uint8

const (
	TagKV Tag = iota + 1
	TagAux
	TagAuxNoKV
	TagState
)

// Notif is a parsed notification. Fields not carried by the tag are zero.
type Notif struct {
	Room      uint64
	Tag       Tag
	Chunk     int  // kv
	IsLast    bool // kv
	Sender    int  // kv, aux_nokv, state; 0 when absent (decode's default)
	Part      int  // kv with _part_i_n
	NumParts  int  // 0 when not a part
	Component int  // state; -1 when absent
	KVChunks  int  // aux_nokv with count; 0 when absent
	HasCount  bool // aux_nokv carried the count field
}

// maxDigits bounds numeric fields (u64 fits in 20 digits).
const maxDigits = 20

// num parses a canonical unsigned decimal (no sign, no leading zeros).
func num(s string) (uint64, bool) {
	if s == "" || len(s) > maxDigits || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// small parses num and bounds it to an int32-sized value (chunk ids, ranks, counts).
func small(s string) (int, bool) {
	v, ok := num(s)
	if !ok || v > 1<<31-1 {
		return 0, false
	}
	return int(v), true
}

// ParseNotif parses one SGLang NIXL notification (the baseline tags plus the
// later nokv count and _part_i_n suffix). It accepts exactly the shapes decode
// understands and returns an ErrInvalid-wrapped error for anything else.
func ParseNotif(s string) (Notif, error) {
	bad := func(why string) (Notif, error) {
		return Notif{}, nixl.Errorf(nixl.ErrInvalid, "sglang notif %q: %s", s, why)
	}
	f := strings.Split(s, "_")
	if len(f) < 2 {
		return bad("no tag")
	}
	room, ok := num(f[0])
	if !ok {
		return bad("room")
	}
	n := Notif{Room: room, Component: -1}
	switch f[1] {
	case "kv":
		// room_kv_chunk_last[_sender[_part_i_n]]
		if len(f) != 4 && len(f) != 5 && len(f) != 8 {
			return bad("kv field count")
		}
		if n.Chunk, ok = small(f[2]); !ok {
			return bad("chunk id")
		}
		switch f[3] {
		case "0":
		case "1":
			n.IsLast = true
		default:
			return bad("is_last")
		}
		n.Tag = TagKV
		if len(f) >= 5 {
			if n.Sender, ok = small(f[4]); !ok {
				return bad("sender")
			}
		}
		if len(f) == 8 {
			if f[5] != "part" {
				return bad("part suffix")
			}
			p, ok1 := small(f[6])
			np, ok2 := small(f[7])
			if !ok1 || !ok2 || np == 0 || p >= np {
				return bad("part numbers")
			}
			n.Part, n.NumParts = p, np
		}
	case "aux":
		switch {
		case len(f) == 2:
			n.Tag = TagAux
		case f[2] == "nokv" && (len(f) == 4 || len(f) == 5):
			n.Tag = TagAuxNoKV
			if n.Sender, ok = small(f[3]); !ok {
				return bad("sender")
			}
			if len(f) == 5 {
				if n.KVChunks, ok = small(f[4]); !ok {
					return bad("kv chunk count")
				}
				n.HasCount = true
			}
		default:
			return bad("aux form")
		}
	case "state":
		if len(f) > 4 {
			return bad("state field count")
		}
		n.Tag = TagState
		if len(f) >= 3 {
			if n.Sender, ok = small(f[2]); !ok {
				return bad("sender")
			}
		}
		if len(f) == 4 {
			if n.Component, ok = small(f[3]); !ok {
				return bad("component")
			}
		}
	default:
		return bad("unknown tag")
	}
	return n, nil
}

// String formats n back into its canonical notification string.
func (n Notif) String() string {
	var b []byte
	switch n.Tag {
	case TagKV:
		b = AppendKVNotif(b, n.Room, n.Chunk, n.IsLast, n.Sender)
		if n.NumParts > 0 {
			b = AppendPartSuffix(b, n.Part, n.NumParts)
		}
	case TagAux:
		b = AppendAuxNotif(b, n.Room)
	case TagAuxNoKV:
		form := NoKVBaseline
		if n.HasCount {
			form = NoKVWithCount
		}
		b = AppendAuxNoKVNotif(b, n.Room, n.Sender, form, n.KVChunks)
	case TagState:
		b = strconv.AppendUint(b, n.Room, 10)
		b = append(b, "_state_"...)
		b = strconv.AppendInt(b, int64(n.Sender), 10)
		if n.Component >= 0 {
			b = append(b, '_')
			b = strconv.AppendInt(b, int64(n.Component), 10)
		}
	}
	return string(b)
}
