package wire

import (
	"bytes"
	"reflect"
	"testing"
)

// Golden packings written from §4.3e: u32 LE count, u32 LE byte lengths, LE payloads.
func TestPackIntListsGolden(t *testing.T) {
	checkI := func(in [][]int32, want string) {
		t.Helper()
		if got := PackIntLists(in); !bytes.Equal(got, []byte(want)) {
			t.Errorf("pack i %v = %q, want %q", in, got, want)
		}
		back, err := UnpackIntLists[int32]([]byte(want))
		if err != nil || !reflect.DeepEqual(back, in) {
			t.Errorf("unpack i %q = %v, %v; want %v", want, back, err, in)
		}
	}
	checkI(nil, "")
	checkI([][]int32{{}}, "\x01\x00\x00\x00"+"\x00\x00\x00\x00")
	checkI([][]int32{{1, -2}, {3}}, "\x02\x00\x00\x00"+"\x08\x00\x00\x00"+"\x04\x00\x00\x00"+
		"\x01\x00\x00\x00"+"\xfe\xff\xff\xff"+"\x03\x00\x00\x00")

	wantI := "\x01\x00\x00\x00" + "\x04\x00\x00\x00" + "\xef\xbe\xad\xde"
	if got := PackIntLists([][]uint32{{0xdeadbeef}}); string(got) != wantI {
		t.Errorf("pack I = %q", got)
	}
	if back, err := UnpackIntLists[uint32]([]byte(wantI)); err != nil || back[0][0] != 0xdeadbeef {
		t.Errorf("unpack I = %v, %v", back, err)
	}
	wantQ := "\x02\x00\x00\x00" + "\x08\x00\x00\x00" + "\x00\x00\x00\x00" + "\x08\x07\x06\x05\x04\x03\x02\x01"
	inQ := [][]uint64{{0x0102030405060708}, {}}
	if got := PackIntLists(inQ); string(got) != wantQ {
		t.Errorf("pack Q = %q", got)
	}
	if back, err := UnpackIntLists[uint64]([]byte(wantQ)); err != nil || !reflect.DeepEqual(back, inQ) {
		t.Errorf("unpack Q = %v, %v", back, err)
	}
	// A zero count is the empty outer list.
	if back, err := UnpackIntLists[uint64]([]byte("\x00\x00\x00\x00")); err != nil || back != nil {
		t.Errorf("zero count = %v, %v", back, err)
	}
}

func TestUnpackIntListsErrors(t *testing.T) {
	bad := map[string]string{
		"short count":       "\x01\x00",
		"header truncated":  "\x02\x00\x00\x00\x04\x00\x00\x00",
		"huge count":        "\xff\xff\xff\xff",
		"payload truncated": "\x01\x00\x00\x00\x08\x00\x00\x00\x01\x00\x00\x00",
		"not a multiple":    "\x01\x00\x00\x00\x03\x00\x00\x00\x01\x02\x03",
		"trailing bytes":    "\x01\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\x09",
		"huge payload len":  "\x01\x00\x00\x00\xfc\xff\xff\xff",
	}
	for name, in := range bad {
		if _, err := UnpackIntLists[int32]([]byte(in)); err == nil {
			t.Errorf("%s: want error", name)
		}
	}
	// Q needs 8-byte payloads.
	if _, err := UnpackIntLists[uint64]([]byte("\x01\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00")); err == nil {
		t.Error("Q with 4-byte payload: want error")
	}
}
