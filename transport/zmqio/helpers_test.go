package zmqio

import "github.com/kvxfer/kvxfer/transport/wire"

// fr builds a multipart message from strings.
func fr(ss ...string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

const agentUUID = "7f1c9a5e-0000-4000-8000-000000000001"

// The wire package's golden messages (its golden tests pin Encode to the upstream bytes).

func goldenTransferInfo() *wire.TransferInfo {
	return &wire.TransferInfo{
		Room: 12345678901234, DecodeIP: "10.0.0.7", DecodePort: 41235, AgentName: agentUUID,
		DstKVIndices: []int32{7, 8, 9}, DstAuxIndex: 5, RequiredDstInfoNum: 1,
		DstStateIndices: [][]int32{{3}, {-1}},
		DecodePrefixLen: 0, HasDecodePrefixLen: true,
	}
}

func goldenTransferInfoFrames() [][]byte { return goldenTransferInfo().Encode() }

func goldenRegistrationFrames() [][]byte {
	return (&wire.Registration{
		DecodeIP: "10.0.0.7", DecodePort: 41235, AgentName: agentUUID,
		AgentMetadata: []byte("\x00\x01MD\xff"),
		KVDataPtrs:    []uint64{0x00007f0000001000, 0x00007f0000002000},
		AuxDataPtrs:   []uint64{0x5000},
		StateDataPtrs: [][]uint64{{0x1000}, {}},
		GPUID:         3, DecodeTPSize: 2, DecodeTPRank: 1, DstKVItemLen: 4096,
		StateItemLens: [][]uint32{{64, 128}},
		DstNumSlots:   1000, HasDstNumSlots: true,
		KVMemKinds: []wire.MemKind{wire.MemVRAM, wire.MemDRAM},
		KVItemLens: []uint64{4096, 8192},
		DCPSize:    1,
	}).Encode()
}
