package loopback

import (
	"encoding/binary"
	"errors"
	"net"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// MaxNotifLen bounds a notification message; a datagram carries name + message.
const MaxNotifLen = 32 << 10

// maxDatagram is the largest notification datagram: what the reader's buffer
// holds (one message of MaxNotifLen from a sender name of maxStr).
const maxDatagram = MaxNotifLen + 2 + maxStr

// batchFlag marks a datagram of several notifications in its name length
// (names are at most maxStr bytes, far below it).
const batchFlag = 0x8000

// encodeNotif frames a notification datagram: u16 sender-name length, name, message.
func encodeNotif(sender string, msg []byte) []byte {
	b := make([]byte, 0, 2+len(sender)+len(msg))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(sender)))
	b = append(b, sender...)
	return append(b, msg...)
}

// appendNotifs frames msgs (each at most MaxNotifLen) into as few datagrams as
// fit maxDatagram, in order, calling send with each: one message alone is
// encodeNotif's frame; several are a batch: u16 batchFlag|name length, name,
// then u16 length and bytes of each message. buf is scratch space.
func appendNotifs(buf []byte, sender string, msgs [][]byte, send func([]byte) error) ([]byte, error) {
	for len(msgs) > 0 {
		n, size := 1, 2+len(sender)+2+len(msgs[0])
		for n < len(msgs) && size+2+len(msgs[n]) <= maxDatagram {
			size += 2 + len(msgs[n])
			n++
		}
		buf = buf[:0]
		if n == 1 {
			buf = binary.LittleEndian.AppendUint16(buf, uint16(len(sender)))
			buf = append(append(buf, sender...), msgs[0]...)
		} else {
			buf = binary.LittleEndian.AppendUint16(buf, batchFlag|uint16(len(sender)))
			buf = append(buf, sender...)
			for _, m := range msgs[:n] {
				buf = binary.LittleEndian.AppendUint16(buf, uint16(len(m)))
				buf = append(buf, m...)
			}
		}
		if err := send(buf); err != nil {
			return buf, err
		}
		msgs = msgs[n:]
	}
	return buf, nil
}

// decodeNotif decodes a one-notification datagram (encodeNotif).
func decodeNotif(b []byte) (nixl.Notif, bool) {
	ns, ok := decodeNotifs(b, nil)
	if !ok || len(ns) != 1 {
		return nixl.Notif{}, false
	}
	return ns[0], true
}

// decodeNotifs appends the notifications of one datagram (encodeNotif or a
// batch of appendNotifs) to dst. A malformed datagram adds nothing (ok false).
func decodeNotifs(b []byte, dst []nixl.Notif) ([]nixl.Notif, bool) {
	if len(b) < 2 {
		return dst, false
	}
	h := binary.LittleEndian.Uint16(b)
	n := int(h &^ batchFlag)
	if n == 0 || n > maxStr || len(b) < 2+n {
		return dst, false
	}
	name := string(b[2 : 2+n])
	if h&batchFlag == 0 {
		return append(dst, nixl.Notif{Peer: name, Msg: string(b[2+n:])}), true
	}
	start := len(dst)
	for rest := b[2+n:]; len(rest) > 0; {
		if len(rest) < 2 {
			return dst[:start], false
		}
		m := int(binary.LittleEndian.Uint16(rest))
		if m > MaxNotifLen || len(rest) < 2+m {
			return dst[:start], false
		}
		dst = append(dst, nixl.Notif{Peer: name, Msg: string(rest[2 : 2+m])})
		rest = rest[2+m:]
	}
	if len(dst)-start < 2 {
		return dst[:start], false // a batch holds at least two
	}
	return dst, true
}

// sendRaw delivers one framed notification to p's socket, waiting for room in
// its queue (the outbox's drain). A failure means the peer is gone: the peer
// is marked disconnected, so later posts fail fast.
//
// It writes on a socket connected to the peer's (dialOut), not with a sendto
// on the agent's own socket: a peer's receive queue holds only
// net.unix.max_dgram_qlen datagrams (10 by default), and while it is full an
// unconnected sender is told EAGAIN and then "writable" at once (its own
// buffer has room), so it spun, several EAGAINs per datagram under load. A
// connected sender waits for the peer's queue itself, parked; and the kernel
// resolves the peer's path once instead of on every datagram. The wait is
// bounded (Options.NotifyTimeout): a peer that takes nothing for that long
// is treated as gone.
func (a *Agent) sendRaw(p *peer, frame []byte) error {
	c, err := p.dialOut()
	if err == nil {
		// A socket deadline is the kernel's and the poller's wall time; the
		// injected clock only measures injected latency.
		if err = c.SetWriteDeadline(time.Now().Add(a.notifyTimeout)); err == nil {
			_, err = c.Write(frame)
		}
	}
	if err != nil {
		return a.gone(p, err)
	}
	a.datagrams.Add(1)
	return nil
}

