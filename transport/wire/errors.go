package wire

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers classify decode failures with errors.Is (for example to count
// unknown tags separately from malformed frames); the wrapping FrameError says where.
var (
	// ErrEmptyMessage: a multipart message with no frames at all.
	ErrEmptyMessage = errors.New("empty multipart message")
	// ErrUnknownTag: frame 0 is none of the tags this side accepts.
	ErrUnknownTag = errors.New("unknown message tag")
	// ErrTooFewFrames: a required frame is missing.
	ErrTooFewFrames = errors.New("too few frames")
	// ErrBadFrame: a frame is present but its content is invalid.
	ErrBadFrame = errors.New("malformed frame")
)

// FrameError reports which frame of a multipart message could not be decoded, and why.
// It never carries the frame bytes themselves (they can be large, and logging them is the
// caller's choice).
type FrameError struct {
	Kind  Kind   // message kind being decoded; KindUnknown when the tag itself is the problem
	Frame int    // index in the full multipart message (tag/GUARD is frame 0); -1: whole message
	Field string // upstream field name, e.g. "msg[4] dst_kv_indices" (msg = frames after GUARD)
	// Room is the bootstrap room when it was parsed before the failure, so callers can fail
	// that room at once instead of waiting for its deadline.
	Room    uint64
	HasRoom bool
	Err     error // ErrTooFewFrames, ErrUnknownTag, ... wrapped with detail
}

func (e *FrameError) Error() string {
	s := "transport: " + e.Kind.String()
	if e.Frame >= 0 {
		s += fmt.Sprintf(" frame %d", e.Frame)
	}
	if e.Field != "" {
		s += " (" + e.Field + ")"
	}
	s += ": " + e.Err.Error()
	if e.HasRoom {
		s += fmt.Sprintf(" [room %d]", e.Room)
	}
	return s
}

func (e *FrameError) Unwrap() error { return e.Err }

// detail wraps a sentinel with a human-readable explanation while keeping errors.Is working.
func detail(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
