// Package transport speaks SGLang's PD-disaggregation wire protocol: the ZMQ frame
// codecs (pure functions from frames to typed messages and back), the HTTP bootstrap
// server, and the sockets that feed the engine.
package transport
