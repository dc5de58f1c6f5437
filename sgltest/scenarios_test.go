package sgltest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/daemon"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
)

// xroom is one room on both sides: what the prefill scheduler sends and where
// decode wants it.
type xroom struct {
	pre  prefillRoom
	dst  []int32
	daux int
}

func (x xroom) spec() RoomSpec { return RoomSpec{Room: x.pre.id, Pages: x.dst, Aux: x.daux} }

func span(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(from + i)
	}
	return out
}

// mk builds room id with n pages from prefill slot src and decode slot dst.
func mk(id uint64, src, dst, n int, chunks []int, preAux, decAux int) xroom {
	return xroom{pre: prefillRoom{id: id, src: span(src, n), chunks: chunks, aux: preAux}, dst: span(dst, n), daux: decAux}
}

func ids(rs []xroom) []uint64 {
	out := make([]uint64, len(rs))
	for i, r := range rs {
		out[i] = r.pre.id
	}
	return out
}

// readsKVStatus: decode reads KV_STATUS from 0.5.20 on (spec §1.1); 0.5.18
// never reads its PULL socket.
func readsKVStatus(version string) bool { return version != "0.5.18" }

// TestSGLangDecode runs every scenario against every installed release, then
// the mixed fleet, and logs the matrix.
func TestSGLangDecode(t *testing.T) {
	var m matrix
	defer m.log(t)
	for _, v := range Versions() {
		for _, sc := range scenarios {
			m.run(t, v, sc.name, func(t *testing.T, note func(string)) {
				e := newEnv(t, v)
				sc.run(t, e, v, e.peers[v], note)
			})
		}
	}
	// The prefill side over the shared-memory ring and status table,
	// judged by the same SGLang decodes.
	for _, v := range Versions() {
		for _, sc := range scenarios {
			if !shmScenarios[sc.name] {
				continue
			}
			m.run(t, v, "shm_"+sc.name, func(t *testing.T, note func(string)) {
				e := newEnv(t, v)
				e.sched.useShm(t)
				sc.run(t, e, v, e.peers[v], note)
				if st := e.d.Counters(); st["shm_records"] == 0 || st["shm_clients_lost_bad_record"] != 0 {
					t.Fatalf("the scheduler did not drive kvxferd over the ring: %v", st)
				}
			})
		}
	}
	for _, v := range Versions() {
		for _, hold := range []bool{true, false} {
			name := "abort_storm"
			if !hold {
				name += "_unheld"
			}
			m.run(t, v, name, func(t *testing.T, note func(string)) { testAbortStorm(t, v, hold, note) })
		}
	}
	vs := Versions()
	if len(vs) >= 2 {
		m.run(t, "mixed", "rooms_200_each_"+strings.Join(vs, "+"), func(t *testing.T, note func(string)) {
			testMixedFleet(t, vs, note)
		})
	}
}

type scenario struct {
	name string
	run  func(t *testing.T, e *env, version string, p *Peer, note func(string))
}

// shmScenarios are the scenarios TestSGLangDecode runs again with the
// scheduler on the shared-memory path (shm_<name> rows).
var shmScenarios = map[string]bool{"one_chunk": true, "three_chunks": true, "rooms_200": true,
	"prefill_abort_mid_transfer": true, "decode_abort_mid_transfer": true}

var scenarios = []scenario{
	{"one_chunk", func(t *testing.T, e *env, v string, p *Peer, note func(string)) {
		note(runToSuccess(t, e, p, []xroom{mk(101, 3, 40, 4, []int{4}, 2, 5)}))
	}},
	{"three_chunks", func(t *testing.T, e *env, v string, p *Peer, note func(string)) {
		note(runToSuccess(t, e, p, []xroom{mk(202, 10, 100, 7, []int{3, 2, 2}, 4, 9)}))
	}},
	{"rooms_200", func(t *testing.T, e *env, v string, p *Peer, note func(string)) {
		var rs []xroom
		for i := range 200 {
			n := i%3 + 1
			chunks := []int{n}
			if n > 1 {
				chunks = []int{1, n - 1}
			}
			r := mk(uint64(10_000+i), 3*i, 0, n, chunks, i, 300-i)
			for j := range r.dst {
				r.dst[j] = int32(slots - 1 - (3*i + j)) // decode pages descend
			}
			rs = append(rs, r)
		}
		note(runToSuccess(t, e, p, rs))
	}},
	{"prefill_abort_mid_transfer", testPrefillAbort},
	{"decode_abort_before_sender", func(t *testing.T, e *env, v string, p *Peer, note func(string)) {
		testDecodeAbort(t, e, v, p, note, beforeSender)
	}},
	{"decode_abort_after_transfer_info", func(t *testing.T, e *env, v string, p *Peer, note func(string)) {
		testDecodeAbort(t, e, v, p, note, afterTransferInfo)
	}},
	{"decode_abort_mid_transfer", func(t *testing.T, e *env, v string, p *Peer, note func(string)) {
		testDecodeAbort(t, e, v, p, note, midTransfer)
	}},
	{"decode_sigkill", testDecodeKill},
}

