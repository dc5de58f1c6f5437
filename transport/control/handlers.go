package control

import (
	"fmt"
	"os"

	"github.com/kvxfer/kvxfer/kv"
)

// Engine is what the control server drives for the room ops (the daemon hands it
// the actors' engine); the methods must not block for long, because they run on the socket's
// goroutine (Poll waits for the room actors' answers, which is the point of a poll).
type Engine interface {
	Open(roomID uint64)
	Init(roomID uint64, numPages, auxIndex int)
	// Send keeps pages and state: the server hands over fresh slices.
	Send(roomID uint64, pages []int32, state [][]int32)
	Abort(roomID uint64)
	Clear(roomID uint64)
	Poll(rooms []uint64, out []kv.Reply) []kv.Reply
}

// TracedOpener is an Engine that can join a room to the scheduler's trace. When the
// Engine implements it, open with a valid traceparent calls OpenTraced instead of Open.
type TracedOpener interface {
	OpenTraced(roomID uint64, traceparent string)
}

// RecordBatch gathers room operations for one hand-off to the engine, at
// Flush; operations on one room keep their order, within a batch and against
// those of a later batch. Each does what the Engine method of its name does.
// It belongs to the goroutine that made it.
type RecordBatch interface {
	Open(roomID uint64)
	OpenTraced(roomID uint64, traceparent string)
	Init(roomID uint64, numPages, auxIndex int)
	Send(roomID uint64, pages []int32, state [][]int32)
	Abort(roomID uint64)
	Fail(roomID uint64, why kv.Reason)
	Clear(roomID uint64)
	Flush()
}

// BatchEngine is an Engine that takes the records of one drain of a
// shared-memory ring as one batch (a mailbox message per shard, not per
// record). OpenTraced is used only where the Engine is a TracedOpener.
type BatchEngine interface {
	NewRecordBatch() RecordBatch
}

// MemoryFunc receives every register_memory that passed Validate, on the socket's
// goroutine: it may map files (fast) but must not wait on the network. An error with
// a *Error is sent as is; any other error is sent with CodeRejected. Validate only
// checks the form of the paths: which directories the daemon is willing to map from is
// the callback's policy (the scheduler runs as the same user, so a 0600 socket makes
// this a guard against mistakes, not against an attacker).
type MemoryFunc func(reg *MemoryRegistration) error

// Identity is who this daemon is, reported by hello and checked against what the
// scheduler says it expects, so that a scheduler rank wired to another rank's daemon
// fails at startup rather than transferring the wrong KV cache.
type Identity struct {
	Rank   int    // engine_rank: the prefill tp_rank
	PPRank int    // pp_rank
	DPRank int    // system_dp_rank
	Name   string // free form (e.g. the NIXL agent name), for logs
}

// handle appends the reply map for q. top replies carry the id; sub-replies of a batch
// do not (they answer by position).
func (s *Server) handle(b []byte, q *request, top bool) []byte {
	start := len(b)
	if top && !q.hasID {
		q.fail(errorf(CodeBadRequest, "missing id"))
	}
	if q.err == nil {
		b = s.replyHead(b, q, top, true)
		b = appendStr(b, "result")
		var e *Error
		if b, e = s.dispatch(b, q); e == nil {
			return b
		}
		b = b[:start]
		q.err = e
	}
	s.errors.Add(1)
	b = s.replyHead(b, q, top, false)
	b = appendStr(appendStr(b, "code"), q.err.Code)
	return appendStr(appendStr(b, "error"), q.err.Message)
}

// replyHead writes the map header, the id (top level) and ok.
func (s *Server) replyHead(b []byte, q *request, top, ok bool) []byte {
	n := 2
	if !ok {
		n = 3
	}
	if top {
		b = appendMapHeader(b, n+1)
		b = appendStr(b, "id")
		if q.hasID {
			b = appendUint(b, q.id)
		} else {
			b = appendNil(b)
		}
	} else {
		b = appendMapHeader(b, n)
	}
	return appendBool(appendStr(b, "ok"), ok)
}

