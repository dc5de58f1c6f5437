package control

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Version is the protocol version this package speaks. Within a version, fields are
// only ever added (and unknown fields are ignored by both sides), so a newer client
// works with an older server as long as it does not depend on the new fields; a change
// that would break an existing client bumps Version. hello reports it.
const Version = 1

// Ops.
const (
	OpHello              = "hello"
	OpRegisterMemory     = "register_memory"
	OpOpen               = "open"
	OpInit               = "init"
	OpSend               = "send"
	OpPoll               = "poll"
	OpAbort              = "abort"
	OpClear              = "clear"
	OpFailure            = "failure"
	OpPopDecodePrefixLen = "pop_decode_prefix_len"
	OpBatch              = "batch"
	// OpLost names rooms a previous kvxferd of this rank held when it was lost.
	OpLost = "lost"
)

// MaxLost bounds one lost request: each room is failed here and announced to
// every decode endpoint the daemon knows, on the control goroutine.
const MaxLost = 1 << 16

// Error codes. They are part of the protocol: clients switch on them, messages are
// for humans.
const (
	CodeBadRequest         = "bad_request"         // malformed msgpack, missing or mistyped field
	CodeUnknownOp          = "unknown_op"          // op not known to this server
	CodeUnsupportedVersion = "unsupported_version" // hello asked for a version this server lacks
	CodeWrongRank          = "wrong_rank"          // hello's identity does not match this daemon
	CodeInvalidMemory      = "invalid_memory"      // register_memory description failed validation
	CodeRejected           = "rejected"            // the daemon refused a valid registration
	CodeUnsupported        = "unsupported"         // a feature this daemon does not offer
	CodeInternal           = "internal"            // a bug on the server side (recovered panic)
	CodeBusy               = "busy"                // too many requests queued from this client
)

// MaxRoom is the largest room id: SGLang's bootstrap_room is a random 63-bit
// id, and the wire (ZMQ frames, HTTP) carries rooms below 2^63 only.
const MaxRoom = 1<<63 - 1

// Error is a failed request: Code is one of the Code constants.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return "kvxfer control: " + e.Code + ": " + e.Message }

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// maxBatch bounds a batch request's sub-requests and a batched op's rooms. 1<<20 rooms
// are 9 MiB of msgpack, far beyond any scheduler queue.
const maxBatch = 1 << 20

// request is one decoded request. Decoding is two-level: structural msgpack errors
// make the whole message undecodable (decodeRequest returns an error), while a field of
// the wrong type is recorded in err and the rest of the map is still consumed, so the
// reply can echo the id and a batch can go on with its next sub-request.
type request struct {
	id    uint64
	hasID bool
	op    string
	err   *Error // first field error

	// hello
	version               int64
	rank, ppRank, dpRank  int64
	hasVersion            bool
	hasRank, hasPP, hasDP bool

	// room ops
	room                   uint64
	rooms                  []uint64
	numPages, auxIndex     int64
	pages                  []int32
	state                  [][]int32
	traceparent            string
	clear                  bool
	hasRoom, hasRooms      bool
	hasNumPages, hasAuxIdx bool
	hasPages               bool

	// register_memory
	mem    MemoryRegistration
	hasMem bool

	// shm_attach, shm_detach (shm_server.go)
	shm shmAttachReq

	// batch
	reqs    []*request
	hasReqs bool

	// served turn by turn (fair.go): the engine was already driven, and a
	// poll's result columns are encoded in cols.
	sliced bool
	cols   *columns
}

func (q *request) fail(e *Error) {
	if q.err == nil {
		q.err = e
	}
}

// decodeRequest decodes one request message: a msgpack map that spans all of b.
func decodeRequest(b []byte) (*request, error) {
	r := reader{b: b}
	q, err := decodeRequestMap(&r, false)
	if err != nil {
		return nil, err
	}
	if !r.done() {
		return nil, wireError(fmt.Sprintf("%d trailing bytes after the request map", r.left()))
	}
	return q, nil
}

func decodeRequestMap(r *reader, nested bool) (*request, error) {
	n, err := r.readMapHeader()
	if err != nil {
		return nil, err
	}
	if err := r.enter(); err != nil {
		return nil, err
	}
	defer func() { r.depth-- }()
	q := &request{}
	for i := 0; i < n; i++ {
		key, err := r.strBytes()
		if err != nil {
			return nil, fmt.Errorf("request key: %w", err)
		}
		start := r.off
		if ferr := q.field(r, string(key), nested); ferr != nil {
			// Retry as a skip from where the field began: a mistyped field is a
			// request error, an unparseable one a message error.
			r.off = start
			if err := r.skip(); err != nil {
				return nil, err
			}
			q.fail(errorf(CodeBadRequest, "field %q: %v", key, ferr))
		}
	}
	return q, nil
}

