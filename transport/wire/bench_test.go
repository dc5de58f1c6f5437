package wire

import "testing"

// BenchmarkDecodeTransferInfo is the codec alone (no sockets).
func BenchmarkDecodeTransferInfo(b *testing.B) {
	frames := goldenTransferInfoFrames()
	b.ReportAllocs()
	for range b.N {
		if _, err := DecodeInbound(frames); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeRegistration is the codec alone for the 20-frame baseline registration.
func BenchmarkDecodeRegistration(b *testing.B) {
	frames := goldenRegistrationFrames()
	b.ReportAllocs()
	for range b.N {
		if _, err := DecodeInbound(frames); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeTransferInfoDecoder is the same through a Decoder (the
// ingest's), which reuses the repeated decode IP and agent name.
func BenchmarkDecodeTransferInfoDecoder(b *testing.B) {
	frames := goldenTransferInfoFrames()
	var d Decoder
	b.ReportAllocs()
	for range b.N {
		if _, err := d.DecodeInbound(frames); err != nil {
			b.Fatal(err)
		}
	}
}
