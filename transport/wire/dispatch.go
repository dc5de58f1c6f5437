package wire

import (
	"bytes"
)

// DecodeInbound decodes one multipart message received on the prefill PULL socket.
//
// Dispatch follows upstream's order (_start_bootstrap_thread, §4.2): WATERMARK,
// STAGING_RSP, ABORT, then GUARD with msg[0] == "None" (registration) or a room (transfer
// info). Anything else is ErrUnknownTag. Frames beyond the last one a layout defines are
// ignored (later SGLang versions append frames). Errors are *FrameError values saying which
// frame was wrong; DecodeInbound never panics, whatever the input.
//
// The returned message may alias the input frames (Registration.AgentMetadata does); the
// caller must not modify them afterwards.
func DecodeInbound(frames [][]byte) (Inbound, error) { return (*Decoder)(nil).DecodeInbound(frames) }

// Decoder is DecodeInbound with memory: it hands out the same string for the ASCII
// fields that repeat from message to message (a decode's IP and NIXL agent name in every
// transfer info), so a transfer info costs two allocations fewer. One goroutine owns a
// Decoder (the ingest loop). It keeps at most MaxKeptStrings strings of at most
// MaxKeptLen bytes and forgets them all when full, so outside input cannot grow it. The
// zero value is ready; a nil *Decoder keeps nothing.
type Decoder struct {
	strs map[string]string
}

// Limits of what a Decoder keeps.
const (
	MaxKeptStrings = 1024
	MaxKeptLen     = 256
)

func (d *Decoder) lookup(b []byte) (string, bool) {
	if d == nil || len(b) > MaxKeptLen {
		return "", false
	}
	s, ok := d.strs[string(b)] // no allocation for the lookup
	return s, ok
}

func (d *Decoder) keep(s string) {
	if d == nil || len(s) > MaxKeptLen {
		return
	}
	if d.strs == nil || len(d.strs) >= MaxKeptStrings {
		d.strs = make(map[string]string, 64)
	}
	d.strs[s] = s
}

// DecodeInbound is the package function DecodeInbound, reusing kept strings.
func (d *Decoder) DecodeInbound(frames [][]byte) (Inbound, error) {
	if len(frames) == 0 {
		return nil, &FrameError{Frame: -1, Err: ErrEmptyMessage}
	}
	switch tag := frames[0]; {
	case bytes.Equal(tag, []byte(TagWatermark)):
		return decodeWatermark(frames), nil
	case bytes.Equal(tag, []byte(TagStagingRsp)):
		return decodeStagingRsp(frames), nil
	case bytes.Equal(tag, []byte(TagAbort)):
		return decodeAbort(frames)
	case bytes.Equal(tag, []byte(TagGuard)):
		if len(frames) < 2 {
			return nil, &FrameError{Frame: 1, Field: "msg[0]", Err: detail(ErrTooFewFrames, "GUARD without a payload")}
		}
		if bytes.Equal(frames[1], []byte(TagNone)) {
			return decodeRegistration(frames)
		}
		return decodeTransferInfo(frames, d)
	default:
		return nil, &FrameError{Frame: 0, Field: "tag", Err: detail(ErrUnknownTag, "%q", clip(tag))}
	}
}

// DecodeOutbound decodes a prefill->decode message (KV_STATUS, ABORT_ACK, STAGING_REQ), as a
// decode's PULL listener would. kvxfer only sends these; the decoder serves the decode
// emulator and tests.
func DecodeOutbound(frames [][]byte) (Outbound, error) {
	if len(frames) == 0 {
		return nil, &FrameError{Frame: -1, Err: ErrEmptyMessage}
	}
	switch tag := frames[0]; {
	case bytes.Equal(tag, []byte(TagKVStatus)):
		return decodeKVStatus(frames)
	case bytes.Equal(tag, []byte(TagAbortAck)):
		return decodeAbortAck(frames)
	case bytes.Equal(tag, []byte(TagStagingReq)):
		return decodeStagingReq(frames)
	case bytes.Equal(tag, []byte(TagChunkReady)):
		return decodeChunkReady(frames)
	default:
		return nil, &FrameError{Frame: 0, Field: "tag", Err: detail(ErrUnknownTag, "%q", clip(tag))}
	}
}