// dialOut returns the socket connected to the peer's notification socket,
// connecting it on first use.
func (p *peer) dialOut() (*net.UnixConn, error) {
	if c := p.out.Load(); c != nil {
		return c, nil
	}
	p.outMu.Lock()
	defer p.outMu.Unlock()
	if c := p.out.Load(); c != nil {
		return c, nil
	}
	if p.shut {
		return nil, net.ErrClosed
	}
	c, err := net.DialUnix("unixgram", nil, p.sock)
	if err != nil {
		return nil, err
	}
	p.out.Store(c)
	return c, nil
}

// closeOut closes the peer's outgoing socket; a send after it fails.
func (p *peer) closeOut() {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	p.shut = true
	if c := p.out.Swap(nil); c != nil {
		c.Close()
	}
}

// SendNotif implements nixl.Agent.
func (a *Agent) SendNotif(peerName string, msg []byte) error {
	return a.SendNotifs(peerName, [][]byte{msg})
}

// SendNotifs implements nixl.NotifBatcher: the messages go to the peer in
// order, several to a datagram (as many as fit one), so the peer's reader
// wakes once for them.
func (a *Agent) SendNotifs(peerName string, msgs [][]byte) error {
	for _, m := range msgs {
		if len(m) > MaxNotifLen {
			return nixl.Errorf(nixl.ErrInvalid, "loopback send notif: %d bytes", len(m))
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nixl.ErrClosed
	}
	p := a.peers[peerName]
	if p == nil {
		a.mu.Unlock()
		return nixl.Errorf(nixl.ErrPeerUnknown, "loopback send notif to %q", peerName)
	}
	if p.disconnd || a.faults[peerName].Disconnect {
		a.mu.Unlock()
		return nixl.Errorf(nixl.ErrRemoteDisconnect, "loopback send notif to %q", peerName)
	}
	a.mu.Unlock()
	return a.sendMsgs(p, msgs)
}

// sendMsgs sends raw messages to p, batched (appendNotifs), without waiting
// for p: what its queue does not take now waits in its outbox (outbox.go),
// and an error there marks p gone for later sends.
func (a *Agent) sendMsgs(p *peer, msgs [][]byte) error {
	_, _, frames := notifFrames(nil, nil, nil, a.name, msgs)
	_, err := a.notify(p, frames, nil)
	return err
}

// OnNotif registers wake, called (from the agent's reader goroutine, outside
// its locks) after notifications arrived that Notifs returns, so that a
// poller can wait for them instead of polling on a timer; stop removes it.
// wake must be cheap and must not call back into the agent.
func (a *Agent) OnNotif(wake func()) (stop func()) { return a.notifWakers.OnProgress(wake) }

// Notifs implements nixl.Agent.
func (a *Agent) Notifs(dst []nixl.Notif) ([]nixl.Notif, error) {
	a.nmu.Lock()
	defer a.nmu.Unlock()
	dst = append(dst, a.notifs...)
	clear(a.notifs)
	a.notifs = a.notifs[:0]
	if a.isClosed() && len(dst) == 0 {
		return dst, nixl.ErrClosed
	}
	return dst, nil
}

func (a *Agent) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

// readNotifs receives datagrams until the socket is closed.
func (a *Agent) readNotifs() {
	defer a.reader.Done()
	buf := make([]byte, maxDatagram)
	var got []nixl.Notif
	for {
		n, _, err := a.conn.ReadFromUnix(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if got, _ = decodeNotifs(buf[:n], got[:0]); len(got) > 0 {
			a.nmu.Lock()
			a.notifs = append(a.notifs, got...)
			a.nmu.Unlock()
			clear(got)
			a.notifWakers.Wake()
		}
	}
}
