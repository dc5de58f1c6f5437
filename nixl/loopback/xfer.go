package loopback

import (
	"runtime/debug"
	"sync"

	"github.com/kvxfer/kvxfer/nixl"
)

// seg is one copy: n bytes from src.data[srcOff:] to dst.data[dstOff:].
type seg struct {
	src, dst       *mapping
	srcOff, dstOff uint64
	n              uint64
}

// xfer is a transfer request. Every field is guarded by Agent.mu; workers read
// segs and notif, which never change after Make.
type xfer struct {
	op       nixl.Op
	peer     *peer
	segs     []seg
	notif    []byte // the notification's datagram (encodeNotif)
	msg      []byte // and its message
	hasNotif bool
	state    nixl.State
	err      error
	epoch    uint64 // bumped by each Post, so a stale job cannot finish a new post
	// due is the monotonic time (mono) before which a post with injected
	// latency cannot complete; 0 for a post without latency. Nothing fires at
	// that time: the request completes when it is polled at or after it.
	due int64
	// landed: the worker finished a delayed post (bytes copied, or failed with
	// pendErr); the notification and the terminal state wait for a poll at or
	// after due.
	landed  bool
	pendErr error
	sending bool // a poll is sending the notification of this post
}

// appendSeg adds a copy, merging it into the previous one when both sides are
// adjacent in memory (what NIXL's makeXferReq does for consecutive indices).
func appendSeg(segs []seg, s seg) []seg {
	if k := len(segs) - 1; k >= 0 {
		p := &segs[k]
		if p.src == s.src && p.dst == s.dst && p.srcOff+p.n == s.srcOff && p.dstOff+p.n == s.dstOff {
			p.n += s.n
			return segs
		}
	}
	return append(segs, s)
}

// orient turns (local, remote) into (src, dst) for op.
func orient(op nixl.Op, lm *mapping, loff uint64, rm *mapping, roff uint64, n uint64) seg {
	if op == nixl.Read {
		return seg{src: rm, srcOff: roff, dst: lm, dstOff: loff, n: n}
	}
	return seg{src: lm, srcOff: loff, dst: rm, dstOff: roff, n: n}
}

// Make implements nixl.Agent.
func (a *Agent) Make(op nixl.Op, local nixl.ListID, li []int32, remote nixl.ListID, ri []int32, notif []byte) (nixl.XferID, error) {
	if op != nixl.Write && op != nixl.Read {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback make: op %v", op)
	}
	if len(li) != len(ri) || len(li) == 0 {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback make: %d local and %d remote indices", len(li), len(ri))
	}
	if len(notif) > MaxNotifLen {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback make: notification of %d bytes", len(notif))
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return 0, nixl.ErrClosed
	}
	ll, rl := a.lists[local], a.lists[remote]
	switch {
	case ll == nil || rl == nil:
		a.mu.Unlock()
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback make: unknown list (local %d, remote %d)", local, remote)
	case ll.peer != nil:
		a.mu.Unlock()
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback make: list %d is not a local list", local)
	case rl.peer == nil:
		a.mu.Unlock()
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback make: list %d is not a remote list", remote)
	case a.peers[rl.peer.name] != rl.peer:
		a.mu.Unlock()
		return 0, nixl.Errorf(nixl.ErrPeerUnknown, "loopback make: list %d was prepared for %q, which has been dropped", remote, rl.peer.name)
	}
	a.mu.Unlock()
	// Lists are immutable; resolve without the lock. The segments are
	// merged in scratch space and the request keeps an exact copy: how many
	// there are is known only once merged, and growing the request's own
	// slice to it was a fifth of the bytes kvxferd allocated per room.
	sp := segScratch.Get().(*[]seg)
	segs, err := resolveSegs((*sp)[:0], op, ll, li, rl, ri)
	var own []seg
	if err == nil {
		own = append(make([]seg, 0, len(segs)), segs...)
	}
	clear(segs)
	*sp = segs[:0]
	segScratch.Put(sp)
	if err != nil {
		return 0, err
	}
	return a.addXfer(op, rl.peer, own, notif)
}

