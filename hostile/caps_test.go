package hostile

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/control"
)

// F4: transfer infos for 300,000 rooms no scheduler opened, from one
// registered decode, then 4 huge frames: RSS stays bounded.
func TestF4UnknownRoomsAndHugeFrames(t *testing.T) {
	hostile(t)
	// SGLang's default bootstrap deadline (300 s), so the flood's rooms are
	// held for the whole test, as they would be in production.
	d := startDaemon(t, daemonOpts{env: []string{"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300"}})
	c := newCanary(t, t.TempDir(), 4096)
	w := startWorkload(t, d, workloadOpts{rooms: 300, rate: 15})
	if err := d.waitLive(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	before := d.proc()
	s := d.sample(50 * time.Millisecond)
	f := newFakeDecode(t, "f4", 0)
	push := dialPusher(t, d.zmqPort)
	if err := push.send(f.registration(t)); err != nil {
		t.Fatal(err)
	}
	const n = 300000
	start := time.Now()
	sent, err := push.flood(n, 90*time.Second, func(i int) [][]byte {
		return transferInfo(f.name(), f.port, attackRoom(i), 1)
	})
	// Until the daemon has taken in what was sent (live and refused rooms
	// stop changing), at most 60 s.
	_, st := d.counters()
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); {
		time.Sleep(time.Second)
		_, st2 := d.counters()
		if fmt.Sprint(st2) == fmt.Sprint(st) {
			break
		}
		st = st2
	}
	afterRooms := d.proc()
	perRoom := ""
	if live, ok := st["LiveRooms"].(float64); ok && live > 0 {
		perRoom = fmt.Sprintf(" (%.1f KiB RSS per live room)", (afterRooms.rssMiB()-before.rssMiB())*1024/live)
	}
	m := fmt.Sprintf("%d infos in %.1f s: RSS %.0f → %.0f MiB (peak %.0f)%s; live rooms %v, cap %v, refused at cap %v, at peer share %v",
		sent, time.Since(start).Seconds(), before.rssMiB(), afterRooms.rssMiB(), s.now().rssMiB(), perRoom, st["LiveRooms"], st["RoomCap"], st["RefusedRoomCap"], st["RefusedPeerShare"])
	if err != nil {
		m += " (flood stopped: " + err.Error() + ")"
	}
	record(t, "F4 transfer infos for 300,000 unknown rooms", fmt.Sprintf("RSS ≤ %.0f MiB", bounds.f4.rssMiB), m, d.Alive() && s.now().rssMiB() <= bounds.f4.rssMiB)

	// Huge frames: a transfer info whose page list is 96 MiB, four times, on
	// fresh connections (a capped PULL drops the connection).
	const huge = 96 << 20
	big := make([]byte, huge)
	hugeSent := 0
	for k := range 4 {
		p := dialPusher(t, d.zmqPort)
		fr := transferInfo(f.name(), f.port, attackRoom(n+k), 1)
		fr[5] = big
		if p.send(fr) == nil {
			hugeSent++
		}
		time.Sleep(1500 * time.Millisecond)
		p.close()
	}
	big = nil
	time.Sleep(2 * time.Second)
	after := d.proc()
	peak := s.now()
	m = fmt.Sprintf("%d frames of %d MiB: RSS %.0f → %.0f MiB, peak %.0f MiB", hugeSent, huge>>20, afterRooms.rssMiB(), after.rssMiB(), peak.rssMiB())
	if !d.Alive() {
		m += "; kvxferd died: " + d.ExitDesc()
	}
	record(t, "F4 four huge frames", fmt.Sprintf("RSS ≤ %.0f MiB", bounds.f4.rssMiB), m, d.Alive() && peak.rssMiB() <= bounds.f4.rssMiB)
	checkHonest(t, w, 90*time.Second)
	checkDaemon(t, d, s.end(), bounds.f4, c)
}

