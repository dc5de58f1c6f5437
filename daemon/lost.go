package daemon

import (
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

// A kvxferd that is killed takes its rooms' state with it, and a decode whose
// transfer info that process had read would wait out its own timeout
// (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s by default) before failing the
// request. The scheduler knows which rooms were open in the lost process and
// names them to its successor (control op lost). Each becomes a failed room
// here, so that a late transfer info or ABORT for it is answered like any
// failed room's; and every decode endpoint this rank knows of is told now with
// a KV_STATUS "0" per room. Room ids are random 63-bit numbers, so a decode
// that does not hold a room drops its status (SGLang's decode ignores a status
// for a room it does not track).

// lostTarget is a decode endpoint known before any frame is read: from the
// registrations the state file replays.
type lostTarget struct {
	to      kv.Endpoint
	agent   string
	dialect wire.Dialect
}

// replayTargets decodes the endpoints and dialects of the replayed
// registrations (the replay itself runs later, on the ingest goroutine).
func (d *Daemon) replayTargets(msgs [][][]byte) []lostTarget {
	var out []lostTarget
	seen := map[kv.Endpoint]bool{}
	for _, frames := range msgs {
		m, err := wire.DecodeInbound(frames)
		r, ok := m.(*wire.Registration)
		if err != nil || !ok {
			continue
		}
		to := kv.Endpoint{IP: r.DecodeIP, Port: r.DecodePort}
		if seen[to] {
			continue
		}
		seen[to] = true
		out = append(out, lostTarget{to: to, agent: r.AgentName, dialect: d.dialects.of(r)})
	}
	return out
}

// replayedAt says whether a decode the state file names is at an endpoint
// and has not been dropped since. Its link may be dialled before its
// replayed registration is recorded: the scheduler names the lost rooms as
// soon as the successor is live, while the peer actors may still be taking
// the replayed registrations.
func (d *Daemon) replayedAt(at kv.Endpoint) bool {
	for _, t := range d.replayTo {
		if t.to == at {
			return !d.dialects.dropped(t.agent)
		}
	}
	return false
}

// lostTargets is every decode endpoint this rank knows of: the replayed
// registrations and those accepted since, each in the dialect it reads.
func (d *Daemon) lostTargets() []lostTarget {
	out := append([]lostTarget(nil), d.replayTo...)
	seen := map[kv.Endpoint]bool{}
	for _, t := range out {
		seen[t.to] = true
	}
	for _, p := range d.dialects.list() {
		if p.Rejected != "" || p.Dropped != "" || seen[p.to] {
			continue
		}
		seen[p.to] = true
		out = append(out, lostTarget{to: p.to, dialect: d.dialects.at(p.to)})
	}
	return out
}

// failLost fails the rooms a lost predecessor held and tells every decode
// endpoint that reads KV_STATUS; it returns how many endpoints took every
// status. It runs on the control goroutine: the sends only queue on the links.
func (d *Daemon) failLost(rooms []uint64) int {
	why := kv.ReasonTransferProcessLost
	for _, r := range rooms {
		d.eng.Fail(r, why)
	}
	d.counters.lostRooms.Add(int64(len(rooms)))
	told := 0
	for _, t := range d.lostTargets() {
		if !t.dialect.ReadsStatus() || t.to.Port <= 0 {
			continue
		}
		sent := true
		for _, r := range rooms {
			frames := (&wire.KVStatus{Room: r, Status: kv.StatusFailed, PrefillRank: d.cfg.Rank.Unique(), Reason: why.String()}).Encode()
			if err := d.links.send(t.to, frames); err != nil {
				d.counters.noticeDropped.Add(1)
				d.log.Warn("telling a decode of a lost kvxferd's rooms failed", "to", t.to.String(), "err", err)
				sent = false
				break
			}
		}
		if sent {
			told++
		}
	}
	d.log.Warn("rooms of a lost kvxferd failed (transfer_process_lost)", "rooms", len(rooms), "decode_endpoints_told", told)
	return told
}
