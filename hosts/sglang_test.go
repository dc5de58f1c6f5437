package hosts

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/sgltest"
)

// sgl is one kvxferd on the prefill host, its scheduler and one SGLang
// decode on the decode host.
type sgl struct {
	d     *kvxferd
	s     *scheduler
	p     *sgltest.Peer
	alloc alloc
}

func newSGL(t *testing.T, v sgltest.Venv, args []string, env ...string) *sgl {
	t.Helper()
	d := startKvxferd(t, args, env...)
	e := &sgl{d: d, s: newScheduler(t, d)}
	e.p = startPeer(t, v, d.boot)
	return e
}

func reasonOf(r kv.Reply) string { return r.Reason.String() }

// moveRooms runs rooms to the end on both hosts and verifies every byte.
func (e *sgl) moveRooms(t *testing.T, rs []hroom) time.Duration {
	t.Helper()
	specs := make([]sgltest.RoomSpec, len(rs))
	for i, r := range rs {
		specs[i] = r.spec()
	}
	start := time.Now()
	if _, err := e.p.Open(specs, true); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		e.s.start(t, r)
	}
	reps, _ := e.s.waitTerminal(t, ids(rs), 60*time.Second)
	views, timedOut, err := e.p.Wait(ids(rs), "terminal", 60*time.Second)
	took := time.Since(start)
	if err != nil || timedOut {
		t.Fatalf("decode wait: timed out %v, %v", timedOut, err)
	}
	for i, r := range reps {
		if r.Status != kv.StatusSuccess {
			t.Fatalf("room %d ended %v/%s on prefill", rs[i].id, r.Status, reasonOf(r))
		}
	}
	for _, v := range views {
		if v.Phase != "success" {
			t.Fatalf("room %d ended %s (%s) on decode", v.Room, v.Phase, v.ReasonText())
		}
	}
	for _, r := range rs {
		verify(t, e.p, r)
	}
	return took
}

