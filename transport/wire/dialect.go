package wire

import (
	"fmt"
	"strings"
)

// Dialect is the wire behaviour of one SGLang decode release, as the prefill
// side must serve it (../shared/spec/sglang-versions.md §0, §5). Releases that
// look the same to a prefill share a dialect.
type Dialect uint8

const (
	// DialectUnknown: nothing seen yet (or "auto" in configuration).
	DialectUnknown Dialect = iota
	// Dialect0518 completes on NIXL notifications only and reads nothing on
	// its PULL socket: KV_STATUS and ABORT_ACK would only queue there.
	Dialect0518
	// Dialect0520 (0.5.20 and 0.5.21) completes on notifications, fails a room
	// on KV_STATUS "0" and counts 3-frame ABORT_ACKs (0.5.21).
	Dialect0520
	// Dialect0522 is Dialect0520 with a generation on armed ABORTs, which the
	// 4-frame ABORT_ACK must echo; 3-frame ACKs are ignored with a warning.
	Dialect0522
	// Dialect0523 posts and reads no notifications: a room completes only on
	// KV_STATUS "4". It registers with 24 frames.
	Dialect0523
	numDialects
)

var dialectNames = [numDialects]string{"unknown", "0.5.18", "0.5.20", "0.5.22", "0.5.23"}

func (d Dialect) String() string {
	if d < numDialects {
		return dialectNames[d]
	}
	return fmt.Sprintf("dialect(%d)", d)
}

// Dialects lists the known dialects, oldest first.
func Dialects() []Dialect { return []Dialect{Dialect0518, Dialect0520, Dialect0522, Dialect0523} }

// ParseDialect reads a release ("0.5.21" is Dialect0520) or "auto" (DialectUnknown).
func ParseDialect(s string) (Dialect, error) {
	switch strings.TrimPrefix(strings.TrimSpace(s), "v") {
	case "auto", "":
		return DialectUnknown, nil
	case "0.5.18":
		return Dialect0518, nil
	case "0.5.20", "0.5.21":
		return Dialect0520, nil
	case "0.5.22":
		return Dialect0522, nil
	case "0.5.23":
		return Dialect0523, nil
	}
	return DialectUnknown, fmt.Errorf("unknown SGLang decode release %q: want auto, 0.5.18, 0.5.20, 0.5.21, 0.5.22 or 0.5.23", s)
}

// Notifs: the decode completes rooms on NIXL notifications (so the writes
// carry them and the completion signal is one).
func (d Dialect) Notifs() bool { return d != Dialect0523 }

// ReadsStatus: the decode runs a listener that reads KV_STATUS and ABORT_ACK.
func (d Dialect) ReadsStatus() bool { return d >= Dialect0520 }

// CompletesOnStatus: a room succeeds on decode only with KV_STATUS "4".
func (d Dialect) CompletesOnStatus() bool { return d == Dialect0523 }

// AcksWithoutGen: the decode counts a 3-frame ABORT_ACK (an ABORT without a
// generation gets one). 0.5.22+ ignore it, and send a generation whenever
// they wait for an ACK.
func (d Dialect) AcksWithoutGen() bool { return d == Dialect0520 }

// Registration frame counts after GUARD, per release (spec §1.2).
const (
	RegFramesLegacy = 23 // 0.5.18 to 0.5.22
	RegFrames0523   = 24 // + state_data_lens
)

// ErrUnsupportedRelease is wrapped by DialectOf for a registration no
// supported release sends.
var ErrUnsupportedRelease = fmt.Errorf("unsupported SGLang decode release")

// DialectOf tells a decode's dialect from its registration: 24 frames after
// GUARD is 0.5.23; 23 is one of 0.5.18 to 0.5.22, which look alike on the wire,
// so legacy (a configured default) decides. Any other count is rejected: no
// supported release sends it, and guessing would mean writing into a layout we
// cannot check.
func DialectOf(r *Registration, legacy Dialect) (Dialect, error) {
	switch r.Frames {
	case RegFrames0523:
		return Dialect0523, nil
	case RegFramesLegacy:
		if legacy == DialectUnknown || legacy == Dialect0523 {
			legacy = Dialect0520
		}
		return legacy, nil
	}
	return DialectUnknown, fmt.Errorf("%w: registration of %q has %d frames after the guard; kvxferd serves %d (SGLang 0.5.18-0.5.22) and %d (0.5.23)",
		ErrUnsupportedRelease, clip([]byte(r.AgentName)), r.Frames, RegFramesLegacy, RegFrames0523)
}