// segScratch holds the scratch slices Make merges segments in.
var segScratch = sync.Pool{New: func() any { s := make([]seg, 0, 64); return &s }}

// resolveSegs appends the copies of index pairs li/ri of lists ll and rl to
// segs, adjacent ones merged.
func resolveSegs(segs []seg, op nixl.Op, ll *plist, li []int32, rl *plist, ri []int32) ([]seg, error) {
	lh, rh := 0, 0
	for i := range li {
		lr, loff, ok1 := ll.at(int(li[i]), &lh)
		rr, roff, ok2 := rl.at(int(ri[i]), &rh)
		if !ok1 || !ok2 {
			return segs, nixl.Errorf(nixl.ErrInvalid, "loopback make: index pair %d (%d of %d local, %d of %d remote) out of range", i, li[i], ll.n, ri[i], rl.n)
		}
		if lr.len != rr.len {
			return segs, nixl.Errorf(nixl.ErrInvalid, "loopback make: index pair %d length %d local vs %d remote", i, lr.len, rr.len)
		}
		segs = appendSeg(segs, orient(op, lr.reg.m, loff, rr.reg.m, roff, lr.len))
	}
	return segs, nil
}

// Create implements nixl.Agent.
func (a *Agent) Create(op nixl.Op, lkind nixl.MemKind, local []nixl.Desc, peerName string, rkind nixl.MemKind, remote []nixl.Desc, notif []byte) (nixl.XferID, error) {
	if op != nixl.Write && op != nixl.Read {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback create: op %v", op)
	}
	if len(local) != len(remote) || len(local) == 0 {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback create: %d local and %d remote descriptors", len(local), len(remote))
	}
	if len(notif) > MaxNotifLen {
		return 0, nixl.Errorf(nixl.ErrInvalid, "loopback create: notification of %d bytes", len(notif))
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return 0, nixl.ErrClosed
	}
	p := a.peers[peerName]
	if p == nil {
		a.mu.Unlock()
		return 0, nixl.Errorf(nixl.ErrPeerUnknown, "loopback create for %q", peerName)
	}
	lv := resolver{regions: a.localRegions()}
	a.mu.Unlock()
	rv := resolver{regions: p.regions}
	segs := make([]seg, 0, len(local))
	for i := range local {
		l, r := local[i], remote[i]
		if l.Len != r.Len {
			return 0, nixl.Errorf(nixl.ErrInvalid, "loopback create: descriptor %d length %d local vs %d remote", i, l.Len, r.Len)
		}
		lr, rr := lv.find(lkind, l), rv.find(rkind, r)
		if lr == nil || rr == nil {
			return 0, nixl.Errorf(nixl.ErrInvalid, "loopback create: descriptor %d (local %#x,+%d %v; remote %#x,+%d %v) is not inside a registered region", i, l.Addr, l.Len, lkind, r.Addr, r.Len, rkind)
		}
		segs = appendSeg(segs, orient(op, lr.m, lr.off+(uint64(l.Addr)-lr.addr), rr.m, rr.off+(uint64(r.Addr)-rr.addr), l.Len))
	}
	return a.addXfer(op, p, segs, notif)
}

func (a *Agent) addXfer(op nixl.Op, p *peer, segs []seg, notif []byte) (nixl.XferID, error) {
	x := &xfer{op: op, peer: p, segs: segs, state: nixl.Idle}
	if notif != nil {
		x.notif, x.hasNotif = encodeNotif(a.name, notif), true
		x.msg = x.notif[2+len(a.name):]
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, nixl.ErrClosed
	}
	id := nixl.XferID(a.nextID())
	a.xfers[id] = x
	return id, nil
}