// TestHostsSGLang runs SGLang's own decode on the decode host against
// kvxferd -host 192.0.2.1 on the prefill host, then kvxferd -host 0.0.0.0.
func TestHostsSGLang(t *testing.T) {
	needHosts(t)
	needNIXL(t)
	for _, version := range sgltest.Versions() {
		t.Run(version, func(t *testing.T) {
			v := venvInDecode(t, version)
			label := "SGLang " + version
			e := newSGL(t, v, []string{"-host", prefillIP})
			if ip, _ := route(t, e.d.boot); ip != prefillIP {
				t.Fatalf("decode is told rank_ip %s, want %s", ip, prefillIP)
			}
			scenario(t, label, "one chunk", func(t *testing.T, note func(string, ...any)) {
				took := e.moveRooms(t, []hroom{e.alloc.room(8, 8)})
				note("8 pages, %d bytes verified, %.0f ms open to both sides terminal", 8*2*layers*item, ms(took))
			})
			scenario(t, label, "200 rooms", func(t *testing.T, note func(string, ...any)) {
				rs := make([]hroom, 200)
				for i := range rs {
					rs[i] = e.alloc.room(4, 2, 2)
				}
				took := e.moveRooms(t, rs)
				note("4 pages in 2 chunks each, every byte verified, %.2f s for all", took.Seconds())
			})
			scenario(t, label, "prefill abort", func(t *testing.T, note func(string, ...any)) {
				r := e.alloc.room(4, 2, 2)
				if _, err := e.p.Open([]sgltest.RoomSpec{r.spec()}, true); err != nil {
					t.Fatal(err)
				}
				e.s.open(t, r)
				e.s.sendChunk(t, r, 0)
				at := time.Now()
				e.s.abort(t, r.id)
				reps, _ := e.s.waitTerminal(t, []uint64{r.id}, 30*time.Second)
				views, timedOut, err := e.p.Wait([]uint64{r.id}, "terminal", 40*time.Second)
				if err != nil || timedOut {
					t.Fatalf("decode never concluded: %v %v", timedOut, err)
				}
				if reps[0].Status != kv.StatusFailed || views[0].Phase != "failed" {
					t.Fatalf("prefill %v/%s, decode %s: want both failed", reps[0].Status, reasonOf(reps[0]), views[0].Phase)
				}
				note("both failed: prefill %s, decode %s after %.2f s", reasonOf(reps[0]), views[0].ReasonText(), sgltest.At(views[0].TTerminal).Sub(at).Seconds())
			})
			scenario(t, label, "decode abort", func(t *testing.T, note func(string, ...any)) {
				r := e.alloc.room(4, 2, 2)
				if _, err := e.p.Open([]sgltest.RoomSpec{r.spec()}, true); err != nil {
					t.Fatal(err)
				}
				e.s.open(t, r)
				e.s.sendChunk(t, r, 0)
				at := time.Now()
				if _, err := e.p.Abort(r.id); err != nil {
					t.Fatal(err)
				}
				reps, when := e.s.waitTerminal(t, []uint64{r.id}, 30*time.Second)
				if reps[0].Status != kv.StatusFailed {
					t.Fatalf("prefill room %v/%s after decode's abort", reps[0].Status, reasonOf(reps[0]))
				}
				note("prefill failed %s %.0f ms after decode's abort", reasonOf(reps[0]), ms(when[0].Sub(at)))
			})
			scenario(t, label, "link cut 10 s", func(t *testing.T, note func(string, ...any)) {
				linkCut(t, e, note)
			})
			scenario(t, label, "decode kill -9", func(t *testing.T, note func(string, ...any)) {
				rs := []hroom{e.alloc.room(4, 2, 2), e.alloc.room(4, 2, 2), e.alloc.room(4, 2, 2), e.alloc.room(4, 2, 2)}
				specs := []sgltest.RoomSpec{rs[0].spec(), rs[1].spec(), rs[2].spec(), rs[3].spec()}
				if _, err := e.p.Open(specs, true); err != nil {
					t.Fatal(err)
				}
				for _, r := range rs {
					e.s.open(t, r)
				}
				// Kill only once kvxferd holds every transfer info (decode's
				// sends are queued in ZMQ: a kill could lose one before it left).
				e.s.waitBootstrapped(t, ids(rs), 30*time.Second)
				for _, r := range rs {
					e.s.sendChunk(t, r, 0)
				}
				at := time.Now()
				e.p.Kill()
				reps, when := e.s.waitTerminal(t, ids(rs), 30*time.Second)
				var last time.Duration
				for i, r := range reps {
					if r.Status != kv.StatusFailed || reasonOf(r) != "peer_lost" {
						t.Fatalf("room %d ended %v/%s after decode's SIGKILL, want Failed/peer_lost", rs[i].id, r.Status, reasonOf(r))
					}
					last = max(last, when[i].Sub(at))
				}
				note("all %d rooms peer_lost within %.2f s of the kill", len(rs), last.Seconds())
			})

			// kvxferd listening on every interface, advertised address detected.
			scenario(t, label, "-host 0.0.0.0", func(t *testing.T, note func(string, ...any)) {
				start := time.Now()
				w := newSGL(t, v, []string{"-host", "0.0.0.0"})
				ip, _ := route(t, w.d.boot)
				if ip != prefillIP {
					t.Fatalf("decode is told rank_ip %s, want the detected %s", ip, prefillIP)
				}
				if log := w.d.log(); !strings.Contains(log, "advertise="+prefillIP) || !strings.Contains(log, "advertise_from=route") {
					t.Fatalf("kvxferd did not log its detected address:\n%s", testrig.Tail(w.d.Log, 20))
				}
				if log := w.d.log(); strings.Contains(log, "http://0.0.0.0") || strings.Contains(log, "http://[::]") {
					t.Fatalf("kvxferd used a wildcard URL:\n%s", testrig.Tail(w.d.Log, 20))
				}
				took := w.moveRooms(t, []hroom{w.alloc.room(8, 4, 4)})
				note("rank_ip %s detected (route to 8.8.8.8), registered at 127.0.0.1; room moved in %.0f ms; %.1f s incl. both starts", ip, ms(took), time.Since(start).Seconds())
			})
		})
	}
	printTable(t)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// linkCut: rooms mid-transfer when the link goes down for 10 s, and rooms
// whose transfer infos decode sends during the cut. Both sides must agree on
// every room; no byte may land in a page decode gave up; rooms after the
// link returns must succeed.
func linkCut(t *testing.T, e *sgl, note func(string, ...any)) {
	const cut = 10 * time.Second
	mid := make([]hroom, 10)
	specs := make([]sgltest.RoomSpec, len(mid))
	for i := range mid {
		mid[i] = e.alloc.room(4, 2, 2)
		specs[i] = mid[i].spec()
	}
	if _, err := e.p.Open(specs, true); err != nil {
		t.Fatal(err)
	}
	for _, r := range mid {
		e.s.open(t, r)
	}
	e.s.waitBootstrapped(t, ids(mid), 30*time.Second)
	for _, r := range mid {
		e.s.sendChunk(t, r, 0) // the first half lands before the cut
	}
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	setLink(t, false)
	linkUp := false
	defer func() {
		if !linkUp {
			setLink(t, true)
		}
	}()
	// During the cut: the second halves, and three rooms decode opens now.
	for _, r := range mid {
		e.s.sendChunk(t, r, 1)
	}
	late := []hroom{e.alloc.room(4, 4), e.alloc.room(4, 4), e.alloc.room(4, 4)}
	lateSpecs := []sgltest.RoomSpec{late[0].spec(), late[1].spec(), late[2].spec()}
	if _, err := e.p.Open(lateSpecs, true); err != nil {
		t.Fatal(err)
	}
	for _, r := range late {
		e.s.start(t, r)
	}
	all := append(append([]hroom{}, mid...), late...)

	// Decode concludes on its own (heartbeat) while the link is down; the
	// pages of every room it gave up are zeroed while nothing can arrive.
	views, _, err := e.p.Wait(ids(all), "terminal", cut-time.Since(t0)-500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	gaveUp := map[uint64]sgltest.RoomView{}
	var decLast time.Duration
	for _, v := range views {
		if v.Phase == "failed" {
			gaveUp[v.Room] = v
			if d := sgltest.At(v.TTerminal).Sub(t0); d > decLast {
				decLast = d
			}
		}
	}
	for _, r := range all {
		if _, ok := gaveUp[r.id]; ok {
			if err := e.p.Zero(r.dst, r.aux); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(time.Until(t0.Add(cut)))
	setLink(t, true)
	linkUp = true
	tUp := time.Now()

	reps, when := e.s.waitTerminal(t, ids(all), 60*time.Second)
	views, timedOut, err := e.p.Wait(ids(all), "terminal", 60*time.Second)
	if err != nil || timedOut {
		t.Fatalf("decode rooms not terminal after the link returned: %v %v", timedOut, err)
	}
	time.Sleep(3 * time.Second) // anything still on its way lands now
	prefillBy, decodeBy := map[string]int{}, map[string]int{}
	var preLast time.Duration
	var problems []string
	for i, r := range all {
		rep, v := reps[i], views[i]
		prefillBy[rep.Status.String()+"/"+reasonOf(rep)]++
		reason := v.ReasonText()
		if i := strings.IndexAny(reason, "(:,"); i > 0 {
			reason = strings.TrimSpace(reason[:i])
		}
		decodeBy[strings.TrimSpace(v.Phase+" "+reason)]++
		preLast = max(preLast, when[i].Sub(t0))
		if (rep.Status == kv.StatusSuccess) != (v.Phase == "success") {
			problems = append(problems, fmt.Sprintf("room %d: prefill %v/%s, decode %s (%s)", r.id, rep.Status, reasonOf(rep), v.Phase, v.ReasonText()))
		}
		if _, ok := gaveUp[r.id]; ok {
			zero, err := e.p.IsZero(r.dst, r.aux)
			if err != nil {
				t.Fatal(err)
			}
			if !zero {
				problems = append(problems, fmt.Sprintf("room %d: bytes landed in decode pages after decode gave the room up (%s)", r.id, landed(t, e.p, r)))
			}
		} else if v.Phase == "success" {
			verify(t, e.p, r)
		}
	}
	summary := fmt.Sprintf("decode gave up %d/%d rooms by %.1f s after the cut (%s); prefill terminal by %.1f s (link back at %.1f s): %s; %d disagreements, %d rooms written after decode gave up",
		len(gaveUp), len(all), decLast.Seconds(), joinCounts(decodeBy), preLast.Seconds(), tUp.Sub(t0).Seconds(), joinCounts(prefillBy), countDisagree(problems), countLanded(problems))
	note("%s; rooms after the link returned: not reached", summary)
	if len(problems) > 0 {
		t.Errorf("link cut:\n  %s", strings.Join(problems, "\n  "))
	}
	if os.Getenv("KVXFER_HOSTS_VERBOSE") == "1" {
		t.Log(summary)
	}
	// After the link returns, new rooms must succeed on both sides.
	e.moveRooms(t, []hroom{e.alloc.room(4, 2, 2), e.alloc.room(4, 2, 2), e.alloc.room(4, 2, 2)})
	note("%s; 3 rooms after the link returned succeeded", summary)
}

func joinCounts(m map[string]int) string {
	var ks []string
	for k, n := range m {
		ks = append(ks, fmt.Sprintf("%s ×%d", k, n))
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}

func countDisagree(ps []string) int {
	n := 0
	for _, p := range ps {
		if strings.Contains(p, "prefill ") {
			n++
		}
	}
	return n
}

func countLanded(ps []string) int {
	n := 0
	for _, p := range ps {
		if strings.Contains(p, "bytes landed") {
			n++
		}
	}
	return n
}

// landed says which of room r's request pages and aux row hold non-zero
// bytes in decode memory, and whether they are the room's own bytes.
func landed(t *testing.T, p *sgltest.Peer, r hroom) string {
	kv, auxBufs, err := p.Read(r.dst, r.aux)
	if err != nil {
		return err.Error()
	}
	var parts []string
	for j := range r.dst {
		nonzero, own := 0, 0
		for b, buf := range kv {
			for k, v := range buf[j*item : (j+1)*item] {
				if v != 0 {
					nonzero++
					if v == kvmem.Pattern(r.id, b, j, k) {
						own++
					}
				}
			}
		}
		if nonzero > 0 {
			parts = append(parts, fmt.Sprintf("request page %d: %d non-zero bytes, %d of them this room's", j, nonzero, own))
		}
	}
	for i, row := range auxBufs {
		for _, v := range row {
			if v != 0 {
				parts = append(parts, fmt.Sprintf("aux buffer %d", i))
				break
			}
		}
	}
	return strings.Join(parts, "; ")
}
