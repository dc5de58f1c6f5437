// Package transport speaks SGLang's PD-disaggregation wire protocol on the prefill side,
// byte for byte, so unmodified SGLang decode instances work against kvxfer.
//
// Three parts, each usable alone:
//
//   - Codecs (pure functions, fuzzed, never panic): DecodeInbound turns a multipart message
//     from decode into *Registration, *TransferInfo, *Abort, *Watermark or *StagingRsp;
//     every type has Encode for the decode emulator. KV_STATUS and ABORT_ACK (*KVStatus,
//     *AbortAck) are what prefill sends back; DecodeOutbound reads them. PackIntLists /
//     UnpackIntLists are upstream's pack_int_lists. Errors are *FrameError (which frame,
//     which field, the room if known).
//   - Bootstrap HTTP: BootstrapServer is a CommonKVBootstrapServer (PUT/GET /route,
//     /register_dp_rank, /query_dp_ranks, /health, optional bearer auth); RegisterRank
//     registers a rank into any such server.
//   - ZMQ plumbing (pebbe/zmq4): StartIngest owns the PULL socket in one goroutine and feeds
//     a Sink; DialPush owns a PUSH socket to one decode behind a non-blocking queue.
//
// docs/protocol.md describes the frames, the tolerance rules and the deviations from
// upstream.
package transport