// dispatch appends the result of q. A panic in the engine or the memory callback is a
// bug there; it becomes a CodeInternal reply instead of killing the control loop.
func (s *Server) dispatch(b []byte, q *request) (out []byte, e *Error) {
	defer func() {
		if p := recover(); p != nil {
			s.panics.Add(1)
			s.log.Error("control: panic serving a request", "op", q.op, "panic", p)
			out, e = b, errorf(CodeInternal, "panic in %s: %v", q.op, p)
		}
	}()
	switch q.op {
	case OpHello:
		return s.hello(b, q)
	case OpShmAttach:
		return s.shmAttach(b, q)
	case OpShmDetach:
		return s.shmDetach(b, q)
	case OpRegisterMemory:
		return s.registerMemory(b, q)
	case OpOpen:
		return s.open(b, q)
	case OpInit:
		return s.init(b, q)
	case OpSend:
		return s.send(b, q)
	case OpPoll, OpFailure, OpPopDecodePrefixLen:
		return s.poll(b, q)
	case OpAbort, OpClear:
		rooms, e := q.roomList()
		if e != nil {
			return b, e
		}
		for _, r := range rooms {
			if q.sliced {
				break // served turn by turn already (fair.go)
			}
			if q.op == OpAbort {
				s.cfg.Engine.Abort(r)
			} else {
				s.cfg.Engine.Clear(r)
			}
		}
		return appendUint(appendStr(appendMapHeader(b, 1), "n"), uint64(len(rooms))), nil
	case OpLost:
		rooms, e := q.roomList()
		if e != nil {
			return b, e
		}
		if len(rooms) > MaxLost {
			return b, errorf(CodeBadRequest, "lost takes at most %d rooms, got %d", MaxLost, len(rooms))
		}
		if s.cfg.Lost == nil {
			return b, errorf(CodeUnsupported, "this daemon cannot take a predecessor's rooms")
		}
		told := s.cfg.Lost(rooms)
		b = appendUint(appendStr(appendMapHeader(b, 2), "n"), uint64(len(rooms)))
		return appendUint(appendStr(b, "told"), uint64(told)), nil
	case OpBatch:
		if !q.hasReqs {
			return b, errorf(CodeBadRequest, "batch needs reqs")
		}
		b = appendArrayHeader(appendStr(appendMapHeader(b, 1), "replies"), len(q.reqs))
		for _, sub := range q.reqs {
			b = s.handle(b, sub, false)
		}
		return b, nil
	case "":
		return b, errorf(CodeBadRequest, "missing op")
	}
	return b, errorf(CodeUnknownOp, "unknown op %q", q.op)
}

func (s *Server) hello(b []byte, q *request) ([]byte, *Error) {
	id := s.cfg.Identity
	if q.hasVersion && q.version != Version {
		return b, errorf(CodeUnsupportedVersion, "client speaks version %d, this server %d", q.version, Version)
	}
	for _, c := range []struct {
		name      string
		has       bool
		got, want int64
	}{{"rank", q.hasRank, q.rank, int64(id.Rank)}, {"pp_rank", q.hasPP, q.ppRank, int64(id.PPRank)}, {"dp_rank", q.hasDP, q.dpRank, int64(id.DPRank)}} {
		if c.has && c.got != c.want {
			return b, errorf(CodeWrongRank, "scheduler expects %s %d, this daemon is %s %d", c.name, c.got, c.name, c.want)
		}
	}
	b = appendMapHeader(b, 8)
	b = appendInt(appendStr(b, "version"), Version)
	b = appendStr(appendStr(b, "server"), "kvxferd")
	b = appendInt(appendStr(b, "rank"), int64(id.Rank))
	b = appendInt(appendStr(b, "pp_rank"), int64(id.PPRank))
	b = appendInt(appendStr(b, "dp_rank"), int64(id.DPRank))
	b = appendStr(appendStr(b, "name"), id.Name)
	b = appendInt(appendStr(b, "pid"), int64(os.Getpid()))
	return appendInt(appendStr(b, "max_message"), s.cfg.MaxMessage), nil
}

