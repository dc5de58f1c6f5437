package dict

import (
	"sort"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/kv"
)

// inbound is one message on the channel standing in for the PULL socket.
type inbound struct {
	room     uint64
	ti       *room.TransferInfo
	abort    *kv.Endpoint
	register string
	barrier  chan struct{}
}

// bootstrapLoop is the bootstrap thread: one goroutine that owns the inbox and
// dispatches by tag (spec §4.2). Unlike upstream before #30352 it never dies
// on a message: that failure (P3) is not what this port compares.
func (e *Engine) bootstrapLoop() {
	defer e.wg.Done()
	for m := range e.inbox {
		switch {
		case m.barrier != nil:
			close(m.barrier)
		case m.register != "":
			e.onRegister(m.register)
		case m.ti != nil:
			e.onTransferInfo(m.room, *m.ti)
		case m.abort != nil:
			e.onDecodeAbort(m.room, *m.abort)
		}
	}
}

// onRegister is rule 4: the first registration of an agent wins. Building
// descriptors and add_remote_agent belong to the transfer layer.
func (e *Engine) onRegister(agent string) {
	if !e.peers.has(agent) {
		e.peers.set(agent, struct{}{})
	}
}

// onTransferInfo is rule 5 (L2429-2450): store the info; once every expected
// decode agent sent one, set the prefix length and update(WaitingForInput).
// Upstream does it even for a room the scheduler already cleared, which
// re-creates all three entries (P6). Fixed drops infos for tombstoned rooms
// and never inserts a status (Open promotes a room whose infos came first).
func (e *Engine) onTransferInfo(id uint64, ti room.TransferInfo) {
	if e.fixed && e.tombstoned(id) {
		return
	}
	e.hooks.at(Event{Point: BootstrapBeforeInsert, Room: id})
	inner := e.infos.setdefault(id, newTable[string, infoEntry])
	inner.set(ti.Agent, infoEntry{ti: ti, n: int(e.infoSeq.Add(1))})
	if inner.len() == ti.Required {
		e.prefix.set(id, sortedInfos(inner)[0].PrefixLen)
		e.update(id, kv.StatusWaitingForInput, byBootstrap)
	}
}

// complete reports whether a room's transfer infos are all here.
func complete(inner *table[string, infoEntry]) bool {
	list := sortedInfos(inner)
	return len(list) > 0 && len(list) == list[0].Required
}

// onDecodeAbort is rule 6 (L2350-2382): a present room that is not Success is
// recorded and failed; anything else is ignored, with no tombstone (P2) and
// no ACK (P4). Fixed keeps a tombstone for an unknown room and acknowledges.
func (e *Engine) onDecodeAbort(id uint64, from kv.Endpoint) {
	e.hooks.at(Event{Point: BootstrapBeforeAbort, Room: id})
	if e.fixed {
		e.decodeAbortFixed(id, from)
		return
	}
	if e.status.has(id) && e.check(id) != kv.StatusSuccess {
		e.record(id, kv.ReasonDecodeAbort, "Aborted by decode-side abort notification.")
		e.update(id, kv.StatusFailed, byBootstrap)
	}
}

// Decode side: both go through the bootstrap goroutine, as frames on the PULL
// socket do.

// TransferInfo delivers one decode agent's transfer info (rule 5).
func (e *Engine) TransferInfo(id uint64, ti room.TransferInfo) {
	e.deliver(inbound{room: id, ti: &ti})
}

// DecodeAbort delivers decode's ABORT (rule 6).
func (e *Engine) DecodeAbort(id uint64, from kv.Endpoint) {
	e.deliver(inbound{room: id, abort: &from})
}

// Register delivers a decode agent's registration frame (rule 4: first wins).
func (e *Engine) Register(agent string) { e.deliver(inbound{register: agent}) }

func (e *Engine) deliver(m inbound) (ok bool) {
	if e.stopped.Load() {
		return false
	}
	defer func() {
		if recover() != nil { // a send racing Close: the socket is gone
			ok = false
		}
	}()
	e.inbox <- m
	return true
}

// sortedInfos returns a room's transfer infos in insertion order.
func sortedInfos(t *table[string, infoEntry]) []room.TransferInfo {
	snap := t.snapshot()
	es := make([]infoEntry, 0, len(snap))
	for _, v := range snap {
		es = append(es, v)
	}
	sort.Slice(es, func(i, j int) bool { return es[i].n < es[j].n })
	out := make([]room.TransferInfo, len(es))
	for i := range es {
		out[i] = es[i].ti
	}
	return out
}