// Post implements nixl.Agent. The copy runs on the worker pool, after the peer's
// injected latency if any; the result is always InProgress on success.
func (a *Agent) Post(id nixl.XferID) (nixl.State, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nixl.Failed, nixl.ErrClosed
	}
	x := a.xfers[id]
	if x == nil {
		return nixl.Failed, nixl.Errorf(nixl.ErrInvalid, "loopback post: unknown request %d", id)
	}
	if x.state == nixl.InProgress {
		return nixl.InProgress, nixl.Errorf(nixl.ErrRequestActive, "loopback post: request %d is in flight", id)
	}
	f := a.faults[x.peer.name]
	switch {
	case a.peers[x.peer.name] != x.peer:
		x.state, x.err = nixl.Failed, nixl.Errorf(nixl.ErrPeerUnknown, "loopback post: request %d targets dropped peer %q", id, x.peer.name)
		return nixl.Failed, x.err
	case x.peer.disconnd || f.Disconnect:
		x.state, x.err = nixl.Failed, nixl.Errorf(nixl.ErrRemoteDisconnect, "loopback post: peer %q", x.peer.name)
		return nixl.Failed, x.err
	}
	x.state, x.err = nixl.InProgress, nil
	x.epoch++
	j := job{id: id, x: x, epoch: x.epoch}
	if f.Hang {
		return nixl.InProgress, nil
	}
	x.due, x.landed, x.pendErr, x.sending = 0, false, nil, false
	if d := f.delay(x.bytes()); d > 0 {
		// The copy runs now; completion (notification, Done) waits for a
		// poll at or after due. No timer.
		x.due = a.mono() + int64(d)
		a.dues.push(dueEntry{due: x.due, x: x, epoch: x.epoch})
	}
	a.q.push(j)
	return nixl.InProgress, nil
}

// bytes is the request's payload size.
func (x *xfer) bytes() uint64 {
	var n uint64
	for _, s := range x.segs {
		n += s.n
	}
	return n
}

// Poll implements nixl.Agent. A request posted with injected latency whose
// bytes have landed completes here, in the first poll at or after its due
// time: its notification is sent, then it reports Done.
func (a *Agent) Poll(xs []nixl.XferID, out []nixl.Status) error {
	if len(out) < len(xs) {
		return nixl.Errorf(nixl.ErrInvalid, "loopback poll: %d results for %d requests", len(out), len(xs))
	}
	if done, err := a.pollShared(xs, out); done || err != nil {
		return err
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nixl.ErrClosed
	}
	var now int64
	var sendBuf [16]job
	send := sendBuf[:0]
	for _, id := range xs {
		x := a.xfers[id]
		if x == nil || x.state != nixl.InProgress || !x.landed || x.sending {
			continue
		}
		if now == 0 {
			now = a.mono()
		}
		if now < x.due {
			continue
		}
		switch {
		case x.pendErr != nil:
			x.state, x.err = nixl.Failed, x.pendErr
		case !x.hasNotif:
			x.state, x.err = nixl.Done, nil
		default:
			x.sending = true
			send = append(send, job{id: id, x: x, epoch: x.epoch})
		}
	}
	if len(send) > 0 {
		// Send outside the lock (a datagram write), then settle.
		a.mu.Unlock()
		var errBuf [16]error
		errs := a.sendDue(send, errBuf[:0])
		a.mu.Lock()
		for i, j := range send {
			j.sentLocked(errs[i])
		}
	}
	for i, id := range xs {
		x := a.xfers[id]
		if x == nil {
			out[i] = nixl.Status{State: nixl.Failed, Err: nixl.Errorf(nixl.ErrInvalid, "loopback poll: unknown request %d", id)}
			continue
		}
		out[i] = nixl.Status{State: x.state, Err: x.err}
	}
	a.mu.Unlock()
	return nil
}

// sendDue sends the notifications of requests that came due in one poll,
// those of one peer batched into as few datagrams as fit (appendNotifs), as
// the copy workers send theirs: a datagram per notification made each poll
// a write per request, and a socket whose reader lags fills up sooner. It
// appends each request's send error to errs. Unlike the copy workers' and
// SendNotifs' sends it waits for the peer's queue (sendRaw, bounded by
// NotifyTimeout) rather than leave the request in flight in the peer's
// outbox: a poller is the caller that asks whether its request is done,
// and one that polls in a loop (SGLang's transfer worker) would spin on it,
// taking the processor from the reader it waits for.
func (a *Agent) sendDue(send []job, errs []error) []error {
	for range send {
		errs = append(errs, nil)
	}
	bp := notifBufs.Get().(*notifBuf)
	done := bp.done[:0]
	for range send {
		done = append(done, false)
	}
	for i := range send {
		if done[i] {
			continue
		}
		p := send[i].x.peer
		bp.msgs = bp.msgs[:0]
		for k := i; k < len(send); k++ {
			if !done[k] && send[k].x.peer == p {
				bp.msgs = append(bp.msgs, send[k].x.msg)
			}
		}
		var err error
		bp.buf, err = appendNotifs(bp.buf, a.name, bp.msgs, func(frame []byte) error { return a.sendRaw(p, frame) })
		for k := i; k < len(send); k++ {
			if !done[k] && send[k].x.peer == p {
				done[k], errs[k] = true, err
			}
		}
	}
	clear(bp.msgs)
	bp.done = done[:0]
	notifBufs.Put(bp)
	return errs
}