// F6: 2,000 connections that send a request head with a long body and then
// stall, against kvxferd under RLIMIT_NOFILE 1,024: /health and /healthz
// still answer while they are held.
func TestF6StalledConnections(t *testing.T) {
	hostile(t)
	d := startDaemon(t, daemonOpts{nofile: 1024})
	c := newCanary(t, t.TempDir(), 4096)
	w := startWorkload(t, d, workloadOpts{rooms: 300, rate: 12})
	if err := d.waitLive(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	s := d.sample(100 * time.Millisecond)
	lim := ""
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", d.Pid())); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "Max open files") {
				lim = strings.Join(strings.Fields(l)[3:5], "/")
			}
		}
	}
	const n = 2000
	var conns []interface{ Close() error }
	dialErrs := 0
	for i := range n {
		target, req := d.boot, "PUT /route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"attn"
		if i%4 == 3 {
			target, req = d.debug, "POST /debug/rooms HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"
		}
		conn, err := dialTCP(target, 2*time.Second)
		if err != nil {
			dialErrs++
			continue
		}
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		conn.Write([]byte(req))
		conns = append(conns, conn)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// Probe both servers for 12 s while the connections are held.
	probes, ok := 0, 0
	var worst time.Duration
	var firstErr string
	for end := time.Now().Add(12 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		for _, u := range []string{"http://" + d.boot + "/health", "http://" + d.debug + "/healthz"} {
			probes++
			t0 := time.Now()
			code, err := httpGet(u, bounds.f6ProbeWait)
			worst = max(worst, time.Since(t0))
			if err == nil && code == 200 {
				ok++
			} else if firstErr == "" {
				firstErr = fmt.Sprintf("%s: %d %v", u, code, err)
			}
		}
	}
	peak := s.now()
	m := fmt.Sprintf("limit %s; %d stalled connections held (%d dials failed); %d/%d probes answered, slowest %.2f s; peak %d fds; %d \"too many open files\" log lines",
		lim, len(conns), dialErrs, ok, probes, worst.Seconds(), peak.FDs, d.logCount("too many open files"))
	if firstErr != "" {
		m += "; first failure " + firstErr
	}
	record(t, "F6 2,000 stalled HTTP connections, RLIMIT_NOFILE 1,024", fmt.Sprintf("every probe answers within %s", bounds.f6ProbeWait), m, ok == probes)
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	checkHonest(t, w, 90*time.Second)
	checkDaemon(t, d, s.end(), procBounds{rssMiB: bounds.steady.rssMiB, threads: bounds.steady.threads, fds: 1024}, c)
}

