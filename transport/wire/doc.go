// Package wire is the pure codec half of SGLang's PD-disaggregation wire protocol on the
// prefill side, byte for byte, so unmodified SGLang decode instances work against kvxfer.
//
// Everything here is a pure function of its input (fuzzed, never panics) and imports no
// I/O package; TestCodecsArePure enforces that. DecodeInbound turns a multipart message
// from decode into *Registration, *TransferInfo, *Abort, *Watermark or *StagingRsp; every
// type has Encode for the decode emulator. KV_STATUS and ABORT_ACK (*KVStatus, *AbortAck)
// are what prefill sends back; DecodeOutbound reads them. PackIntLists / UnpackIntLists
// are upstream's pack_int_lists. Errors are *FrameError (which frame, which field, the
// room if known).
//
// The I/O lives next door: transport/zmqio owns the ZMQ sockets (ingest PULL, PUSH links),
// transport/bootstrap the HTTP bootstrap server and client, transport/control the
// control API. docs/protocol.md describes the frames, the tolerance rules and the
// deviations from upstream.
package wire
