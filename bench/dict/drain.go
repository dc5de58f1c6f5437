package dict

import (
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// drain tracks a room's chunks in flight and what decode is owed once they
// all completed. An entry exists only while a chunk is in flight or until a
// failure with nothing in flight has been told.
type drain struct {
	inflight int
	failed   bool
	reason   kv.Reason
	to       []kv.Endpoint // transfer-info endpoints: KV_STATUS failure
	acks     []kv.Endpoint // ABORT senders: ABORT_ACK
}

func (e *Engine) drainOf(id uint64) *drain {
	d := e.drains[id]
	if d == nil {
		d = &drain{}
		e.drains[id] = d
	}
	return d
}

func (e *Engine) beginChunk(id uint64) {
	e.dmu.Lock()
	e.drainOf(id).inflight++
	e.dmu.Unlock()
}

func (e *Engine) endChunk(id uint64) {
	e.dmu.Lock()
	d := e.drains[id]
	d.inflight--
	var out []room.Notice
	if d.inflight == 0 {
		if d.failed {
			out = d.notices()
		}
		delete(e.drains, id)
	}
	e.dmu.Unlock()
	e.send(id, out)
}

// markFailed runs after the status became Failed: with nothing in flight decode
// is told now, else by the chunk that drains last.
func (e *Engine) markFailed(id uint64, why kv.Reason, ackTo *kv.Endpoint) {
	var to []kv.Endpoint
	if inner, ok := e.infos.get(id); ok {
		for _, ti := range sortedInfos(inner) {
			to = appendEndpoint(to, ti.From)
		}
	}
	e.dmu.Lock()
	d := e.drainOf(id)
	d.failed, d.reason = true, why
	for _, x := range to {
		d.to = appendEndpoint(d.to, x)
	}
	if ackTo != nil {
		d.acks = appendEndpoint(d.acks, *ackTo)
	}
	var out []room.Notice
	if d.inflight == 0 {
		out = d.notices()
		delete(e.drains, id)
	}
	e.dmu.Unlock()
	e.send(id, out)
}

// ackWhenDrained acknowledges an ABORT for a room that is already terminal or
// unknown: now, or after its in-flight chunk.
func (e *Engine) ackWhenDrained(id uint64, from kv.Endpoint) {
	e.dmu.Lock()
	if d := e.drains[id]; d != nil && d.inflight > 0 {
		d.acks = appendEndpoint(d.acks, from)
		if !d.failed {
			d.failed, d.reason = true, kv.ReasonDecodeAbort
		}
		e.dmu.Unlock()
		return
	}
	e.dmu.Unlock()
	e.send(id, []room.Notice{{Kind: room.AbortAck, To: from, Reason: kv.ReasonDecodeAbort}})
}

func (d *drain) notices() []room.Notice {
	var out []room.Notice
	for _, to := range d.to {
		out = append(out, room.Notice{Kind: room.FailureStatus, To: to, Reason: d.reason})
	}
	for _, to := range d.acks {
		out = append(out, room.Notice{Kind: room.AbortAck, To: to, Reason: d.reason})
	}
	return out
}

func (e *Engine) send(id uint64, ns []room.Notice) {
	for _, n := range ns {
		e.cfg.Notifier.Notify(id, n)
	}
}

func appendEndpoint(list []kv.Endpoint, x kv.Endpoint) []kv.Endpoint {
	for _, y := range list {
		if y == x {
			return list
		}
	}
	return append(list, x)
}
