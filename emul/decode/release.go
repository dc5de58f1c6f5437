package decode

import (
	"fmt"
	"strings"

	"github.com/kvxfer/kvxfer/transport/wire"
)

// Release is the SGLang decode release the emulator plays
// (../shared/spec/sglang-versions.md). Unlike wire.Dialect, which groups
// releases that look alike to a prefill, it tells 0.5.20 from 0.5.21: they
// differ on decode (0.5.21 holds pages until ABORT_ACK).
type Release uint8

const (
	// Release0518 completes on NIXL notifications only and never reads its
	// PULL socket; it frees a room's pages at once on abort.
	Release0518 Release = iota + 1
	// Release0520 also completes on KV_STATUS "4" from N distinct prefill
	// ranks and fails a room on KV_STATUS "0". Its deferred release is off by
	// default and never armed, so it frees at once too.
	Release0520
	// Release0521 is 0.5.20 with deferred release on: after an armed abort
	// or any failure it sends ABORT (4 frames) and holds the room's pages
	// until every target prefill rank sent ABORT_ACK, or the release timeout.
	Release0521
	// Release0522 is 0.5.21 with a generation on armed ABORTs; only 4-frame
	// ACKs echoing it count, 3-frame ACKs are ignored.
	Release0522
	// Release0523 registers with 24 frames and completes only on KV_STATUS
	// "4"; it never reads NIXL notifications.
	Release0523
	numReleases
)

var releaseNames = [numReleases]string{"", "0.5.18", "0.5.20", "0.5.21", "0.5.22", "0.5.23"}

func (r Release) String() string {
	if r > 0 && r < numReleases {
		return releaseNames[r]
	}
	return fmt.Sprintf("release(%d)", r)
}

// Releases lists every release the emulator plays, oldest first.
func Releases() []Release {
	return []Release{Release0518, Release0520, Release0521, Release0522, Release0523}
}

// ParseRelease reads "0.5.18" … "0.5.23" (a leading "v" is allowed).
func ParseRelease(s string) (Release, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	for _, r := range Releases() {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("unknown SGLang release %q: want 0.5.18, 0.5.20, 0.5.21, 0.5.22 or 0.5.23", s)
}

// MarshalText and UnmarshalText make a Release a JSON string.
func (r Release) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

func (r *Release) UnmarshalText(b []byte) error {
	v, err := ParseRelease(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// dialect is how a prefill sees this release on the wire.
func (r Release) dialect() wire.Dialect {
	switch r {
	case Release0518:
		return wire.Dialect0518
	case Release0520, Release0521:
		return wire.Dialect0520
	case Release0522:
		return wire.Dialect0522
	case Release0523:
		return wire.Dialect0523
	}
	return wire.DialectUnknown
}

// ReadsPull: the decode listener thread runs (0.5.20+). 0.5.18 without
// staging never reads its PULL socket.
func (r Release) ReadsPull() bool { return r >= Release0520 }

// Notifs: the room completes on NIXL notifications (all but 0.5.23).
func (r Release) Notifs() bool { return r != Release0523 }

// StatusCompletes: KV_STATUS "4" from N distinct prefill ranks completes a
// room (0.5.20+; for 0.5.23 it is the only way).
func (r Release) StatusCompletes() bool { return r >= Release0520 }

// Defers: an armed abort or any failure holds the room's pages until every
// target acked (0.5.21+, SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE on).
func (r Release) Defers() bool { return r >= Release0521 }

// Generations: armed ABORTs carry a generation and only ACKs echoing it
// count (0.5.22+).
func (r Release) Generations() bool { return r >= Release0522 }

// registrationFrames is the registration's frame count after GUARD.
func (r Release) registrationFrames() int {
	if r >= Release0523 {
		return wire.RegFrames0523
	}
	return wire.RegFramesLegacy
}
