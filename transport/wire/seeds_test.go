package wire

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteFuzzSeeds regenerates the checked-in seed corpus under testdata/fuzz from the
// golden frames. It only writes when KVXFER_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("KVXFER_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set KVXFER_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	write := func(target, name string, lines ...string) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		body := "go test fuzz v1\n"
		for _, l := range lines {
			body += l + "\n"
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Hex-escape every non-printable byte so the files read like the spec tables.
	bytesLit := func(b []byte) string {
		q := make([]byte, 0, 4*len(b))
		for _, c := range b {
			if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
				q = append(q, c)
			} else {
				q = fmt.Appendf(q, "\\x%02x", c)
			}
		}
		return `[]byte("` + string(q) + `")`
	}
	names := []string{"registration", "registration_later", "registration_minimal", "transfer_info",
		"transfer_info_later", "transfer_info_legacy", "abort", "abort_short", "watermark",
		"staging_rsp", "guard_only", "unknown_tag", "registration_0523", "abort_generation"}
	for i, s := range inboundSeeds() {
		write("FuzzDecodeInbound", names[i], bytesLit(joinFrames(s)))
	}
	for i, s := range outboundSeeds() {
		write("FuzzDecodeOutbound", fmt.Sprintf("seed%d", i), bytesLit(joinFrames(s)))
	}
	lists := []struct {
		name string
		f    byte
		b    string
	}{
		{"i_two_lists", 0, "\x02\x00\x00\x00\x08\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\xfe\xff\xff\xff\x03\x00\x00\x00"},
		{"I_one", 1, "\x01\x00\x00\x00\x04\x00\x00\x00\xef\xbe\xad\xde"},
		{"Q_with_empty", 2, "\x02\x00\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x08\x07\x06\x05\x04\x03\x02\x01"},
		{"truncated", 0, "\x01\x00\x00\x00\x08\x00\x00\x00\x01\x00"},
	}
	for _, l := range lists {
		write("FuzzIntLists", l.name, fmt.Sprintf("byte(%q)", rune(l.f)), bytesLit([]byte(l.b)))
	}
}