// F7: bootstrap /route integrity: a pre-emptive PUT with the wrong page_size
// and dtype before kvxferd is live, a hijacking PUT for the live rank, and
// 50,000 fake rank tuples.
func TestF7BootstrapIntegrity(t *testing.T) {
	hostile(t)
	d := startDaemon(t, daemonOpts{})
	c := newCanary(t, t.TempDir(), 4096)
	base := "http://" + d.boot
	attackerPort := freePort(t)
	put := func(body string) (int, error) { return httpPut(base+"/route", body) }
	rank := func(tp, dp int, port int, page int, dtype string) string {
		return fmt.Sprintf(`{"attn_tp_size": 1, "attn_tp_rank": %d, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1, "attn_dp_rank": %d, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": %d, "rank_ip": "127.0.0.1", "rank_port": %d, "page_size": %d, "kv_cache_dtype": "%s"}`,
			tp, dp, dp, port, page, dtype)
	}
	// Pre-emptive PUT: the rank kvxferd will serve, page_size 64, fp8.
	preCode, preErr := put(rank(0, 0, attackerPort, 64, "fp8_e5m2"))
	// The honest workload: its decode checks page_size 1 and dtype auto.
	w := startWorkload(t, d, workloadOpts{rooms: 300, rate: 30})
	if err := d.waitLive(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	info, _, _ := httpBody(base+"/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1", 5*time.Second)
	okPre := strings.Contains(string(info), `"page_size": 1,`) && strings.Contains(string(info), `"kv_cache_dtype": "auto"`)
	record(t, "F7 pre-emptive PUT /route (page_size 64, fp8) before live", "kvxferd's page_size 1 and dtype auto are served",
		fmt.Sprintf("PUT answered %d %v; served %s", preCode, preErr, clip(string(info), 160)), okPre)

	// Hijack: the live rank's tuple pointing at the attacker.
	rankURL := base + "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
	was, _, _ := httpBody(rankURL, 5*time.Second)
	hijCode, hijErr := put(rank(0, 0, attackerPort, 1, "auto"))
	now, _, _ := httpBody(rankURL, 5*time.Second)
	want := `"rank_port": ` + strconv.Itoa(d.zmqPort)
	record(t, "F7 hijacking PUT /route for the live rank", "refused; the route still names kvxferd's port "+strconv.Itoa(d.zmqPort),
		fmt.Sprintf("PUT answered %d %v; route before %s, after %s", hijCode, hijErr, string(was), string(now)),
		strings.Contains(string(now), want) && hijCode >= 400)

	// 50,000 fake rank tuples (dp ranks 1..50,000), 8 clients at once.
	s := d.sample(100 * time.Millisecond)
	rssBefore := d.proc().rssMiB()
	const n = 50000
	codes := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(90 * time.Second)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := newHTTPClient(5 * time.Second)
			for i := g; i < n && time.Now().Before(deadline); i += 8 {
				code, _ := httpPutWith(cl, base+"/route", rank(0, i+1, 40000+i%20000, 1, "auto"))
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	time.Sleep(time.Second)
	grown := d.proc().rssMiB() - rssBefore
	now2, _, _ := httpBody(rankURL, 5*time.Second)
	record(t, "F7 50,000 fake rank tuples", fmt.Sprintf("≤ %d accepted (rank table capped); RSS growth ≤ %.0f MiB (16 + the %d MiB GC heap floor); route intact", bounds.f7Accepted, bounds.f7RSSMiB, gcFloorMiB),
		fmt.Sprintf("%.1f s, answers %v; RSS %+.1f MiB; route after %s", time.Since(start).Seconds(), codes, grown, string(now2)),
		codes[200] <= bounds.f7Accepted && grown <= bounds.f7RSSMiB && strings.Contains(string(now2), want))
	checkHonest(t, w, 90*time.Second)
	checkDaemon(t, d, s.end(), bounds.steady, c)
}

// F8: one control client polls 2^20 rooms in a loop; another client's small
// polls are timed before and during.
func TestF8ControlFairness(t *testing.T) {
	hostile(t)
	d := startDaemon(t, daemonOpts{})
	c := newCanary(t, t.TempDir(), 4096)
	w := startWorkload(t, d, workloadOpts{rooms: 300, rate: 20})
	if err := d.waitLive(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	s := d.sample(100 * time.Millisecond)
	small := dialControl(t, d)
	ids := make([]uint64, 8)
	for i := range ids {
		ids[i] = attackRoom(i)
	}
	timePolls := func(n int) ([]time.Duration, int) {
		var lat []time.Duration
		errs := 0
		var out []kv.Reply
		for range n {
			t0 := time.Now()
			var err error
			if out, err = small.Poll(ids, out); err != nil {
				errs++
			}
			lat = append(lat, time.Since(t0))
			time.Sleep(2 * time.Millisecond)
		}
		return lat, errs
	}
	baseLat, _ := timePolls(300)

	big, err := control.Dial(d.ctl)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	big.SetTimeout(60 * time.Second)
	many := make([]uint64, 1<<20)
	for i := range many {
		many[i] = attackRoom(100 + i)
	}
	stop := make(chan struct{})
	bigPolls, bigErrs := 0, 0
	var bigDur time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		var out []kv.Reply
		for {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			var err error
			if out, err = big.Poll(many, out); err != nil {
				bigErrs++
			} else {
				bigPolls++
				bigDur += time.Since(t0)
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	attLat, attErrs := timePolls(300)
	close(stop)
	<-done
	p := func(l []time.Duration, q float64) time.Duration {
		l = slices.Clone(l)
		slices.Sort(l)
		return l[min(len(l)-1, int(math.Ceil(q*float64(len(l))))-1)]
	}
	avgBig := time.Duration(0)
	if bigPolls > 0 {
		avgBig = bigDur / time.Duration(bigPolls)
	}
	m := fmt.Sprintf("8-room polls alone p50 %s p99 %s; with the 2^20-room poller p50 %s p99 %s (%d errors); big polls %d, %s each (%d errors)",
		ms(p(baseLat, .5)), ms(p(baseLat, .99)), ms(p(attLat, .5)), ms(p(attLat, .99)), attErrs, bigPolls, ms(avgBig), bigErrs)
	record(t, "F8 one client polls 2^20 rooms in a loop", fmt.Sprintf("other clients' p99 ≤ %s", ms(bounds.f8P99)), m, p(attLat, .99) <= bounds.f8P99 && attErrs == 0)
	checkHonest(t, w, 90*time.Second)
	checkDaemon(t, d, s.end(), bounds.f8, c)
}

// F9: room ids ≥ 2^63 are refused by open.
func TestF9RoomRange(t *testing.T) {
	hostile(t)
	d := startDaemon(t, daemonOpts{})
	w := startWorkload(t, d, workloadOpts{rooms: 300, rate: 100})
	cli := dialControl(t, d)
	var res []string
	ok := true
	for _, id := range []uint64{math.MaxUint64, 1 << 63} {
		_, err := cli.Open(id, "")
		res = append(res, fmt.Sprintf("open(%d): %v", id, errOr(err, "accepted")))
		ok = ok && err != nil
	}
	_, err := cli.Open(1<<63-1, "")
	res = append(res, fmt.Sprintf("open(2^63-1): %v", errOr(err, "accepted")))
	ok = ok && err == nil
	record(t, "F9 open room 2^64−1 and 2^63", "refused; 2^63−1 accepted", strings.Join(res, "; "), ok)
	checkHonest(t, w, 60*time.Second)
	checkDaemon(t, d, d.proc(), bounds.steady)
}

// F10: `kvxferd -h` names the control socket path the daemon really uses.
func TestF10HelpNamesControlSocket(t *testing.T) {
	hostile(t)
	bin := binDir(t)
	out, _ := exec.Command(filepath.Join(bin, "kvxferd"), "-h").CombinedOutput()
	real := control.DefaultEndpoint(0)
	var line string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "-control") {
			line = strings.TrimSpace(l)
		}
	}
	i := strings.Index(string(out), "-control")
	help := ""
	if i >= 0 {
		help = string(out)[i:min(len(out), i+300)]
	}
	// The real default is $XDG_RUNTIME_DIR or $TMPDIR, then kvxfer-<uid>-rank<N>.sock.
	ok := strings.Contains(help, real) || strings.Contains(help, "kvxfer-<uid>-rank")
	ok = ok && !strings.Contains(help, "kvxferd-<tp-rank>.sock")
	record(t, "F10 kvxferd -h names the control socket", "names "+real+" (or its pattern)", fmt.Sprintf("%s: %s", line, clip(strings.Join(strings.Fields(help), " "), 200)), ok)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

func errOr(err error, ok string) string {
	if err == nil {
		return ok
	}
	return "refused (" + clip(err.Error(), 80) + ")"
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