// field decodes one known field; unknown fields are skipped.
func (q *request) field(r *reader, key string, nested bool) error {
	var err error
	switch key {
	case "id":
		q.id, err = r.readUint()
		q.hasID = err == nil
	case "op":
		q.op, err = r.readStr()
	case "version":
		q.version, err = r.readInt()
		q.hasVersion = err == nil
	case "rank":
		q.rank, err = r.readInt()
		q.hasRank = err == nil
	case "pp_rank":
		q.ppRank, err = r.readInt()
		q.hasPP = err == nil
	case "dp_rank":
		q.dpRank, err = r.readInt()
		q.hasDP = err == nil
	case "room":
		if q.room, err = r.readUint(); err == nil {
			err = checkRoom(q.room)
		}
		q.hasRoom = err == nil
	case "rooms":
		q.rooms, err = readRooms(r)
		q.hasRooms = err == nil
	case "num_pages":
		q.numPages, err = r.readInt()
		q.hasNumPages = err == nil
	case "aux_index":
		q.auxIndex, err = r.readInt()
		q.hasAuxIdx = err == nil
	case "pages":
		q.pages, err = readInt32sBin(r)
		q.hasPages = err == nil
	case "state":
		q.state, err = readState(r)
	case "traceparent":
		if !r.isNil() {
			q.traceparent, err = r.readStr()
		}
	case "clear":
		q.clear, err = r.readBool()
	case "pid", "ring_entries", "slots", "index_words", "session", "spin_max_us":
		err = q.shmField(r, key)
	case "kind", "component", "state_type", "buffers":
		q.hasMem = true
		err = q.mem.field(r, key)
	case "reqs":
		if nested {
			return wireError("a batch cannot contain a batch")
		}
		q.reqs, err = readBatch(r)
		q.hasReqs = err == nil
	default:
		return r.skip()
	}
	return err
}

func readRooms(r *reader) ([]uint64, error) {
	n, err := r.readArrayHeader()
	if err != nil {
		return nil, err
	}
	if n > maxBatch {
		return nil, wireError(fmt.Sprintf("%d rooms, more than %d", n, maxBatch))
	}
	out := make([]uint64, n)
	for i := range out {
		if out[i], err = r.readUint(); err == nil {
			err = checkRoom(out[i])
		}
		if err != nil {
			return nil, fmt.Errorf("rooms[%d]: %w", i, err)
		}
	}
	return out, nil
}

// checkRoom refuses room ids no decode can name: SGLang's
// bootstrap_room is 63 bits, so anything larger is a hostile or broken client.
func checkRoom(id uint64) error {
	if id > MaxRoom {
		return fmt.Errorf("room %d is not below 2^63 (SGLang's bootstrap_room is a 63-bit id)", id)
	}
	return nil
}

// readInt32sBin reads packed little-endian int32 values. The result is a fresh slice:
// the engine keeps it, and the message buffer is not ours to keep.
func readInt32sBin(r *reader) ([]int32, error) {
	b, err := r.readBin()
	if err != nil {
		return nil, err
	}
	if len(b)%4 != 0 {
		return nil, wireError(fmt.Sprintf("packed int32 bin of %d bytes is not a multiple of 4", len(b)))
	}
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out, nil
}

// readState reads nil or an array of (nil | packed int32 bin), one per state component.
func readState(r *reader) ([][]int32, error) {
	if r.isNil() {
		return nil, nil
	}
	n, err := r.readArrayHeader()
	if err != nil {
		return nil, err
	}
	out := make([][]int32, n)
	for i := range out {
		if r.isNil() {
			continue
		}
		if out[i], err = readInt32sBin(r); err != nil {
			return nil, fmt.Errorf("state[%d]: %w", i, err)
		}
	}
	return out, nil
}

func readBatch(r *reader) ([]*request, error) {
	n, err := r.readArrayHeader()
	if err != nil {
		return nil, err
	}
	if n > maxBatch {
		return nil, wireError(fmt.Sprintf("%d sub-requests, more than %d", n, maxBatch))
	}
	if err := r.enter(); err != nil {
		return nil, err
	}
	defer func() { r.depth-- }()
	out := make([]*request, n)
	for i := range out {
		if out[i], err = decodeRequestMap(r, true); err != nil {
			return nil, fmt.Errorf("reqs[%d]: %w", i, err)
		}
	}
	return out, nil
}

// Field checks used by the handlers.

func (q *request) needRoom() *Error {
	if !q.hasRoom {
		return errorf(CodeBadRequest, "%s needs room", q.op)
	}
	return nil
}

// roomList is rooms, or [room] when only room was given: every batched op takes
// either, and always answers with arrays.
func (q *request) roomList() ([]uint64, *Error) {
	switch {
	case q.hasRooms && q.hasRoom:
		return nil, errorf(CodeBadRequest, "%s takes room or rooms, not both", q.op)
	case q.hasRooms:
		return q.rooms, nil
	case q.hasRoom:
		return []uint64{q.room}, nil
	}
	return nil, errorf(CodeBadRequest, "%s needs rooms", q.op)
}

func nonNegInt32(name string, v int64) *Error {
	if v < 0 || v > math.MaxInt32 {
		return errorf(CodeBadRequest, "%s %d out of range [0, %d]", name, v, math.MaxInt32)
	}
	return nil
}
