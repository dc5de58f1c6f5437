package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

// Fuzz inputs are one []byte holding a whole multipart message: each frame is a uvarint
// length followed by its bytes (see joinFrames). Seeds live in testdata/fuzz/<Target>/
// (regenerate with KVXFER_WRITE_FUZZ_SEEDS=1 go test -run TestWriteFuzzSeeds).

func joinFrames(frames [][]byte) []byte {
	var out []byte
	for _, f := range frames {
		out = binary.AppendUvarint(out, uint64(len(f)))
		out = append(out, f...)
	}
	return out
}

// splitFrames is total: a malformed length ends the message with what is left.
func splitFrames(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			out = append(out, b)
			break
		}
		out = append(out, b[k:k+int(n)])
		b = b[k+int(n):]
	}
	return out
}

// normalizeInbound clears the fields that describe how a message was received rather than
// what it says, so that decode(encode(m)) can be compared with m.
func normalizeInbound(m Inbound) (Inbound, bool) {
	switch v := m.(type) {
	case *Registration:
		c := *v
		c.LayerInfoErr = nil
		c.Frames = 0 // how many arrived, not what they say
		return &c, true
	case *Abort:
		c := *v
		c.EndpointErr = nil
		return &c, true
	case *Watermark:
		return v, v.Err == nil
	case *StagingRsp:
		return v, v.Err == nil
	}
	return m, true
}

func checkInboundRoundTrip(t *testing.T, frames [][]byte) {
	m, err := DecodeInbound(frames)
	if err != nil {
		var fe *FrameError
		if !errors.As(err, &fe) {
			t.Fatalf("error is not a *FrameError: %v", err)
		}
		_ = fe.Error()
		return
	}
	m1, comparable := normalizeInbound(m)
	enc := m.Encode()
	m2, err := DecodeInbound(enc)
	if err != nil {
		t.Fatalf("re-decoding our own encoding of %T failed: %v\nframes %q", m, err, enc)
	}
	m2, _ = normalizeInbound(m2)
	if !comparable {
		return
	}
	if !reflect.DeepEqual(m1, m2) {
		t.Fatalf("round trip changed %T:\n%+v\n%+v", m, m1, m2)
	}
	if enc2 := m2.Encode(); !reflect.DeepEqual(enc, enc2) {
		t.Fatalf("encoding not stable for %T:\n%q\n%q", m, enc, enc2)
	}
}

func inboundSeeds() [][][]byte {
	later := append(goldenRegistrationFrames(), fr("\x01\x00\x00\x00\x04\x00\x00\x00\x05\x00\x00\x00", "\x00\x00\x00\x00", "2", "1")...)
	return [][][]byte{
		goldenRegistrationFrames(),
		later,
		goldenRegistrationFrames()[:13],
		goldenTransferInfoFrames(),
		append(goldenTransferInfoFrames(), []byte("1")),
		goldenTransferInfoFrames()[:8],
		fr("ABORT", "42", "10.0.0.7", "41235"),
		fr("ABORT", "42"),
		fr("WATERMARK", "3", "17", agentUUID),
		fr("STAGING_RSP", "42", "0", "-2", "1", "4096", agentUUID),
		fr("NixlMsgGuard"),
		fr("bogus", "1"),
		append(append([][]byte{}, later...), []byte("\x01\x00\x00\x00\x08\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00")),
		fr("ABORT", "42", "10.0.0.7", "41235", "7"),
	}
}

func outboundSeeds() [][][]byte {
	return [][][]byte{
		fr("KV_STATUS", "42", "0", "3", "Aborted by decode-side abort notification."),
		fr("KV_STATUS", "42", "4", "0", ""),
		fr("ABORT_ACK", "42", "3"),
		fr("STAGING_REQ", "42", "1", "8", agentUUID),
		fr("ABORT_ACK", "42", "3", "7"),
		fr("CHUNK_READY", "42", "2", "32", "5", agentUUID, "3"),
		fr("STAGING_REQ", "42", "1", "8", agentUUID, "0"),
	}
}

// FuzzDecodeInbound covers the dispatcher and every decode->prefill layout: no input may
// panic, every error is a *FrameError, and whatever decodes re-encodes to an equal message.
func FuzzDecodeInbound(f *testing.F) {
	for _, s := range inboundSeeds() {
		f.Add(joinFrames(s))
	}
	var d Decoder // shared across inputs, as the ingest's is
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := splitFrames(data)
		checkInboundRoundTrip(t, frames)
		// A Decoder that kept strings from earlier inputs decodes exactly as
		// DecodeInbound does.
		m1, err1 := DecodeInbound(frames)
		m2, err2 := d.DecodeInbound(frames)
		if (err1 == nil) != (err2 == nil) || !reflect.DeepEqual(m1, m2) || err1 != nil && err1.Error() != err2.Error() {
			t.Fatalf("Decoder differs: %+v %v vs %+v %v", m1, err1, m2, err2)
		}
	})
}

// FuzzDecodeOutbound covers KV_STATUS, ABORT_ACK, STAGING_REQ and CHUNK_READY decoding
// (decode side).
func FuzzDecodeOutbound(f *testing.F) {
	for _, s := range outboundSeeds() {
		f.Add(joinFrames(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeOutbound(splitFrames(data))
		if err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) {
				t.Fatalf("error is not a *FrameError: %v", err)
			}
			return
		}
		m2, err := DecodeOutbound(m.Encode())
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip %T: %+v -> %+v, %v", m, m, m2, err)
		}
	})
}

// FuzzIntLists: unpack never panics, and whatever unpacks packs back to the same bytes
// (the format is canonical except that a zero count means the empty list).
func FuzzIntLists(f *testing.F) {
	f.Add(byte('i'), []byte("\x02\x00\x00\x00\x08\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\xfe\xff\xff\xff\x03\x00\x00\x00"))
	f.Add(byte('I'), []byte("\x01\x00\x00\x00\x04\x00\x00\x00\xef\xbe\xad\xde"))
	f.Add(byte('Q'), []byte("\x02\x00\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x08\x07\x06\x05\x04\x03\x02\x01"))
	f.Add(byte('i'), []byte{})
	f.Fuzz(func(t *testing.T, format byte, buf []byte) {
		var packed []byte
		var n int
		var err error
		switch format % 3 {
		case 0:
			var l [][]int32
			l, err = UnpackIntLists[int32](buf)
			packed, n = PackIntLists(l), len(l)
		case 1:
			var l [][]uint32
			l, err = UnpackIntLists[uint32](buf)
			packed, n = PackIntLists(l), len(l)
		default:
			var l [][]uint64
			l, err = UnpackIntLists[uint64](buf)
			packed, n = PackIntLists(l), len(l)
		}
		if err != nil {
			return
		}
		if n == 0 {
			if len(buf) != 0 && !bytes.Equal(buf, []byte{0, 0, 0, 0}) {
				t.Fatalf("empty result from %q", buf)
			}
			return
		}
		if !bytes.Equal(packed, buf) {
			t.Fatalf("repack %q != %q", packed, buf)
		}
	})
}

func TestInboundSeedsRoundTrip(t *testing.T) {
	for _, s := range inboundSeeds() {
		checkInboundRoundTrip(t, s)
		if got := splitFrames(joinFrames(s)); !reflect.DeepEqual(got, s) && len(s) > 0 {
			// splitFrames drops nothing; empty frames come back as empty slices.
			for i := range s {
				if !bytes.Equal(got[i], s[i]) {
					t.Fatalf("framing helper broken at %d", i)
				}
			}
		}
	}
}