// runToSuccess opens rs on decode (send_metadata), sends them from prefill,
// and requires Success on both sides and every byte in place.
func runToSuccess(t *testing.T, e *env, p *Peer, rs []xroom) string {
	t.Helper()
	specs := make([]RoomSpec, len(rs))
	for i, r := range rs {
		specs[i] = r.spec()
	}
	views, err := p.Open(specs, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range views {
		if v.Error != nil || v.Phase != "transferring" {
			t.Fatalf("decode open room %d: phase %s, error %v, reason %q", v.Room, v.Phase, deref(v.Error), v.ReasonText())
		}
	}
	start := time.Now()
	for _, r := range rs {
		e.sched.start(t, r.pre)
	}
	reps := e.sched.waitPrefill(t, ids(rs), 60*time.Second, nil)
	for i, rep := range reps {
		if rep.Status != kv.StatusSuccess {
			t.Fatalf("prefill room %d ended %v/%v", rs[i].pre.id, rep.Status, rep.Reason)
		}
	}
	prefillDone := time.Since(start)
	views, timedOut, err := p.Wait(ids(rs), "terminal", decodeDeadline())
	if err != nil {
		t.Fatal(err)
	}
	var slow time.Duration
	bad := 0
	var first string
	for _, v := range views {
		if v.Phase != "success" {
			bad++
			if first == "" {
				first = fmt.Sprintf("room %d: decode phase %s reason %q (prefill: Success)", v.Room, v.Phase, v.ReasonText())
			}
			continue
		}
		if d := At(v.TTerminal).Sub(At(v.TMetadata)); d > slow {
			slow = d
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d rooms did not succeed on decode (wait timed out: %v); first: %s", bad, len(rs), timedOut, first)
	}
	for _, r := range rs {
		verify(t, p, r.pre.id, r.dst, r.daux)
	}
	e.sched.clearRooms(ids(rs)...)
	return fmt.Sprintf("%d rooms, prefill all Success in %v, decode slowest metadata→success %v", len(rs), prefillDone.Round(time.Millisecond), slow.Round(time.Millisecond))
}

// written says which of r's decode pages and aux buffers hold non-zero bytes.
func written(p *Peer, r xroom) string {
	kv, aux, err := p.Read(r.dst, r.daux)
	if err != nil {
		return err.Error()
	}
	var out []string
	for b, buf := range kv {
		for j := range r.dst {
			for _, v := range buf[j*item : (j+1)*item] {
				if v != 0 {
					out = append(out, fmt.Sprintf("kv%d/page%d", b, r.dst[j]))
					break
				}
			}
		}
	}
	for i, row := range aux {
		for _, v := range row {
			if v != 0 {
				out = append(out, fmt.Sprintf("aux%d", i))
				break
			}
		}
	}
	return strings.Join(out, " ")
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// waitLanded polls decode memory until r's pages of chunk 0 hold their bytes.
func waitLanded(t *testing.T, p *Peer, r xroom, pages int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		kv, _, err := p.Read(r.dst[:pages], -1)
		if err != nil {
			t.Fatal(err)
		}
		if landed(r.pre.id, kv, pages) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("room %d: first chunk never landed in decode memory", r.pre.id)
		}
		time.Sleep(time.Millisecond)
	}
}

func landed(id uint64, kv [][]byte, pages int) bool {
	for b, buf := range kv {
		for j := range pages {
			for k := range item {
				if buf[j*item+k] != kvmem.Pattern(id, b, j, k) {
					return false
				}
			}
		}
	}
	return true
}

// quiet zeroes r's decode pages and aux slot, then requires that nothing is
// written there for the window (the prefill may still be asked to send).
func quiet(t *testing.T, e *env, p *Peer, r xroom, window time.Duration, during func()) {
	t.Helper()
	if err := p.Zero(r.dst, r.daux); err != nil {
		t.Fatal(err)
	}
	if during != nil {
		during()
	}
	end := time.Now().Add(window)
	for time.Now().Before(end) {
		z, err := p.IsZero(r.dst, r.daux)
		if err != nil {
			t.Fatal(err)
		}
		if !z {
			rep := e.sched.poll(t, []uint64{r.pre.id})[0]
			t.Fatalf("room %d: decode pages written after the release (prefill room now %v/%v): %s", r.pre.id, rep.Status, rep.Reason, written(p, r))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkRelease requires the pages of an aborted/failed room to be released
// the way the release should: at once where SGLang does not defer (0.5.18),
// else by ABORT_ACKs from every prefill rank (not by the timeout), and no
// generation-less ACK warning.
func checkRelease(t *testing.T, p *Peer, id uint64) RoomView {
	t.Helper()
	views, timedOut, err := p.Wait([]uint64{id}, "released", releaseDeadline()+decodeDeadline())
	if err != nil {
		t.Fatal(err)
	}
	v := views[0]
	if timedOut {
		t.Fatalf("room %d: decode pages not released (phase %s, held %v, acks %v of %d)", id, v.Phase, v.Held, v.Acks, v.Required)
	}
	want := "immediate"
	if p.Info.DeferredRelease {
		want = "acks"
	}
	if v.ReleaseText() != want {
		t.Errorf("room %d: decode pages released by %q, want %q (generation %v, acks %v of %d required)",
			id, v.ReleaseText(), want, derefInt(v.Generation), v.Acks, v.Required)
	}
	if p.Info.DeferredRelease && v.Generation == nil {
		t.Errorf("room %d: decode never armed a deferred-abort generation", id)
	}
	checkNoGenerationless(t, p)
	return v
}

func derefInt(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func checkNoGenerationless(t *testing.T, p *Peer) {
	t.Helper()
	ws, err := p.Warnings()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if strings.Contains(w.Msg, "Generation-less") || strings.Contains(w.Msg, "unexpected message") {
			t.Errorf("decode warned: %s", w.Msg)
		}
	}
}

// testPrefillAbort: the prefill client aborts a room after its first chunk
// landed. A decode that reads KV_STATUS (0.5.20+) must see Failed within
// 100 ms; 0.5.18 cannot be told and must fail by its waiting timeout, never
// succeed. Either way its pages are released (0.5.21+: by the ABORT_ACK to the
// ABORT decode sends on failure) and nothing is written afterwards.
func testPrefillAbort(t *testing.T, e *env, v string, p *Peer, note func(string)) {
	r := mk(303, 20, 60, 6, []int{2, 2, 2}, 3, 7)
	if _, err := p.Open([]RoomSpec{r.spec()}, true); err != nil {
		t.Fatal(err)
	}
	e.sched.open(t, r.pre)
	e.sched.sendChunk(t, r.pre, 0)
	waitLanded(t, p, r, 2)
	t0 := time.Now()
	e.sched.abort(t, r.pre.id)
	rep := e.sched.waitPrefill(t, []uint64{r.pre.id}, 5*time.Second, nil)[0]
	if rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonClientAbort {
		t.Fatalf("prefill room after abort: %v/%v", rep.Status, rep.Reason)
	}
	prefillLag := time.Since(t0)
	within := decodeDeadline()
	if readsKVStatus(v) {
		within = 2 * time.Second
	}
	views, _, err := p.Wait([]uint64{r.pre.id}, "terminal", within)
	if err != nil {
		t.Fatal(err)
	}
	dv := views[0]
	if dv.Phase != "failed" {
		t.Fatalf("decode room after prefill abort: phase %s reason %q (waited %v)", dv.Phase, dv.ReasonText(), within)
	}
	lag := At(dv.TTerminal).Sub(t0)
	// What is asserted is the cause, not a latency (the note reports it): a
	// release that reads KV_STATUS fails because kvxferd told it, well inside
	// the 2 s wait and its own waiting timeout, never by that timeout.
	if readsKVStatus(v) && strings.Contains(dv.ReasonText(), "timed out") {
		t.Errorf("decode failed %v after the prefill abort by its own timeout (%q), want kvxferd's KV_STATUS \"0\"", lag, dv.ReasonText())
	}
	if !readsKVStatus(v) && !strings.Contains(dv.ReasonText(), "timed out") {
		t.Errorf("0.5.18 decode failed for %q, want its waiting timeout", dv.ReasonText())
	}
	rv := checkRelease(t, p, r.pre.id)
	quiet(t, e, p, r, 300*time.Millisecond, func() {
		_ = e.sched.trySend(r.pre.id, r.pre.src[2:4]) // a late chunk must not be written
	})
	note(fmt.Sprintf("prefill Failed after %v, decode after %v (%q), released %s", prefillLag.Round(100*time.Microsecond), lag.Round(time.Millisecond), trunc(dv.ReasonText(), 50), rv.ReleaseText()))
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

type abortPoint int

const (
	beforeSender abortPoint = iota
	afterTransferInfo
	midTransfer
)

// testDecodeAbort: decode calls receiver.abort() (SGLang sends its ABORT, with
// a generation from 0.5.22). The prefill room must end decode_abort, decode's
// pages must be released by the ABORT_ACK where the release defers
// (otherwise at once), and after the release nothing may be written to them.
func testDecodeAbort(t *testing.T, e *env, v string, p *Peer, note func(string), at abortPoint) {
	r := mk(404, 30, 200, 6, []int{2, 2, 2}, 6, 11)
	if _, err := p.Open([]RoomSpec{r.spec()}, true); err != nil {
		t.Fatal(err)
	}
	send := func(i int) {
		_ = e.sched.trySend(r.pre.id, r.pre.src[2*i:2*i+2]) // may be refused after the abort
	}
	switch at {
	case afterTransferInfo:
		e.sched.open(t, r.pre)
		e.sched.waitPrefill(t, []uint64{r.pre.id}, 10*time.Second, func(rep kv.Reply) bool {
			return rep.Status == kv.StatusWaitingForInput || rep.Status.Terminal()
		})
	case midTransfer:
		e.sched.open(t, r.pre)
		e.sched.sendChunk(t, r.pre, 0)
		waitLanded(t, p, r, 2)
	}
	t0 := time.Now()
	if _, err := p.Abort(r.pre.id); err != nil {
		t.Fatal(err)
	}
	if at == midTransfer {
		send(1) // races the ABORT
	}
	views, _, err := p.Wait([]uint64{r.pre.id}, "terminal", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if views[0].Phase != "failed" {
		t.Fatalf("decode room after its abort: %s", views[0].Phase)
	}
	rv := checkRelease(t, p, r.pre.id)
	released := At(rv.TRelease).Sub(t0)
	if at == beforeSender {
		// The transfer info created the room in kvxferd; wait until the ABORT
		// has failed it (a poll needs no sender), so the sender below really
		// comes after kvxferd knew. It must fail and write nothing. (A room
		// kvxferd has not heard of yet also polls Failed, with
		// invalid_request: that is not the abort.)
		e.sched.waitPrefill(t, []uint64{r.pre.id}, 5*time.Second, func(rep kv.Reply) bool { return rep.Reason == kv.ReasonDecodeAbort })
		quiet(t, e, p, r, 300*time.Millisecond, func() { e.sched.open(t, r.pre); send(0); send(1); send(2) })
	} else {
		if !p.Info.DeferredRelease {
			// A release without ACKs (0.5.18) frees the pages the moment decode
			// aborts, before kvxferd has read the ABORT: a chunk the scheduler
			// sends in that gap, or a write posted just before, is written
			// into released pages, by SGLang's own prefill too (it is why
			// 0.5.22 added the ACK). What kvxferd promises is that nothing is
			// written once it has concluded and drained, so the quiet window
			// starts there: the poll answers Failed at once, the drain ends
			// when the pool has no write of this (only) room in flight.
			e.sched.waitPrefill(t, []uint64{r.pre.id}, 5*time.Second, nil)
			for end := time.Now().Add(5 * time.Second); e.d.PoolStats().InFlight > 0; {
				if time.Now().After(end) {
					t.Fatalf("room %d: writes still in flight 5 s after the room failed", r.pre.id)
				}
				time.Sleep(time.Millisecond)
			}
		}
		quiet(t, e, p, r, 300*time.Millisecond, func() { send(2) })
	}
	rep := e.sched.waitPrefill(t, []uint64{r.pre.id}, 5*time.Second, nil)[0]
	if rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonDecodeAbort {
		t.Errorf("prefill room after the decode abort: %v/%v, want Failed/decode_abort", rep.Status, rep.Reason)
	}
	// Still nothing after the prefill concluded.
	if z, err := p.IsZero(r.dst, r.daux); err != nil || !z {
		t.Fatalf("decode pages written after the release (zero %v, err %v)", z, err)
	}
	note(fmt.Sprintf("released %s %v after abort (generation %v, acks %v)", rv.ReleaseText(), released.Round(time.Millisecond), derefInt(rv.Generation), rv.Acks))
}

// testDecodeKill: decode is SIGKILLed with rooms mid-transfer and rooms that
// had nothing to write yet; every such prefill room must end peer_lost within
// 1 s, and a room that already succeeded stays Success.
func testDecodeKill(t *testing.T, e *env, v string, p *Peer, note func(string)) {
	done := mk(501, 0, 0, 2, []int{2}, 0, 0)
	runToSuccess(t, e, p, []xroom{done})
	mid := []xroom{mk(502, 10, 10, 4, []int{2, 2}, 1, 1), mk(503, 20, 20, 4, []int{2, 2}, 2, 2)}
	idle := []xroom{mk(504, 30, 30, 2, []int{2}, 3, 3), mk(505, 40, 40, 2, []int{2}, 4, 4)}
	all := append(append([]xroom{}, mid...), idle...)
	specs := make([]RoomSpec, len(all))
	for i, r := range all {
		specs[i] = r.spec()
	}
	if _, err := p.Open(specs, true); err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		e.sched.open(t, r.pre)
	}
	for _, r := range mid {
		e.sched.sendChunk(t, r.pre, 0)
		waitLanded(t, p, r, 2)
	}
	e.sched.waitPrefill(t, ids(idle), 10*time.Second, func(rep kv.Reply) bool { return rep.Status == kv.StatusWaitingForInput })
	t0 := time.Now()
	p.Kill()
	for _, r := range mid {
		_ = e.sched.trySend(r.pre.id, r.pre.src[2:]) // the scheduler carries on
	}
	// Poll until 1 s after the kill, then keep watching (up to 10 s) only to
	// report what happened.
	var at1s []kv.Reply
	var all1s bool
	var lastTerm time.Duration
	for {
		reps := e.sched.poll(t, ids(all))
		term := true
		for _, rep := range reps {
			if !rep.Status.Terminal() {
				term = false
			}
		}
		el := time.Since(t0)
		if term && at1s == nil {
			at1s, all1s, lastTerm = reps, el <= time.Second, el
		}
		if el > time.Second && at1s == nil {
			at1s = reps
		}
		if term || el > 10*time.Second {
			if !term {
				lastTerm = -1
			}
			var desc []string
			for i, rep := range reps {
				desc = append(desc, fmt.Sprintf("%d:%v/%v", all[i].pre.id, rep.Status, rep.Reason))
			}
			var desc1 []string
			for i, rep := range at1s {
				desc1 = append(desc1, fmt.Sprintf("%d:%v/%v", all[i].pre.id, rep.Status, rep.Reason))
			}
			if !all1s {
				t.Errorf("1 s after the decode SIGKILL: %s; at the end (%v): %s", strings.Join(desc1, " "), el.Round(time.Millisecond), strings.Join(desc, " "))
			}
			for i, rep := range reps {
				if rep.Status != kv.StatusFailed || rep.Reason != kv.ReasonPeerLost {
					t.Errorf("prefill room %d after decode death: %v/%v, want Failed/peer_lost", all[i].pre.id, rep.Status, rep.Reason)
				}
			}
			break
		}
		time.Sleep(time.Millisecond)
	}
	// The room that finished before the kill (and was cleared) must not turn Failed.
	if rep := e.sched.poll(t, []uint64{done.pre.id})[0]; rep.Status == kv.StatusFailed {
		t.Errorf("the finished room turned %v/%v", rep.Status, rep.Reason)
	}
	if lastTerm >= 0 {
		note(fmt.Sprintf("all %d rooms terminal %v after SIGKILL", len(all), lastTerm.Round(time.Millisecond)))
	} else {
		note("rooms still live 10 s after SIGKILL")
	}
}

// testMixedFleet: one decode of each release against one kvxferd at the same
// time, 200 rooms each, every byte checked.
func testMixedFleet(t *testing.T, versions []string, note func(string)) {
	e := newEnv(t, versions...)
	type batch struct {
		p  *Peer
		rs []xroom
	}
	var bs []batch
	k := 0
	for vi, v := range versions {
		var rs []xroom
		for i := range 200 {
			r := mk(uint64(100_000*(vi+1)+i), 2*k, 3*i, 2, []int{1, 1}, k, i)
			k++
			rs = append(rs, r)
		}
		bs = append(bs, batch{e.peers[v], rs})
	}
	if 2*k > slots || k > auxSlots {
		t.Fatalf("prefill memory too small for %d rooms", k)
	}
	for _, b := range bs {
		specs := make([]RoomSpec, len(b.rs))
		for i, r := range b.rs {
			specs[i] = r.spec()
		}
		if _, err := b.p.Open(specs, true); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for i := range 200 { // interleave the releases
		for _, b := range bs {
			e.sched.start(t, b.rs[i].pre)
		}
	}
	var all []uint64
	for _, b := range bs {
		all = append(all, ids(b.rs)...)
	}
	reps := e.sched.waitPrefill(t, all, 60*time.Second, nil)
	for i, rep := range reps {
		if rep.Status != kv.StatusSuccess {
			t.Errorf("prefill room %d ended %v/%v", all[i], rep.Status, rep.Reason)
		}
	}
	var notes []string
	for vi, b := range bs {
		views, timedOut, err := b.p.Wait(ids(b.rs), "terminal", decodeDeadline())
		if err != nil {
			t.Fatal(err)
		}
		ok := 0
		for _, v := range views {
			if v.Phase == "success" {
				ok++
			}
		}
		notes = append(notes, fmt.Sprintf("%s %d/200", versions[vi], ok))
		if ok != len(b.rs) {
			t.Errorf("decode %s: %d of %d rooms succeeded (wait timed out: %v)", versions[vi], ok, len(b.rs), timedOut)
			continue
		}
		for _, r := range b.rs {
			verify(t, b.p, r.pre.id, r.dst, r.daux)
		}
	}
	note(fmt.Sprintf("decode success %s, %v", strings.Join(notes, ", "), time.Since(start).Round(time.Millisecond)))
}

// testAbortStorm: the scheduler aborts each of 200 rooms right after sending
// its last chunk, so many aborts land while the last writes are in flight.
// Both sides must agree on how every room ended (invariant 10): with
// completion held (kvxferd's default) no room may end Failed on prefill and
// Success on decode, or the reverse. The unheld run (-hold-completion=false,
// SGLang's own behaviour) only reports its disagreements, for comparison.
func testAbortStorm(t *testing.T, v string, hold bool, note func(string)) {
	e := newEnvWith(t, func(c *daemon.Config) { c.NoHold = !hold }, v)
	p := e.peers[v]
	const n = 200
	var rs []xroom
	for i := range n {
		rs = append(rs, mk(uint64(700_000+i), 2*i, 2*i, 2, []int{1, 1}, i, i))
	}
	specs := make([]RoomSpec, n)
	for i, r := range rs {
		specs[i] = r.spec()
	}
	if _, err := p.Open(specs, true); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		e.sched.start(t, r.pre)
		e.sched.abort(t, r.pre.id)
	}
	reps := e.sched.waitPrefill(t, ids(rs), 60*time.Second, nil)
	views, timedOut, err := p.Wait(ids(rs), "terminal", decodeDeadline())
	if err != nil {
		t.Fatal(err)
	}
	if timedOut {
		t.Fatalf("decode rooms still open after %v", decodeDeadline())
	}
	var preOK, decOK, failedButDone, doneButFailed int
	for i, rep := range reps {
		pOK, dOK := rep.Status == kv.StatusSuccess, views[i].Phase == "success"
		if pOK {
			preOK++
		}
		if dOK {
			decOK++
			verify(t, p, rs[i].pre.id, rs[i].dst, rs[i].daux)
		}
		switch {
		case !pOK && dOK:
			failedButDone++
		case pOK && !dOK:
			doneButFailed++
		}
	}
	note(fmt.Sprintf("hold=%v: prefill Success %d/%d, decode Success %d/%d; disagreements: prefill Failed+decode Success %d, prefill Success+decode Failed %d",
		hold, preOK, n, decOK, n, failedButDone, doneButFailed))
	if hold && failedButDone+doneButFailed != 0 {
		t.Errorf("with completion held, %d rooms ended Failed on prefill but Success on decode and %d the reverse", failedButDone, doneButFailed)
	}
}
