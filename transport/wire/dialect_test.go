package wire

import (
	"errors"
	"reflect"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

func laterRegistrationFrames() [][]byte {
	return append(goldenRegistrationFrames(), fr(
		"\x01\x00\x00\x00"+"\x04\x00\x00\x00"+"\x05\x00\x00\x00", // [19] state_layer_ids [[5]]
		"\x00\x00\x00\x00"+"\x01\x00\x00\x00",                    // [20] kv_layer_ids [0, 1]
		"1", "0",                                                 // [21] dcp_size, [22] dcp_rank
	)...)
}

func TestDialectOfRegistration(t *testing.T) {
	legacy := laterRegistrationFrames()
	withLens := append(laterRegistrationFrames(), []byte("\x01\x00\x00\x00"+"\x08\x00\x00\x00"+"\x00\x10\x00\x00\x00\x00\x00\x00"))
	withEmpty := append(laterRegistrationFrames(), []byte{})
	cases := []struct {
		name   string
		frames [][]byte
		legacy Dialect
		want   Dialect
		bad    bool
	}{
		{"23 frames, default legacy", legacy, DialectUnknown, Dialect0520, false},
		{"23 frames, pinned 0.5.18", legacy, Dialect0518, Dialect0518, false},
		{"23 frames, pinned 0.5.22", legacy, Dialect0522, Dialect0522, false},
		{"24 frames with state_data_lens", withLens, Dialect0518, Dialect0523, false},
		{"24 frames, empty state_data_lens", withEmpty, DialectUnknown, Dialect0523, false},
		{"19 frames: no release sends this", goldenRegistrationFrames(), DialectUnknown, DialectUnknown, true},
		{"25 frames: a release we do not know", append(append([][]byte{}, withLens...), []byte("x")), DialectUnknown, DialectUnknown, true},
	}
	for _, c := range cases {
		r := mustInbound(t, c.frames).(*Registration)
		got, err := DialectOf(r, c.legacy)
		if c.bad {
			if !errors.Is(err, ErrUnsupportedRelease) {
				t.Fatalf("%s: err %v, want ErrUnsupportedRelease", c.name, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Fatalf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	r := mustInbound(t, withLens).(*Registration)
	if !r.HasStateDataLens || !reflect.DeepEqual(r.StateDataLens, [][]uint64{{0x1000}}) {
		t.Fatalf("state_data_lens %v %v", r.HasStateDataLens, r.StateDataLens)
	}
	if enc := r.Encode(); !reflect.DeepEqual(enc, withLens) {
		t.Fatalf("0.5.23 registration does not re-encode byte-exactly:\n%q\n%q", enc, withLens)
	}
}

func TestAbortGenerationFrames(t *testing.T) {
	five := fr("ABORT", "42", "10.0.0.7", "5000", "7")
	a := mustInbound(t, five).(*Abort)
	if !a.HasGen || a.Generation != 7 || !a.HasEndpoint {
		t.Fatalf("5-frame ABORT: %+v", a)
	}
	if enc := a.Encode(); !reflect.DeepEqual(enc, five) {
		t.Fatalf("re-encoded %q", enc)
	}
	for _, g := range []string{"", "x", "-1"} {
		b := mustInbound(t, fr("ABORT", "42", "10.0.0.7", "5000", g)).(*Abort)
		if b.HasGen || !b.HasEndpoint {
			t.Fatalf("bad generation %q should read as absent: %+v", g, b)
		}
	}
	four := mustInbound(t, fr("ABORT", "42", "10.0.0.7", "5000")).(*Abort)
	if four.HasGen {
		t.Fatal("4-frame ABORT has a generation")
	}
}

func TestAbortAckForms(t *testing.T) {
	got := (&AbortAck{Room: 42, PrefillRank: 3, Generation: 9, HasGen: true}).Encode()
	if want := fr("ABORT_ACK", "42", "3", "9"); !reflect.DeepEqual(got, want) {
		t.Fatalf("0.5.22+ ACK %q, want %q", got, want)
	}
	got = (&AbortAck{Room: 42, PrefillRank: 3}).Encode()
	if want := fr("ABORT_ACK", "42", "3"); !reflect.DeepEqual(got, want) {
		t.Fatalf("0.5.20 ACK %q, want %q", got, want)
	}
	got = (&KVStatus{Room: 42, Status: kv.StatusSuccess, PrefillRank: 1}).Encode()
	if want := fr("KV_STATUS", "42", "4", "1", ""); !reflect.DeepEqual(got, want) {
		t.Fatalf("success KV_STATUS %q, want %q", got, want)
	}
}

func TestParseDialect(t *testing.T) {
	for in, want := range map[string]Dialect{"auto": DialectUnknown, "0.5.18": Dialect0518, "0.5.21": Dialect0520, "v0.5.22": Dialect0522, "0.5.23": Dialect0523} {
		if got, err := ParseDialect(in); err != nil || got != want {
			t.Fatalf("ParseDialect(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseDialect("0.4.0"); err == nil {
		t.Fatal("an unknown release parsed")
	}
	for _, d := range Dialects() {
		if back, err := ParseDialect(d.String()); err != nil || back != d {
			t.Fatalf("%v does not round-trip", d)
		}
	}
}
