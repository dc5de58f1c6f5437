package kv

import "strconv"

// Status is SGLang's KVPoll (base/conn.py). The numeric values are part of the
// contract: they are on the wire (KV_STATUS) and the scheduler all-reduces polls
// with MIN, so Failed must stay 0.
type Status uint8

const (
	StatusFailed          Status = 0
	StatusBootstrapping   Status = 1
	StatusWaitingForInput Status = 2
	StatusTransferring    Status = 3
	StatusSuccess         Status = 4
)

// Terminal reports whether s is StatusSuccess or StatusFailed; both are absorbing.
func (s Status) Terminal() bool { return s == StatusFailed || s == StatusSuccess }

func (s Status) String() string {
	switch s {
	case StatusFailed:
		return "Failed"
	case StatusBootstrapping:
		return "Bootstrapping"
	case StatusWaitingForInput:
		return "WaitingForInput"
	case StatusTransferring:
		return "Transferring"
	case StatusSuccess:
		return "Success"
	}
	return "Status(" + strconv.Itoa(int(s)) + ")"
}

// Reply is the answer to a Poll.
type Reply struct {
	Status    Status
	Reason    Reason
	PrefixLen int // decode_prefix_len from the transfer infos (pop_decode_prefix_len)
}
