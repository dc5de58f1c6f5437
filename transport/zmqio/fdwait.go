package zmqio

import zmq "github.com/pebbe/zmq4"

// readable reports whether any of socks has a message (or an event) to read
// now (ZMQ_EVENTS; it also lets libzmq process the socket's commands).
func readable(socks ...*zmq.Socket) (bool, error) {
	for _, s := range socks {
		st, err := s.GetEvents()
		if err != nil {
			return false, err
		}
		if st&zmq.POLLIN != 0 {
			return true, nil
		}
	}
	return false, nil
}
