package loopback

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/nixl"
)

// frames collects what appendNotifs would send.
func frames(t testing.TB, sender string, msgs [][]byte) [][]byte {
	t.Helper()
	var out [][]byte
	if _, err := appendNotifs(nil, sender, msgs, func(f []byte) error {
		if len(f) > maxDatagram {
			t.Fatalf("a %d-byte datagram, over %d", len(f), maxDatagram)
		}
		out = append(out, bytes.Clone(f))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNotifBatchFrames: messages go out in order, several to a datagram up to
// the reader's buffer, one alone in encodeNotif's frame (what older readers
// decode), and every datagram decodes back to its messages.
func TestNotifBatchFrames(t *testing.T) {
	name := strings.Repeat("n", maxStr)
	big := bytes.Repeat([]byte{'b'}, MaxNotifLen)
	for _, c := range []struct {
		name   string
		sender string
		msgs   [][]byte
		want   int // datagrams
	}{
		{"one", "p", [][]byte{[]byte("7_aux")}, 1},
		{"two", "p", [][]byte{[]byte("7_kv_1_1_0"), []byte("7_aux")}, 1},
		{"empty messages", "p", [][]byte{{}, []byte("x"), {}}, 1},
		{"largest alone", name, [][]byte{big}, 1},
		{"largest twice", name, [][]byte{big, big}, 2},
		{"largest then small", "p", [][]byte{big, []byte("a"), []byte("b")}, 1},
		{"largest then small, longest name", name, [][]byte{big, []byte("a"), []byte("b")}, 2},
		{"many small", "prefill", func() (m [][]byte) {
			for i := range 5000 {
				m = append(m, fmt.Appendf(nil, "%d_kv_%d_0_0", 1000000+i, i%7))
			}
			return m
		}(), 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := frames(t, c.sender, c.msgs)
			if len(fs) != c.want {
				t.Fatalf("%d datagrams, want %d", len(fs), c.want)
			}
			var got []nixl.Notif
			for _, f := range fs {
				var ok bool
				n := len(got)
				if got, ok = decodeNotifs(f, got); !ok {
					t.Fatalf("datagram %q refused", f[:min(len(f), 40)])
				}
				if len(got)-n == 1 && !bytes.Equal(f, encodeNotif(c.sender, []byte(got[n].Msg))) {
					t.Fatal("a one-message datagram is not encodeNotif's frame")
				}
			}
			if len(got) != len(c.msgs) {
				t.Fatalf("%d notifications back, want %d", len(got), len(c.msgs))
			}
			for i, n := range got {
				if n.Peer != c.sender || n.Msg != string(c.msgs[i]) {
					t.Fatalf("notification %d is %.20q from %.20q, want %.20q", i, n.Msg, n.Peer, c.msgs[i])
				}
			}
		})
	}
}

// TestNotifBatchRefusesMalformed: a batch that is cut short, overlong or of
// one message adds nothing.
func TestNotifBatchRefusesMalformed(t *testing.T) {
	batch := func(name string, parts ...[]byte) []byte {
		b := binary.LittleEndian.AppendUint16(nil, batchFlag|uint16(len(name)))
		b = append(b, name...)
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	msg := func(s string) []byte { return append(binary.LittleEndian.AppendUint16(nil, uint16(len(s))), s...) }
	good := batch("p", msg("a"), msg("bc"))
	if ns, ok := decodeNotifs(good, nil); !ok || len(ns) != 2 || ns[1].Msg != "bc" {
		t.Fatalf("good batch: %+v %v", ns, ok)
	}
	for name, b := range map[string][]byte{
		"cut in a length":  good[:len(good)-3],
		"cut in a message": good[:len(good)-1],
		"odd byte":         append(bytes.Clone(good), 1),
		"one message":      batch("p", msg("a")),
		"no messages":      batch("p"),
		"no name":          batch("", msg("a"), msg("b")),
		"name too long":    batch(strings.Repeat("n", maxStr+1), msg("a"), msg("b")),
		"message too long": batch("p", msg("a"), binary.LittleEndian.AppendUint16(nil, MaxNotifLen+1)),
	} {
		prev := []nixl.Notif{{Peer: "x", Msg: "kept"}}
		if ns, ok := decodeNotifs(b, prev); ok || len(ns) != 1 {
			t.Errorf("%s: accepted (%d notifications)", name, len(ns))
		}
	}
}

// FuzzDecodeNotifs: any datagram either decodes to notifications that
// re-encode to the same bytes, or adds nothing; it never panics.
func FuzzDecodeNotifs(f *testing.F) {
	f.Add(encodeNotif("peer", []byte("1_aux")))
	for _, fr := range frames(f, "prefill", [][]byte{[]byte("9_kv_0_1_0"), []byte("9_aux")}) {
		f.Add(fr)
	}
	f.Add([]byte{0x01, 0x80, 'p', 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		ns, ok := decodeNotifs(b, nil)
		if !ok {
			if len(ns) != 0 {
				t.Fatalf("refused but returned %d", len(ns))
			}
			return
		}
		msgs := make([][]byte, len(ns))
		for i, n := range ns {
			if n.Peer != ns[0].Peer {
				t.Fatal("one datagram, two senders")
			}
			msgs[i] = []byte(n.Msg)
		}
		if binary.LittleEndian.Uint16(b)&batchFlag == 0 {
			if len(ns) != 1 || !bytes.Equal(encodeNotif(ns[0].Peer, msgs[0]), b) {
				t.Fatal("single frame does not re-encode")
			}
			return
		}
		if len(ns) < 2 {
			t.Fatal("a batch of fewer than two")
		}
		var re []byte
		re = binary.LittleEndian.AppendUint16(re, batchFlag|uint16(len(ns[0].Peer)))
		re = append(re, ns[0].Peer...)
		for _, m := range msgs {
			re = binary.LittleEndian.AppendUint16(re, uint16(len(m)))
			re = append(re, m...)
		}
		if !bytes.Equal(re, b) {
			t.Fatal("batch does not re-encode")
		}
	})
}
