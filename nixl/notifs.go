package nixl

// NotifBatcher is an optional Agent interface: SendNotifs sends msgs to peer
// in order, with the meaning of one SendNotif each, in fewer messages where
// the backend can (the loopback backend: as many as fit one datagram, so
// the peer wakes once for them).
type NotifBatcher interface {
	SendNotifs(peer string, msgs [][]byte) error
}

// SendNotifs sends msgs to peer in order: in one call where a is a
// NotifBatcher, else one SendNotif each, stopping at the first error.
func SendNotifs(a Agent, peer string, msgs [][]byte) error {
	if b, ok := a.(NotifBatcher); ok {
		return b.SendNotifs(peer, msgs)
	}
	for _, m := range msgs {
		if err := a.SendNotif(peer, m); err != nil {
			return err
		}
	}
	return nil
}