func (s *Server) registerMemory(b []byte, q *request) ([]byte, *Error) {
	if !q.hasMem {
		return b, errorf(CodeBadRequest, "register_memory needs kind and buffers")
	}
	if err := q.mem.Validate(); err != nil {
		return b, err.(*Error)
	}
	if s.cfg.Memory == nil {
		return b, errorf(CodeUnsupported, "this daemon takes no memory registrations")
	}
	if err := s.cfg.Memory(&q.mem); err != nil {
		if ce, ok := err.(*Error); ok {
			return b, ce
		}
		return b, errorf(CodeRejected, "%v", err)
	}
	b = appendMapHeader(b, 3)
	b = appendStr(appendStr(b, "kind"), string(q.mem.Kind))
	b = appendInt(appendStr(b, "buffers"), int64(len(q.mem.Buffers)))
	return appendInt(appendStr(b, "slots"), int64(q.mem.NumSlots())), nil
}

func (s *Server) open(b []byte, q *request) ([]byte, *Error) {
	if e := q.needRoom(); e != nil {
		return b, e
	}
	traced := false
	if q.traceparent != "" {
		if to, ok := s.cfg.Engine.(TracedOpener); ok && validTraceparent(q.traceparent) {
			to.OpenTraced(q.room, q.traceparent)
			traced = true
		}
	}
	if !traced {
		s.cfg.Engine.Open(q.room)
	}
	return appendBool(appendStr(appendMapHeader(b, 1), "traced"), traced), nil
}

func (s *Server) init(b []byte, q *request) ([]byte, *Error) {
	if e := q.needRoom(); e != nil {
		return b, e
	}
	if !q.hasNumPages || !q.hasAuxIdx {
		return b, errorf(CodeBadRequest, "init needs num_pages and aux_index")
	}
	if e := nonNegInt32("num_pages", q.numPages); e != nil {
		return b, e
	}
	if e := nonNegInt32("aux_index", q.auxIndex); e != nil {
		return b, e
	}
	s.cfg.Engine.Init(q.room, int(q.numPages), int(q.auxIndex))
	return appendMapHeader(b, 0), nil
}

func (s *Server) send(b []byte, q *request) ([]byte, *Error) {
	if e := q.needRoom(); e != nil {
		return b, e
	}
	if !q.hasPages {
		return b, errorf(CodeBadRequest, "send needs pages (an empty bin for none)")
	}
	s.cfg.Engine.Send(q.room, q.pages, q.state)
	return appendMapHeader(b, 0), nil
}

// poll serves poll, failure and pop_decode_prefix_len: all three read the rooms'
// replies and differ only in what they return.
func (s *Server) poll(b []byte, q *request) ([]byte, *Error) {
	rooms, e := q.roomList()
	if e != nil {
		return b, e
	}
	if q.sliced {
		return q.cols.appendResult(b, q.op, len(rooms)), nil // served turn by turn (fair.go)
	}
	s.replies = s.cfg.Engine.Poll(rooms, s.replies)
	rs := s.replies
	if len(rs) != len(rooms) {
		return b, errorf(CodeInternal, "engine answered %d of %d rooms", len(rs), len(rooms))
	}
	switch q.op {
	case OpPoll:
		b = appendMapHeader(b, 3)
		b = appendArrayHeader(appendStr(b, "status"), len(rs))
		for _, r := range rs {
			b = appendUint(b, uint64(r.Status))
		}
		b = appendReasons(b, rs)
		b = appendPrefixLens(b, rs)
	case OpPopDecodePrefixLen:
		b = appendPrefixLens(appendMapHeader(b, 1), rs)
	case OpFailure:
		b = appendMapHeader(b, 3)
		b = appendArrayHeader(appendStr(b, "status"), len(rs))
		for _, r := range rs {
			b = appendUint(b, uint64(r.Status))
		}
		b = appendReasons(b, rs)
		b = appendArrayHeader(appendStr(b, "message"), len(rs))
		for _, r := range rs {
			b = appendStr(b, FailureMessage(r))
		}
		if q.clear && !q.sliced {
			for _, r := range rooms {
				s.cfg.Engine.Clear(r)
			}
		}
	}
	return b, nil
}

