package kv

import "strconv"

// Endpoint is a decode rank's ZMQ PULL address, as it advertises it in its frames.
type Endpoint struct {
	IP   string
	Port int
}

func (e Endpoint) String() string { return e.IP + ":" + strconv.Itoa(e.Port) }
