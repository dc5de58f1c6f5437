package wire

import (
	"fmt"
	"reflect"
	"testing"
	"unsafe"
)

// TestDecoderKeepsRepeatedStrings: a Decoder decodes transfer infos exactly as
// DecodeInbound, hands out one string for a repeated decode IP and agent name,
// and never keeps more than MaxKeptStrings strings, whatever it is fed.
func TestDecoderKeepsRepeatedStrings(t *testing.T) {
	var d Decoder
	frames := goldenTransferInfoFrames()
	a, err := d.DecodeInbound(frames)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.DecodeInbound(goldenTransferInfoFrames())
	if err != nil {
		t.Fatal(err)
	}
	want, _ := DecodeInbound(frames)
	if !reflect.DeepEqual(a, want) || !reflect.DeepEqual(b, want) {
		t.Fatalf("Decoder: %+v / %+v, DecodeInbound %+v", a, b, want)
	}
	ta, tb := a.(*TransferInfo), b.(*TransferInfo)
	if unsafe.StringData(ta.AgentName) != unsafe.StringData(tb.AgentName) || unsafe.StringData(ta.DecodeIP) != unsafe.StringData(tb.DecodeIP) {
		t.Fatal("repeated strings were allocated again")
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = d.DecodeInbound(frames) }); n > float64(allocsPlain(frames))-2 {
		t.Fatalf("%.0f allocations per transfer info with a Decoder, %d without", n, allocsPlain(frames))
	}
	for i := range 3 * MaxKeptStrings {
		ti := *ta
		ti.AgentName = fmt.Sprintf("agent-%d", i)
		if _, err := d.DecodeInbound(ti.Encode()); err != nil {
			t.Fatal(err)
		}
		if len(d.strs) > MaxKeptStrings {
			t.Fatalf("Decoder keeps %d strings", len(d.strs))
		}
	}
	long := *ta
	long.AgentName = string(make([]byte, MaxKeptLen+1)) // NULs: ASCII
	before := len(d.strs)
	if _, err := d.DecodeInbound(long.Encode()); err != nil {
		t.Fatal(err)
	}
	if len(d.strs) > before {
		t.Fatal("a string longer than MaxKeptLen was kept")
	}
	// A non-ASCII agent name is still refused after an ASCII one was kept.
	bad := *ta
	bad.AgentName = "agent-\xff"
	if _, err := d.DecodeInbound(bad.Encode()); err == nil {
		t.Fatal("non-ASCII agent name accepted")
	}
}

func allocsPlain(frames [][]byte) int {
	return int(testing.AllocsPerRun(100, func() { _, _ = DecodeInbound(frames) }))
}
