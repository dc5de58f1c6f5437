// Package zmqio is kvxfer's ZMQ plumbing (pebbe/zmq4) for the wire protocol: StartIngest
// owns the prefill PULL socket in one goroutine, decodes with transport/wire and feeds a
// Sink; DialPush owns a PUSH socket to one decode behind a non-blocking queue.
package zmqio
