package loopback

import (
	"encoding/binary"
	"errors"
	"net"

	"github.com/kvxfer/kvxfer/nixl"
)

// MaxNotifLen bounds a notification message; a datagram carries name + message.
const MaxNotifLen = 32 << 10

// encodeNotif frames a notification datagram: u16 sender-name length, name, message.
func encodeNotif(sender string, msg []byte) []byte {
	b := make([]byte, 0, 2+len(sender)+len(msg))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(sender)))
	b = append(b, sender...)
	return append(b, msg...)
}

// decodeNotif is the inverse of encodeNotif.
func decodeNotif(b []byte) (nixl.Notif, bool) {
	if len(b) < 2 {
		return nixl.Notif{}, false
	}
	n := int(binary.LittleEndian.Uint16(b))
	if len(b) < 2+n || n == 0 {
		return nixl.Notif{}, false
	}
	return nixl.Notif{Peer: string(b[2 : 2+n]), Msg: string(b[2+n:])}, true
}

// sendRaw delivers one framed notification to p's socket. A failure means the
// peer is gone: the peer is marked disconnected, so later posts fail fast.
func (a *Agent) sendRaw(p *peer, frame []byte) error {
	if _, err := a.conn.WriteToUnix(frame, p.sock); err != nil {
		a.mu.Lock()
		p.disconnd = true
		a.mu.Unlock()
		return nixl.Errorf(nixl.ErrRemoteDisconnect, "loopback: notify %q: %v", p.name, err)
	}
	return nil
}

// SendNotif implements nixl.Agent.
func (a *Agent) SendNotif(peerName string, msg []byte) error {
	if len(msg) > MaxNotifLen {
		return nixl.Errorf(nixl.ErrInvalid, "loopback send notif: %d bytes", len(msg))
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
	return a.sendRaw(p, encodeNotif(a.name, msg))
}

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
	buf := make([]byte, MaxNotifLen+2+maxStr)
	for {
		n, _, err := a.conn.ReadFromUnix(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if nf, ok := decodeNotif(buf[:n]); ok {
			a.nmu.Lock()
			a.notifs = append(a.notifs, nf)
			a.nmu.Unlock()
		}
	}
}
