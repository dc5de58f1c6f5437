package control

import "fmt"

// Fair service. One goroutine owns the socket, so a request that takes long
// (a poll of 2^20 rooms takes a third of a second) would hold up every other
// client's requests behind it. Instead each client (ROUTER identity) has a FIFO
// of requests, and the loop serves the clients that have work in turns: one
// turn runs at most Config.Slice room operations of the client's first
// request, then the next client gets its turn, and messages that arrived
// meanwhile are read between turns. A big batched op (poll, failure,
// pop_decode_prefix_len, abort, clear, or such an op inside a batch) is served
// in slices over several turns; its reply is sent when it is complete. One
// client's requests are still served one after another, in order, so its
// requests to one room take effect in order; requests of different clients
// interleave, as they may at any time.

// DefaultSlice is the room operations one turn serves (about 0.4 ms of polls).
const DefaultSlice = 1024

// maxQueued bounds the requests queued per client; beyond it a request gets
// CodeBusy at once. The clients of the reference implementations send one
// request at a time.
const maxQueued = 64

type client struct {
	id   string
	jobs []*job
}

// job is one received request being served.
type job struct {
	env [][]byte // the envelope frames the reply goes back with
	q   *request
	out []byte

	batch []*request // a batch's sub-requests, once its reply head is written
	next  int        // next sub-request to serve
	cur   *sliced    // the big room op in progress
	top   bool       // cur is q itself (not a sub-request)
}

// sliced is a big room op served over several turns: its rooms are polled
// (and then cleared, for failure with clear), aborted or cleared, n at a time.
type sliced struct {
	q      *request
	rooms  []uint64
	phases []string // "poll", "abort", "clear"
	done   int      // operations done, over len(rooms) × len(phases)
}

func (sl *sliced) total() int { return len(sl.rooms) * len(sl.phases) }

// enqueue takes one received message: a request queued for its client, or an
// envelope that cannot be answered (dropped).
func (s *Server) enqueue(frames [][]byte) {
	s.messages.Add(1)
	if len(frames) < 2 {
		s.dropped.Add(1)
		return
	}
	env := 1
	if len(frames) >= 3 && len(frames[1]) == 0 {
		env = 2
	}
	body := frames[env:]
	var q *request
	if len(body) != 1 {
		q = &request{err: errorf(CodeBadRequest, "want one body frame, got %d", len(body))}
	} else if dq, err := decodeRequest(body[0]); err != nil {
		q = &request{err: errorf(CodeBadRequest, "undecodable request: %v", err)}
	} else {
		q = dq
	}
	if q.err != nil {
		s.log.Debug("control: bad request", "err", q.err.Message)
	}
	j := &job{env: frames[:env], q: q}
	id := string(frames[0])
	c := s.clients[id]
	if c == nil {
		c = &client{id: id}
		s.clients[id] = c
		s.ring = append(s.ring, c)
	}
	if len(c.jobs) >= maxQueued {
		q.fail(errorf(CodeBusy, "more than %d requests queued from this client: wait for the replies", maxQueued))
		s.reply(j, s.handle(nil, q, true))
		return
	}
	c.jobs = append(c.jobs, j)
	s.queued++
}

// turn gives every client with queued requests one turn, in arrival order of
// the clients, and drops the clients left with nothing queued.
func (s *Server) turn() {
	ring := s.ring[:0]
	for _, c := range s.ring {
		if len(c.jobs) > 0 {
			if j := c.jobs[0]; s.step(j) {
				s.reply(j, j.out)
				c.jobs[0] = nil
				c.jobs = c.jobs[1:]
				s.queued--
			}
		}
		if len(c.jobs) > 0 {
			ring = append(ring, c)
		} else {
			delete(s.clients, c.id)
		}
	}
	clear(s.ring[len(ring):])
	s.ring = ring
}

