package main

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

type roomPlan struct {
	id       uint64
	chunks   []int
	dummy    bool // decode rank 1 is a dummy (MLA fan-in)
	phase    abortPhase
	infoLate bool // decode's transfer info arrives after the scheduler's chunks
}

func (d *demo) plan(rng *rand.Rand, id uint64) roomPlan {
	p := roomPlan{id: id, dummy: rng.IntN(3) == 0, infoLate: rng.IntN(4) == 0}
	for range 1 + rng.IntN(d.o.maxChunks) {
		p.chunks = append(p.chunks, 1+rng.IntN(d.o.maxPagesPerChunk))
	}
	if rng.Float64() < d.o.abortShare {
		p.phase = abortPhase(1 + rng.IntN(int(numPhases)-1))
	}
	return p
}

// runRoom plays SGLang's prefill scheduler and both decode ranks for one room.
func (d *demo) runRoom(p roomPlan) result {
	start := time.Now()
	total := 0
	for _, k := range p.chunks {
		total += k
	}
	src := d.preFree.take(total)
	preAux := d.preFree.takeAux()
	for _, s := range src {
		d.pre.FillPage(p.id, int(s))
	}
	d.pre.WriteAux(preAux, p.id)
	defer func() {
		d.preFree.put(src)
		d.preFree.putAux(preAux)
	}()

	ranks := []int{0, 1}
	if p.dummy {
		ranks = []int{0}
	}
	dst := map[int][]int32{}
	auxSlot := map[int]int{}
	sendInfos := func() {
		for i, dr := range d.dec {
			info := room.TransferInfo{Agent: dr.node.Agent.Name(), From: room.Endpoint{IP: "127.0.0.1", Port: i}, Required: 2}
			if i == 1 && p.dummy {
				info.Dummy = true
			} else {
				dst[i] = dr.pages.take(total)
				auxSlot[i] = dr.pages.takeAux()
				info.DstPages, info.DstAux = dst[i], auxSlot[i]
				dr.expect(p.id)
			}
			dr.expectNotice(p.id)
			d.eng.TransferInfo(p.id, info)
		}
	}
	infosSent := false
	if p.phase == decodeBeforeOpen {
		d.eng.DecodeAbort(p.id, room.Endpoint{IP: "127.0.0.1", Port: 0})
	} else if !p.infoLate {
		sendInfos()
		infosSent = true
	}
	d.eng.Open(p.id)
	if p.phase == clientAfterInfo {
		d.eng.Abort(p.id)
	}
	d.eng.Init(p.id, total, preAux)
	next := 0
	for i, k := range p.chunks {
		d.eng.Send(p.id, src[next:next+k], nil)
		next += k
		if i == 0 && p.phase == decodeMidTransfer {
			d.eng.DecodeAbort(p.id, room.Endpoint{IP: "127.0.0.1", Port: 0})
		}
		if i == 0 && p.phase == clientMidTransfer {
			d.eng.Abort(p.id)
		}
	}
	if !infosSent && p.phase != decodeBeforeOpen {
		sendInfos()
		infosSent = true
	}

	// The scheduler's inflight queue: poll until terminal.
	deadline := start.Add(d.o.grace)
	var rep room.Reply
	for {
		rep = d.eng.Poll([]uint64{p.id}, nil)[0]
		if rep.Status.Terminal() {
			break
		}
		if time.Now().After(deadline) {
			return result{phase: p.phase, status: rep.Status, pinned: true}
		}
		time.Sleep(time.Millisecond) // polling; a sub-ms sleep takes ~1.1 ms anyway
	}
	elapsed := time.Since(start)
	if rep.Status == room.Success {
		for _, i := range ranks {
			d.verify(i, p.id, dst[i], src, auxSlot[i])
		}
		if p.phase == decodeAfterSuccess {
			d.eng.DecodeAbort(p.id, room.Endpoint{IP: "127.0.0.1", Port: 0})
		}
	} else if infosSent {
		// Decode keeps its pages until kvxfer says the room is finished with.
		for i, dr := range d.dec {
			if !dr.waitNotice(p.id, 5*time.Second) {
				d.leaks.Add(1)
			}
			if i == 0 || !p.dummy {
				dr.pages.put(dst[i])
				dr.pages.putAux(auxSlot[i])
			}
		}
	}
	d.eng.Clear(p.id)
	return result{phase: p.phase, status: rep.Status, reason: rep.Reason, elapsed: elapsed}
}

