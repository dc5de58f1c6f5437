package nixl

import (
	"errors"
	"fmt"
)

// Sentinel errors. Backends wrap them with context (fmt.Errorf("...: %w", ErrX));
// callers test with errors.Is. They map from nixl_status_t as noted.
var (
	// ErrRemoteDisconnect: the peer went away (NIXL_ERR_REMOTE_DISCONNECT). The
	// agent treats the peer as unusable until it is dropped and loaded again.
	ErrRemoteDisconnect = errors.New("nixl: remote disconnect")
	// ErrPeerUnknown: no metadata is loaded for that peer, or the handle was built
	// against metadata that has since been dropped (NIXL_ERR_NOT_FOUND). A request
	// failing this way has an unknown real outcome.
	ErrPeerUnknown = errors.New("nixl: peer unknown")
	// ErrRequestActive: the request is in flight; it cannot be re-posted or
	// released yet (NIXL_ERR_REPOST_ACTIVE and release-while-running).
	ErrRequestActive = errors.New("nixl: request active")
	// ErrInvalid: a bad argument: descriptor outside any registered region, length
	// mismatch, index out of range, unknown handle, malformed metadata
	// (NIXL_ERR_INVALID_PARAM, NIXL_ERR_MISMATCH, NIXL_ERR_NOT_FOUND for descriptors).
	ErrInvalid = errors.New("nixl: invalid argument")
	// ErrBackend: the transport failed (NIXL_ERR_BACKEND), including injected faults.
	ErrBackend = errors.New("nixl: backend error")
	// ErrClosed: the agent was closed.
	ErrClosed = errors.New("nixl: agent closed")
)

// Errorf wraps sentinel with a formatted context message. It keeps errors.Is
// working and puts the context first: "op: detail: nixl: invalid argument".
func Errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), sentinel)
}