// columns are a poll result's arrays, encoded a slice of rooms at a time
// (fair.go); appendResult writes the same bytes as poll does at once.
type columns struct{ status, reason, third []byte }

func (c *columns) add(op string, rs []kv.Reply) {
	for _, r := range rs {
		switch op {
		case OpPoll:
			c.status = appendUint(c.status, uint64(r.Status))
			c.reason = appendStr(c.reason, r.Reason.String())
			c.third = appendInt(c.third, int64(r.PrefixLen))
		case OpFailure:
			c.status = appendUint(c.status, uint64(r.Status))
			c.reason = appendStr(c.reason, r.Reason.String())
			c.third = appendStr(c.third, FailureMessage(r))
		case OpPopDecodePrefixLen:
			c.third = appendInt(c.third, int64(r.PrefixLen))
		}
	}
}

func (c *columns) appendResult(b []byte, op string, n int) []byte {
	if op == OpPopDecodePrefixLen {
		return append(appendArrayHeader(appendStr(appendMapHeader(b, 1), "prefix_len"), n), c.third...)
	}
	b = append(appendArrayHeader(appendStr(appendMapHeader(b, 3), "status"), n), c.status...)
	b = append(appendArrayHeader(appendStr(b, "reason"), n), c.reason...)
	third := "prefix_len"
	if op == OpFailure {
		third = "message"
	}
	return append(appendArrayHeader(appendStr(b, third), n), c.third...)
}

func appendReasons(b []byte, rs []kv.Reply) []byte {
	b = appendArrayHeader(appendStr(b, "reason"), len(rs))
	for _, r := range rs {
		b = appendStr(b, r.Reason.String())
	}
	return b
}

func appendPrefixLens(b []byte, rs []kv.Reply) []byte {
	b = appendArrayHeader(appendStr(b, "prefix_len"), len(rs))
	for _, r := range rs {
		b = appendInt(b, int64(r.PrefixLen))
	}
	return b
}

// FailureMessage is the text failure_exception should raise for a polled room: ""
// unless the room failed. It follows SGLang's wording where SGLang has one.
func FailureMessage(r kv.Reply) string {
	if r.Status != kv.StatusFailed {
		return ""
	}
	switch r.Reason {
	case kv.ReasonClientAbort:
		return "Aborted by AbortReq."
	case kv.ReasonDecodeAbort:
		return "Aborted by decode."
	case kv.ReasonBootstrapTimeout:
		return "Bootstrap timed out: decode did not send its transfer info in time."
	case kv.ReasonWaitingTimeout:
		return "Timed out waiting for the scheduler's next chunk."
	case kv.ReasonTransferTimeout:
		return "KV transfer timed out."
	case kv.ReasonTransferError:
		return "KV transfer failed."
	case kv.ReasonPeerLost:
		return "Decode peer lost."
	case kv.ReasonInvalidRequest:
		return "Invalid request: the scheduler's calls, or decode's transfer info or memory, do not fit this room."
	case kv.ReasonShutdown:
		return "kvxferd is shutting down."
	case kv.ReasonRoomCap:
		return "kvxferd refused the room: too many live rooms (KVXFER_ROOM_CAP)."
	case kv.ReasonClientLost:
		return "kvxferd dropped this scheduler's shared-memory session (client_lost)."
	case kv.ReasonTransferProcessLost:
		return "transfer_process_lost: the kvxferd that held this room was lost."
	case kv.ReasonNone:
		return "KVSender failed."
	}
	return fmt.Sprintf("KVSender failed: %s.", r.Reason)
}