// step serves up to Slice room operations of j and reports whether its reply
// is complete (in j.out).
func (s *Server) step(j *job) bool {
	budget := s.cfg.Slice
	for {
		if j.cur != nil {
			budget -= s.advance(j.cur, budget)
			if j.cur.done < j.cur.total() {
				return false
			}
			j.cur.q.sliced = true
			j.out = s.handle(j.out, j.cur.q, j.top)
			j.cur = nil
			if j.batch == nil {
				return true
			}
		} else if j.batch == nil {
			q := j.q
			if sl := s.sliceable(q, true); sl != nil {
				j.cur, j.top = sl, true
				continue
			}
			if q.err != nil || !q.hasID || q.op != OpBatch || !q.hasReqs || len(q.reqs) == 0 {
				j.out = s.handle(j.out, q, true)
				return true
			}
			// A batch: its reply head now, its sub-replies as they are served.
			j.out = s.replyHead(j.out, q, true, true)
			j.out = appendStr(j.out, "result")
			j.out = appendArrayHeader(appendStr(appendMapHeader(j.out, 1), "replies"), len(q.reqs))
			j.batch = q.reqs
		}
		if j.next == len(j.batch) {
			return true
		}
		if budget <= 0 {
			return false
		}
		sub := j.batch[j.next]
		j.next++
		if sl := s.sliceable(sub, false); sl != nil {
			j.cur, j.top = sl, false
			continue
		}
		j.out = s.handle(j.out, sub, false)
		budget--
	}
}

// sliceable returns the slicing of q when q is a valid batched room op over
// more rooms than one turn serves; nil otherwise (handle serves it at once).
func (s *Server) sliceable(q *request, top bool) *sliced {
	if q.err != nil || (top && !q.hasID) {
		return nil
	}
	var phases []string
	switch q.op {
	case OpPoll, OpPopDecodePrefixLen:
		phases = []string{"poll"}
	case OpFailure:
		phases = []string{"poll"}
		if q.clear {
			phases = append(phases, "clear")
		}
	case OpAbort:
		phases = []string{"abort"}
	case OpClear:
		phases = []string{"clear"}
	default:
		return nil
	}
	rooms, e := q.roomList()
	if e != nil || len(rooms) <= s.cfg.Slice {
		return nil
	}
	return &sliced{q: q, rooms: rooms, phases: phases}
}

// advance runs up to budget operations of sl and returns how many it ran. A
// panic in the engine fails the request (CodeInternal) instead of the loop.
func (s *Server) advance(sl *sliced, budget int) (ran int) {
	defer func() {
		if p := recover(); p != nil {
			s.panics.Add(1)
			s.log.Error("control: panic serving a request", "op", sl.q.op, "panic", p)
			sl.q.fail(errorf(CodeInternal, "panic in %s: %v", sl.q.op, p))
			ran, sl.done = sl.total()-sl.done, sl.total()
		}
	}()
	n := len(sl.rooms)
	for budget > ran && sl.done < sl.total() {
		phase, i := sl.phases[sl.done/n], sl.done%n
		k := min(budget-ran, n-i)
		part := sl.rooms[i : i+k]
		switch phase {
		case "poll":
			s.replies = s.cfg.Engine.Poll(part, s.replies)
			if len(s.replies) != len(part) {
				panic(fmt.Sprintf("engine answered %d of %d rooms", len(s.replies), len(part)))
			}
			if sl.q.cols == nil {
				sl.q.cols = &columns{status: make([]byte, 0, n), reason: make([]byte, 0, n), third: make([]byte, 0, n)}
			}
			sl.q.cols.add(sl.q.op, s.replies)
		case "abort":
			for _, r := range part {
				s.cfg.Engine.Abort(r)
			}
		case "clear":
			for _, r := range part {
				s.cfg.Engine.Clear(r)
			}
		}
		sl.done += k
		ran += k
	}
	return ran
}

// reply sends out to j's client with j's envelope.
func (s *Server) reply(j *job, out []byte) {
	parts := make([]any, 0, len(j.env)+1)
	for _, f := range j.env {
		parts = append(parts, f)
	}
	parts = append(parts, out)
	if err := s.sendMsg(parts); err != nil {
		s.sendErrors.Add(1)
		s.log.Debug("control: reply not sent", "err", err)
	}
}
