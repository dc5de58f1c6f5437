package daemon

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
)

func lostStatus(dec *decodeRank, id uint64) func(wire.Outbound) bool {
	return func(m wire.Outbound) bool {
		k, ok := m.(*wire.KVStatus)
		return ok && k.Room == id && k.Status == kv.StatusFailed && k.Reason == "transfer_process_lost"
	}
}

func (r *decodeRank) statuses(id uint64) int {
	return r.count(func(m wire.Outbound) bool { k, ok := m.(*wire.KVStatus); return ok && k.Room == id })
}

// The successor of a kvxferd that died (no shutdown: nothing was told) is
// named the rooms the scheduler had open in it. Every decode it knows from the
// state file hears KV_STATUS "0" for each, even before the replay has run;
// an ABORT for one is ACKed and its poll says transfer_process_lost.
func TestLostRoomsOfAPredecessorReachTheDecodesItKnew(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	port := freePort(t)
	mod := func(c *Config) { c.StateDir, c.PullPort = dir, port }
	d1 := startDaemonWith(t, mod)
	newScheduler(t, d1) // live: the decode's registration is accepted and kept
	dec := newDecode(t, d1)
	waitFor(t, "the decode's registration accepted", func() bool { return d1.Counters()["registrations"] == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	d1.Shutdown(ctx) // it held no rooms, so it told the decode nothing
	cancel()

	// The rooms are named before the scheduler registers its memory, so
	// before the replay (which runs at activation) has recorded the decode.
	d2 := startDaemonWith(t, mod)
	early, err := control.Dial(d2.ControlEndpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	const a, b = 7001, 7002
	told, err := early.Lost(a, b)
	if err != nil || told != 1 {
		t.Fatalf("lost: told %d, err %v; want 1 decode endpoint", told, err)
	}
	dec.waitFrame(t, lostStatus(dec, a))
	dec.waitFrame(t, lostStatus(dec, b))
	s2 := newScheduler(t, d2)
	if rep := s2.waitTerminal(t, a); rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonTransferProcessLost {
		t.Fatalf("lost room polls %v/%v", rep.Status, rep.Reason)
	}
	dec.send(t, (&wire.Abort{Room: a, DecodeIP: "127.0.0.1", DecodePort: dec.pull.Port(), HasEndpoint: true,
		Generation: 3, HasGen: true}).Encode())
	ack := dec.waitFrame(t, func(m wire.Outbound) bool {
		k, ok := m.(*wire.AbortAck)
		return ok && k.Room == a
	}).(*wire.AbortAck)
	if ack.Generation != 3 {
		t.Fatalf("ABORT_ACK %+v does not echo the generation", ack)
	}
	// A transfer info the dead process never read arrives now: it is refused
	// with the same reason, and nothing is written.
	dec.send(t, dec.info(b, []int32{1}, 1, 1))
	waitFor(t, "a status for the late transfer info of a lost room", func() bool { return dec.statuses(b) >= 2 })
	if n := d2.Counters()["lost_rooms"]; n != 2 {
		t.Fatalf("lost_rooms %d, want 2", n)
	}
}

// A decode that registered with this kvxferd (no state file) is told too; one
// pinned to a release that reads no statuses is not; a lost list past the cap
// is a clear error that changes nothing.
func TestLostRoomsTellOnlyDecodesThatReadStatuses(t *testing.T) {
	for _, tc := range []struct {
		dialect wire.Dialect
		told    int
	}{{wire.DialectUnknown, 1}, {wire.Dialect0523, 1}, {wire.Dialect0518, 0}} {
		t.Run(tc.dialect.String(), func(t *testing.T) {
			d := startDaemon(t, tc.dialect)
			s := newScheduler(t, d)
			dec := newDecode(t, d)
			waitFor(t, "the decode's registration accepted", func() bool { return d.Counters()["registrations"] == 1 })
			told, err := s.cli.Lost(9001)
			if err != nil || told != tc.told {
				t.Fatalf("told %d, err %v; want %d", told, err, tc.told)
			}
			if tc.told > 0 {
				dec.waitFrame(t, lostStatus(dec, 9001))
			}
			if rep := s.waitTerminal(t, 9001); rep.Reason != kv.ReasonTransferProcessLost {
				t.Fatalf("lost room polls %v/%v", rep.Status, rep.Reason)
			}
			many := make([]uint64, control.MaxLost+1)
			for i := range many {
				many[i] = uint64(i + 1)
			}
			var ce *control.Error
			if _, err := s.cli.Lost(many...); !errors.As(err, &ce) || ce.Code != control.CodeBadRequest {
				t.Fatalf("a lost list past the cap: %v", err)
			}
			if n := d.Counters()["lost_rooms"]; n != 1 {
				t.Fatalf("lost_rooms %d after the refused list, want 1", n)
			}
		})
	}
}

// A decode the state file names gets a link before its replayed registration
// is recorded, and not once it was dropped (its replay no longer loads, or it
// was lost); an endpoint the file does not name gets none.
func TestLinksToReplayedDecodes(t *testing.T) {
	d := &Daemon{dialects: newDialects(wire.DialectUnknown, wire.Dialect0520)}
	defer d.dialects.close()
	named, other := tableReg("dec-1", 31001), tableReg("dec-2", 31002)
	d.replayTo = []lostTarget{{to: kv.Endpoint{IP: named.DecodeIP, Port: named.DecodePort}, agent: named.AgentName}}
	at := func(r *wire.Registration) kv.Endpoint { return kv.Endpoint{IP: r.DecodeIP, Port: r.DecodePort} }
	for _, step := range []struct {
		what         string
		do           func()
		named, other bool
	}{
		{"before the replay", func() {}, true, false},
		{"replayed", func() { _, _ = d.dialects.register(named) }, true, false},
		{"dropped", func() { d.dialects.drop(named.AgentName, "replayed registration no longer loads", false) }, false, false},
		{"the other registered", func() { _, _ = d.dialects.register(other) }, false, true},
	} {
		step.do()
		if got := d.linkAllowed(at(named)); got != step.named {
			t.Errorf("%s: a link to the named decode allowed %v, want %v", step.what, got, step.named)
		}
		if got := d.linkAllowed(at(other)); got != step.other {
			t.Errorf("%s: a link to the other endpoint allowed %v, want %v", step.what, got, step.other)
		}
	}
}
