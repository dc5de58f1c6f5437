package daemon

import (
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// A registration announcing 2^40 decode slots would make kvxferd build a
// descriptor list of 2^40 × buffers entries before NIXL sees it: the agent is
// rejected (its rooms fail peer_rejected, decode is told why) and another
// decode on the same daemon is served.
func TestRegistrationSlotCap(t *testing.T) {
	d := startDaemon(t, wire.DialectUnknown)
	s := newScheduler(t, d)
	bad := newDecodeWith(t, decodeShape(false), func(r *wire.Registration) {
		r.DstNumSlots, r.HasDstNumSlots = 1<<40, true
	}, d)
	s.cli.Open(760, "")
	bad.send(t, bad.info(760, seqPages(0, 1), 0, 1))
	if rep := s.waitTerminal(t, 760); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerRejected {
		t.Fatalf("room of the hostile agent: %v/%v", rep.Status, rep.Reason)
	}
	st := bad.waitFrame(t, isStatus(760)).(*wire.KVStatus)
	if !strings.Contains(st.Reason, "peer_rejected") || !strings.Contains(st.Reason, "dst_num_slots 1099511627776") {
		t.Fatalf("decode was told %q", st.Reason)
	}
	good := newDecode(t, d)
	good.checker.Expect(761, 1, false)
	good.send(t, good.info(761, seqPages(3, 1), 2, 1))
	s.start(t, roomSpec{id: 761, src: seqPages(3, 1), chunks: []int{1}, aux: 2})
	good.verify(t, 761, seqPages(3, 1), 2)
}
