package actors

import (
	"sync/atomic"

	"github.com/kvxfer/kvxfer/kv"
)

// directory is one shard's live rooms as Engine.Poll reads them from any
// goroutine, without a message: the engine's status table. Each entry is a
// live room, whose view its actor writes (as it does for the shard). Only
// the shard's goroutine writes the table; readers use atomic loads only (no
// lock: a hash table with one writer, whose entries are added and removed
// whole). Tombstones are not in it: a room is polled while it is live (a
// scheduler clears a room last), so the table stays as small as the live
// rooms and in cache, and a poll of a retired or unknown room asks the shard.
//
// A poll must reflect every call its caller made before it (Abort then Poll
// never answers the pre-abort status), and a call is a message still in the
// shard's mailbox until the shard routes it. So callers count the room
// messages they hand a shard (enq: one per mailbox message, a Batch part or
// a broadcast counting one) and the shard counts those it has routed
// (routed). A poller that loads enq = T and then finds routed ≥ T knows its
// own calls were routed: they were counted and queued before it loaded T, and
// the mailbox is first in, first out, so until they are routed fewer than T
// counted messages can be. Then the room has handled all of them once its
// view has seen as many messages as the shard routed to it (sent): the same
// sent/seen rule the shard applies to polls in its mailbox. Anything else —
// a room still busy with messages routed to it, a shard behind its mailbox,
// messages bouncing off a retired room — falls back to asking the shard.
type directory struct {
	tab atomic.Pointer[dirTable]
	_   [56]byte // enq is written by every caller: a line of its own
	enq atomic.Uint64
	_   [56]byte
	// routed and bouncing are written by the shard alone. bouncing counts
	// envelopes routed to a room that retired before handling them: its actor
	// sends them back to the shard, which routes them to the tombstone (or a
	// room they revive). While any is on its way, a room's entry may not
	// reflect them.
	routed   atomic.Uint64
	bouncing atomic.Int64

	// The writer's own: slots that are not empty (removed ones included),
	// entries, and rebuilds so far.
	used, count int
	gen         uint32
}

// dirTable is an open-addressed table (linear probing) of live rooms; it is
// never more than half used (removed slots count as used until a rebuild),
// so a probe always ends at an empty slot, after about two on average.
type dirTable struct {
	mask  uint64
	slots []atomic.Pointer[live]
}

// dirRemoved marks a slot whose room left: probes go on past it.
var dirRemoved = &live{}

const dirMinSlots = 64

func newDirectory() *directory {
	d := &directory{}
	d.tab.Store(newDirTable(dirMinSlots))
	return d
}

func newDirTable(n int) *dirTable {
	return &dirTable{mask: uint64(n - 1), slots: make([]atomic.Pointer[live], n)}
}

// dirHash spreads ids over the slots (the engine's shard hash used the high
// half; these bits are mixed independently of it).
func dirHash(id uint64) uint64 {
	id ^= id >> 33
	id *= 0xff51afd7ed558ccd
	return id ^ id>>33
}

// get returns id's live room, or nil if the directory has none.
func (d *directory) get(id uint64) *live {
	t := d.tab.Load()
	for i := dirHash(id) & t.mask; ; i = (i + 1) & t.mask {
		lr := t.slots[i].Load()
		if lr == nil {
			return nil
		}
		if lr != dirRemoved && lr.id == id {
			return lr
		}
	}
}

// add enters lr, a room that just became live (its id has no entry: it was
// not live). Shard goroutine only.
func (d *directory) add(lr *live) {
	t := d.tab.Load()
	i := dirHash(lr.id) & t.mask
	for {
		cur := t.slots[i].Load()
		if cur == nil {
			d.used++
			break
		}
		if cur == dirRemoved {
			break
		}
		i = (i + 1) & t.mask
	}
	lr.slot, lr.gen = uint32(i), d.gen
	t.slots[i].Store(lr)
	d.count++
	if d.used*2 > len(t.slots) {
		d.rebuild()
	}
}

// remove takes lr out: its room retired or its actor died. Shard goroutine
// only. lr knows its slot (add, rebuild).
func (d *directory) remove(lr *live) {
	t := d.tab.Load()
	if lr.gen != d.gen || t.slots[lr.slot].Load() != lr {
		return // not entered (an engine closing), or already removed
	}
	t.slots[lr.slot].Store(dirRemoved)
	d.count--
}

// rebuild moves the rooms into a fresh table four times their number (no
// removed slots), and publishes it. A reader still on the old table reads it
// as it was at the switch or later, which is after its own calls were
// routed: its answer is still one that follows them (and a room removed
// since is one that retired after them).
func (d *directory) rebuild() {
	old := d.tab.Load()
	n := dirMinSlots
	for n < 4*d.count {
		n *= 2
	}
	t := newDirTable(n)
	d.gen++
	for i := range old.slots {
		lr := old.slots[i].Load()
		if lr == nil || lr == dirRemoved {
			continue
		}
		j := dirHash(lr.id) & t.mask
		for t.slots[j].Load() != nil {
			j = (j + 1) & t.mask
		}
		lr.slot, lr.gen = uint32(j), d.gen
		t.slots[j].Store(lr)
	}
	d.used = d.count
	d.tab.Store(t)
}

// read answers a poll of id from the directory if the answer follows every
// call the caller made before (see directory); ok is false if it cannot
// tell, or the room is not live.
func (d *directory) read(id uint64) (r kv.Reply, ok bool) {
	if t := d.enq.Load(); d.routed.Load() < t {
		return r, false
	}
	lr := d.get(id)
	if lr == nil {
		return r, false
	}
	sent := lr.sent.Load()
	seen, r, fits := lr.load()
	if !fits || int32(seen-sent) < 0 {
		return kv.Reply{}, false
	}
	// After the entry: a room made live while envelopes were bouncing is
	// read only once they are routed.
	if d.bouncing.Load() != 0 {
		return kv.Reply{}, false
	}
	return r, true
}