// notifBuf is sendDue's scratch space, reused across polls.
type notifBuf struct {
	msgs [][]byte
	buf  []byte
	done []bool
}

var notifBufs = sync.Pool{New: func() any { return &notifBuf{} }}

// pollShared answers a poll under the read lock when no request of xs is due
// to complete now (the common case: a worker completes it, or its due time
// has not come). done false: the caller takes the write lock and completes.
func (a *Agent) pollShared(xs []nixl.XferID, out []nixl.Status) (done bool, err error) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return true, nixl.ErrClosed
	}
	var now int64
	for i, id := range xs {
		x := a.xfers[id]
		if x == nil {
			out[i] = nixl.Status{State: nixl.Failed, Err: nixl.Errorf(nixl.ErrInvalid, "loopback poll: unknown request %d", id)}
			continue
		}
		if x.state == nixl.InProgress && x.landed && !x.sending {
			if now == 0 {
				now = a.mono()
			}
			if now >= x.due {
				return false, nil
			}
		}
		out[i] = nixl.Status{State: x.state, Err: x.err}
	}
	return true, nil
}

// Release implements nixl.Agent.
func (a *Agent) Release(id nixl.XferID) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nixl.ErrClosed
	}
	x := a.xfers[id]
	if x == nil {
		return nixl.Errorf(nixl.ErrInvalid, "loopback release: unknown request %d", id)
	}
	if x.state == nixl.InProgress {
		return nixl.Errorf(nixl.ErrRequestActive, "loopback release: request %d is in flight", id)
	}
	delete(a.xfers, id)
	return nil
}

// failInflightLocked fails every in-flight request matching pick (a.mu held).
func (a *Agent) failInflightLocked(pick func(*xfer) bool, err error) {
	for _, x := range a.xfers {
		if x.state == nixl.InProgress && pick(x) {
			x.state, x.err = nixl.Failed, err
		}
	}
}

// batch is a worker's scratch space for run.
type batch struct {
	jobs    []job
	res     []result
	msgs    [][]byte
	buf     []byte // the datagrams of one peer, end to end (notifFrames)
	scratch []byte
	frames  [][]byte
	js      []job // one peer's requests (notify)
}

// result is what run found for one job.
type result struct {
	j       job
	delayed bool // posted with injected latency: landed, completed by a poll
	fail    bool // an injected failure
	err     error
	notify  bool // its notification is to be sent (copied, not delayed)
	sent    bool
	queued  bool // its notification waits in the peer's outbox (notify)
}

