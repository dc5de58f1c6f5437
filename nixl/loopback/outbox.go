package loopback

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// A peer's outbox: the notifications its socket did not take at once, in
// order, and the goroutine writing them (drain). The copy workers and
// SendNotifs never wait for a peer: while the peer's receive queue has room
// (and nothing waits before it) a frame is written at once; from the first
// the queue refuses, the frames go to the outbox, and the requests they
// complete stay in flight until drain has written them. NIXL's notifications
// are asynchronous the same way; a sender that waited instead held whatever
// called it (a copy worker, a room's completion on its transfer worker) and
// every other peer's requests behind it while one decode did not read (a
// stopped process). A Poll completing delayed requests waits (sendDue).
type outbox struct {
	queue []outFrame
	bytes int
	run   bool  // a drain goroutine is writing the queue
	dead  error // a write failed (the peer is gone): later sends fail with it
}

// outFrame is a queued datagram; done, if set, is called once it is written
// (nil) or the peer is found gone (the error), from the drain goroutine.
type outFrame struct {
	frame []byte
	done  func(error)
}

// maxOutboxBytes bounds one peer's outbox: a peer that reads nothing is
// found gone by the drain's first write after Options.NotifyTimeout; until
// then at most this much waits for it.
const maxOutboxBytes = 16 << 20

// notify sends frames to p in order: the notifications of requests js (none
// for SendNotifs). queued false: every frame was written (err nil) or the
// send failed (err) now; the caller settles js. queued true: the frames from
// the first one p's queue refused on wait in p's outbox, and js are settled
// (settle) once the last of them is written or fails; js is copied then, so
// a caller's scratch slice is fine.
func (a *Agent) notify(p *peer, frames [][]byte, js []job) (queued bool, err error) {
	if len(frames) == 0 {
		return false, nil
	}
	ob := &p.ob
	p.obMu.Lock()
	defer p.obMu.Unlock()
	if ob.dead != nil {
		return false, ob.dead
	}
	i := 0
	if len(ob.queue) == 0 && !ob.run {
		for ; i < len(frames); i++ {
			sent, err := a.tryWrite(p, frames[i])
			if err != nil {
				ob.dead = a.gone(p, err)
				return false, ob.dead
			}
			if !sent {
				break
			}
		}
		if i == len(frames) {
			return false, nil
		}
	}
	n := 0
	for _, f := range frames[i:] {
		n += len(f)
	}
	if ob.bytes+n > maxOutboxBytes {
		return false, nixl.Errorf(nixl.ErrRemoteDisconnect, "loopback: notify %q: %d bytes wait for it already", p.name, ob.bytes)
	}
	for _, f := range frames[i:] {
		ob.queue = append(ob.queue, outFrame{frame: bytes.Clone(f)})
	}
	if len(js) > 0 {
		own := slices.Clone(js)
		ob.queue[len(ob.queue)-1].done = func(err error) { a.settle(own, err) }
	}
	ob.bytes += n
	if !ob.run {
		ob.run = true
		a.drains.Add(1)
		go a.drain(p)
	}
	return true, nil
}

// tryWrite writes frame to p's socket if its receive queue has room now or
// within directWait: a live reader drains its queue in microseconds, and a
// sender that waits that long for it keeps pace with it (handing every
// frame of a momentarily full queue to the outbox cost the copy workers a
// fifth more CPU per room at 10,000 rooms in flight); a stopped one never
// does, and only the first send of its backlog waits.
func (a *Agent) tryWrite(p *peer, frame []byte) (sent bool, err error) {
	c, err := p.dialOut()
	if err != nil {
		return false, err
	}
	if err := c.SetWriteDeadline(time.Now().Add(directWait)); err != nil {
		return false, err
	}
	if _, err := c.Write(frame); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return false, nil
		}
		return false, err
	}
	a.datagrams.Add(1)
	return true, nil
}

// directWait bounds how long a send waits for a peer's queue before the
// rest goes to its outbox (tryWrite).
const directWait = 2 * time.Millisecond

// gone marks p disconnected after a failed write (later posts fail fast).
func (a *Agent) gone(p *peer, err error) error {
	a.mu.Lock()
	p.disconnd = true
	a.mu.Unlock()
	return nixl.Errorf(nixl.ErrRemoteDisconnect, "loopback: notify %q: %v", p.name, err)
}

// drain writes p's outbox in order, each write waiting for the peer's queue
// at most Options.NotifyTimeout (sendRaw). A failed write fails it and every
// frame queued, and every later send to p (the peer is gone).
func (a *Agent) drain(p *peer) {
	defer a.drains.Done()
	ob := &p.ob
	for {
		p.obMu.Lock()
		if len(ob.queue) == 0 {
			ob.run = false
			p.obMu.Unlock()
			return
		}
		f := ob.queue[0]
		ob.queue[0] = outFrame{}
		ob.queue = ob.queue[1:]
		ob.bytes -= len(f.frame)
		p.obMu.Unlock()
		err := a.sendRaw(p, f.frame)
		if err == nil {
			if f.done != nil {
				f.done(nil)
			}
			continue
		}
		p.obMu.Lock()
		ob.dead = err
		rest := ob.queue
		ob.queue, ob.bytes, ob.run = nil, 0, false
		p.obMu.Unlock()
		if f.done != nil {
			f.done(err)
		}
		for _, r := range rest {
			if r.done != nil {
				r.done(err)
			}
		}
		return
	}
}

// notifFrames frames msgs from sender into datagrams as appendNotifs does,
// laid end to end in buf (reused; scratch too) with frames slicing it.
func notifFrames(buf, scratch []byte, frames [][]byte, sender string, msgs [][]byte) ([]byte, []byte, [][]byte) {
	buf, frames = buf[:0], frames[:0]
	var ends [8]int
	end := ends[:0]
	scratch, _ = appendNotifs(scratch, sender, msgs, func(f []byte) error {
		buf = append(buf, f...)
		end = append(end, len(buf))
		return nil
	})
	start := 0
	for _, e := range end {
		frames = append(frames, buf[start:e])
		start = e
	}
	return buf, scratch, frames
}

// settle ends requests whose notifications drain wrote (err nil: Done) or
// could not (Failed), unless they ended otherwise meanwhile, and wakes the
// pollers.
func (a *Agent) settle(js []job, err error) {
	a.mu.Lock()
	for _, j := range js {
		j.sentLocked(err)
	}
	a.mu.Unlock()
	a.wake()
}

// sentLocked ends j once its notification was written (err nil: Done) or
// could not be (Failed), unless it ended otherwise meanwhile. Under
// Agent.mu.
func (j job) sentLocked(err error) {
	x := j.x
	if x.epoch != j.epoch || x.state != nixl.InProgress {
		return
	}
	x.sending = false
	if err != nil {
		x.state, x.err = nixl.Failed, err
	} else {
		x.state, x.err = nixl.Done, nil
	}
}
