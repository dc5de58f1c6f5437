package room

import (
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

func TestCreates(t *testing.T) {
	for _, tc := range []struct {
		msg  Msg
		want bool
	}{
		{Open{}, true}, {TransferInfo{}, true}, {DecodeAbort{}, true}, {Abort{}, true}, {Fail{}, true},
		{Init{}, false}, {Send{}, false}, {Poll{}, false}, {Clear{}, false},
		{PeerLost{}, false}, {XferDone{}, false}, {Deadline{}, false},
	} {
		if got := Creates(tc.msg); got != tc.want {
			t.Errorf("Creates(%s) = %v, want %v", msgName(tc.msg), got, tc.want)
		}
	}
	if UnknownReply.Status != kv.StatusFailed || UnknownReply.Reason != kv.ReasonInvalidRequest {
		t.Fatalf("an unknown room must poll Failed, got %+v", UnknownReply)
	}
}