// run executes the jobs of b on a worker: fault check and copy of each, then
// the notifications of those copied (in order, one datagram per peer where
// they fit, so a peer's reader wakes once for them), then every job's state
// under one lock and one wake-up. A delayed post only lands: its
// notification and terminal state wait for a poll at or after its due time.
func (a *Agent) run(b *batch) {
	b.res = b.res[:0]
	a.mu.Lock()
	for _, j := range b.jobs {
		x := j.x
		if a.closed || x.epoch != j.epoch || x.state != nixl.InProgress {
			continue
		}
		b.res = append(b.res, result{j: j, delayed: x.due != 0, fail: a.faults[x.peer.name].Fail})
	}
	a.mu.Unlock()
	if len(b.res) == 0 {
		return
	}
	for i := range b.res {
		r := &b.res[i]
		x := r.j.x
		if r.fail {
			r.err = nixl.Errorf(nixl.ErrBackend, "loopback: injected failure for peer %q", x.peer.name)
		} else {
			r.err = a.copySegs(x.segs)
		}
		r.notify = r.err == nil && !r.delayed && x.hasNotif
	}
	for i := range b.res {
		if !b.res[i].notify || b.res[i].sent {
			continue
		}
		p := b.res[i].j.x.peer
		b.msgs = b.msgs[:0]
		for k := i; k < len(b.res); k++ {
			if r := &b.res[k]; r.notify && !r.sent && r.j.x.peer == p {
				b.msgs = append(b.msgs, r.j.x.msg)
			}
		}
		b.js = b.js[:0] // this peer's requests, settled by its outbox's drain if it queues
		for k := i; k < len(b.res); k++ {
			if r := &b.res[k]; r.notify && !r.sent && r.j.x.peer == p {
				b.js = append(b.js, r.j)
			}
		}
		b.buf, b.scratch, b.frames = notifFrames(b.buf, b.scratch, b.frames, a.name, b.msgs)
		queued, err := a.notify(p, b.frames, b.js)
		for k := i; k < len(b.res); k++ {
			if r := &b.res[k]; r.notify && !r.sent && r.j.x.peer == p {
				r.sent, r.queued = true, queued
				if err != nil {
					r.err = err
				}
			}
		}
	}
	clear(b.frames)
	clear(b.js)
	clear(b.msgs)
	a.mu.Lock()
	for _, r := range b.res {
		x := r.j.x
		if x.epoch != r.j.epoch || x.state != nixl.InProgress {
			continue
		}
		switch {
		case r.queued:
			// its notification waits in the peer's outbox: drain settles it
		case r.delayed:
			x.landed, x.pendErr = true, r.err
		case r.err != nil:
			x.state, x.err = nixl.Failed, r.err
		default:
			x.state, x.err = nixl.Done, nil
		}
	}
	a.mu.Unlock()
	clear(b.res)
	a.wake()
}

// copySegs copies every segment while holding copyMu for reading, so no mapping
// can be unmapped underneath it. The copy runs with debug.SetPanicOnFault: a
// file truncated by its owner after it was mapped (a peer's segment, or a
// scheduler's attached file) raises SIGBUS on the lost pages, which becomes a
// recovered panic and fails this request instead of the process.
func (a *Agent) copySegs(segs []seg) (err error) {
	a.copyMu.RLock()
	defer a.copyMu.RUnlock()
	cur := -1
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(interface{ Addr() uintptr })
			if !ok || cur < 0 {
				panic(r)
			}
			err = faultErr(segs[cur], f.Addr())
		}
	}()
	for i, s := range segs {
		if s.src.unmapped || s.dst.unmapped {
			return nixl.Errorf(nixl.ErrPeerUnknown, "loopback: memory of the request was unmapped (peer dropped or buffer freed)")
		}
		cur = i
		copy(s.dst.data[s.dstOff:s.dstOff+s.n], s.src.data[s.srcOff:s.srcOff+s.n])
	}
	cur = -1
	return nil
}

// faultErr describes a memory fault during the copy of s: which file lost the
// page at addr. A peer's segment is ErrRemoteDisconnect (its memory is gone);
// an own or attached file is ErrBackend.
func faultErr(s seg, addr uintptr) error {
	m := s.dst
	if _, ok := s.src.contains(uint64(addr), 1); ok {
		m = s.src
	} else if _, ok := s.dst.contains(uint64(addr), 1); !ok {
		m = nil
	}
	switch {
	case m == nil:
		return nixl.Errorf(nixl.ErrBackend, "loopback: memory fault at %#x copying %s -> %s", addr, s.src.path, s.dst.path)
	case m.peer:
		return nixl.Errorf(nixl.ErrRemoteDisconnect, "loopback: memory fault at offset %d of peer segment %s (truncated by its owner?)", uint64(addr)-m.base(), m.path)
	default:
		return nixl.Errorf(nixl.ErrBackend, "loopback: memory fault at offset %d of local memory %s (truncated by its owner?)", uint64(addr)-m.base(), m.path)
	}
}
