package wire

// Wire literals (§4.2, §4.3, §9.2 of the protocol spec). They are the exact bytes of
// frame 0 (or, for GUARD messages, of frame 1 for a registration).
const (
	TagGuard      = "NixlMsgGuard" // prefixes registrations and transfer infos
	TagNone       = "None"         // msg[0] of a KV-args registration
	TagAbort      = "ABORT"
	TagWatermark  = "WATERMARK"
	TagStagingRsp = "STAGING_RSP"
	TagStagingReq = "STAGING_REQ"
	TagKVStatus   = "KV_STATUS"
	TagAbortAck   = "ABORT_ACK"
)

// Kind names a message type of the control plane, in either direction.
type Kind uint8

const (
	KindUnknown Kind = iota
	// decode -> prefill
	KindRegistration
	KindTransferInfo
	KindAbort
	KindWatermark
	KindStagingRsp
	// prefill -> decode
	KindKVStatus
	KindAbortAck
	KindStagingReq
	KindChunkReady // 0.5.23 staging (staging.go)
)

var kindNames = [...]string{
	KindUnknown:      "unknown",
	KindRegistration: "registration",
	KindTransferInfo: "transfer_info",
	KindAbort:        "abort",
	KindWatermark:    "watermark",
	KindStagingRsp:   "staging_rsp",
	KindKVStatus:     "kv_status",
	KindAbortAck:     "abort_ack",
	KindStagingReq:   "staging_req",
	KindChunkReady:   "chunk_ready",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind?"
}

// Inbound is a decoded decode->prefill message: *Registration, *TransferInfo, *Abort,
// *Watermark or *StagingRsp.
type Inbound interface {
	Kind() Kind
	// Encode returns the multipart frames exactly as an SGLang decode would send them.
	Encode() [][]byte
}

// Outbound is a decoded prefill->decode message: *KVStatus, *AbortAck, *StagingReq or
// *ChunkReady.
type Outbound interface {
	Kind() Kind
	Encode() [][]byte
}