// verify waits for decode's completion rule, checks every byte, and frees the
// decode pages for reuse.
func (d *demo) verify(rank int, id uint64, dst, src []int32, aux int) {
	dr := d.dec[rank]
	if !dr.waitDone(id, 5*time.Second) {
		d.byteErr.Add(1)
	}
	for j := range dst {
		if err := dr.node.CheckPage(id, int(dst[j]), int(src[j])); err != nil {
			d.byteErr.Add(1)
			break
		}
		d.checked.Add(1)
	}
	if err := dr.node.CheckAux(aux, id); err != nil {
		d.byteErr.Add(1)
	}
	dr.forget(id)
	dr.pages.put(dst)
	dr.pages.putAux(aux)
}

// decodeRank is one emulated decode rank: its memory, its notification loop
// and SGLang's completion checker.
type decodeRank struct {
	node  *kvmem.Node
	pages *slots

	mu      sync.Mutex
	checker *sglang.Checker
	done    map[uint64]chan struct{}
	notices map[uint64]chan struct{}
	quit    chan struct{}
}

func newDecodeRank(i int, n *kvmem.Node) *decodeRank {
	return &decodeRank{node: n, pages: newSlots(n.Shape.Slots), checker: sglang.NewChecker(),
		done: map[uint64]chan struct{}{}, notices: map[uint64]chan struct{}{}, quit: make(chan struct{})}
}

func (r *decodeRank) expect(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checker.Expect(id, 1, false)
	r.done[id] = make(chan struct{})
}

func (r *decodeRank) expectNotice(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notices[id] = make(chan struct{})
}

func (r *decodeRank) notice(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.notices[id]; ok {
		close(ch)
		delete(r.notices, id)
	}
}

func (r *decodeRank) waitNotice(id uint64, limit time.Duration) bool {
	r.mu.Lock()
	ch, ok := r.notices[id]
	r.mu.Unlock()
	if !ok {
		return true
	}
	select {
	case <-ch:
		return true
	case <-time.After(limit):
		return false
	}
}

func (r *decodeRank) waitDone(id uint64, limit time.Duration) bool {
	r.mu.Lock()
	ch := r.done[id]
	r.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-time.After(limit):
		return false
	}
}

func (r *decodeRank) forget(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.done, id)
	delete(r.notices, id)
}

// drainNotifs is decode's poll(): it drains NIXL notifications and applies
// SGLang's completion rule.
func (r *decodeRank) drainNotifs() {
	var buf []nixl.Notif
	for {
		select {
		case <-r.quit:
			return
		default:
		}
		ns, err := r.node.Agent.Notifs(buf[:0])
		if err != nil {
			return
		}
		buf = ns
		r.mu.Lock()
		for _, n := range ns {
			nn, err := r.checker.Feed(n.Msg)
			if err != nil {
				continue
			}
			if ch, ok := r.done[nn.Room]; ok && r.checker.Done(nn.Room) {
				close(ch)
				r.done[nn.Room] = closed
			}
		}
		r.mu.Unlock()
		time.Sleep(time.Millisecond) // a sub-ms sleep takes ~1.1 ms anyway
	}
}

func (r *decodeRank) stop() { close(r.quit) }

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// slots is a free list of page slots and aux slots.
type slots struct {
	mu   sync.Mutex
	free []int32
	aux  []int
}

func newSlots(n int) *slots {
	s := &slots{}
	for i := n - 1; i >= 0; i-- {
		s.free = append(s.free, int32(i))
	}
	for i := 511; i >= 0; i-- {
		s.aux = append(s.aux, i)
	}
	return s
}

func (s *slots) take(n int) []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := append([]int32(nil), s.free[len(s.free)-n:]...)
	s.free = s.free[:len(s.free)-n]
	return out
}

func (s *slots) put(ps []int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, ps...)
}

func (s *slots) takeAux() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.aux[len(s.aux)-1]
	s.aux = s.aux[:len(s.aux)-1]
	return a
}

func (s *slots) putAux(a int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aux = append(s.aux, a)
}
