package hosts

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/emul/decode"
	"github.com/kvxfer/kvxfer/emul/sched"
	"github.com/kvxfer/kvxfer/emul/workload"
	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/control"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// emulRun is kvxfer-sched on the prefill host and kvxfer-decode
// -nixl-backend nixl on the decode host, playing one shared workload against
// a kvxferd.
type emulRun struct {
	sched, dec         *exec.Cmd
	schedOut, decOut   bytes.Buffer
	schedDone, decDone chan error
	dir                string
}

func startEmul(t *testing.T, d *kvxferd, release string, rooms, conc int, extra ...string) *emulRun {
	return startEmulPaced(t, d, release, rooms, conc, nil, extra...)
}

// startEmulPaced is startEmul with flags for kvxfer-decode alone (decOnly).
func startEmulPaced(t *testing.T, d *kvxferd, release string, rooms, conc int, decOnly []string, extra ...string) *emulRun {
	t.Helper()
	bin := binDir(t)
	r := &emulRun{dir: t.TempDir(), schedDone: make(chan error, 1), decDone: make(chan error, 1)}
	work := append([]string{"-rooms", strconv.Itoa(rooms)}, extra...)
	// 0.5.18 hears of a prefill-side abort only through its own waiting
	// timeout (it reads no KV_STATUS): keep it short there.
	waiting := "20s"
	if release == "0.5.18" {
		waiting = "3s"
	}
	r.sched = exec.Command(filepath.Join(bin, "kvxfer-sched"), append([]string{"-control", d.ctl, "-concurrency", strconv.Itoa(conc),
		"-json", filepath.Join(r.dir, "sched.json"), "-rooms-out", filepath.Join(r.dir, "sched-rooms.json"), "-grace", "90s"}, work...)...)
	r.sched.Env = append(baseEnv(), commonEnv()...)
	r.sched.Stdout, r.sched.Stderr = &r.schedOut, &r.schedOut
	r.dec = inDecode(filepath.Join(bin, "kvxfer-decode"), append([]string{"-nixl-backend", "nixl", "-host", decodeIP,
		"-bootstrap", d.boot, "-sglang", release, "-concurrency", strconv.Itoa(conc), "-quiet",
		"-json", filepath.Join(r.dir, "decode.json"), "-rooms-out", filepath.Join(r.dir, "decode-rooms.json"),
		"-waiting-timeout", waiting, "-release-timeout", "4s", "-heartbeat-interval", heartbeatInterval + "s",
		"-heartbeat-max-failure", heartbeatFailures, "-topology-retry", "20ms", "-topology-attempts", "1000"}, append(work, decOnly...)...)...)
	r.dec.Env = append(baseEnv(), commonEnv()...)
	r.dec.Stdout, r.dec.Stderr = &r.decOut, &r.decOut
	for _, c := range []*exec.Cmd{r.sched, r.dec} {
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := r.sched.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.schedDone <- r.sched.Wait() }()
	if err := r.dec.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.decDone <- r.dec.Wait() }()
	t.Cleanup(func() {
		for _, c := range []*exec.Cmd{r.sched, r.dec} {
			if c.ProcessState == nil {
				c.Process.Kill()
			}
		}
		if t.Failed() {
			t.Logf("kvxfer-sched output:\n%s\nkvxfer-decode output:\n%s", testrig.LastLines(r.schedOut.String(), 30), testrig.LastLines(r.decOut.String(), 30))
		}
	})
	return r
}

func waitCmd(t *testing.T, name string, done chan error, within time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		t.Fatalf("%s did not finish in %v", name, within)
		return nil
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// join compares decode's per-room outcomes with the scheduler's: a room
// decode completed must have succeeded on prefill, and a room prefill
// reported successful must have completed on decode, unless decode aborted
// it itself (the workload's decode-side aborts may come after the last byte
// landed; the demo counts those as "prefill_only_success" too).
func join(decodeRooms, prefillRooms map[string]string) (disagree []string, decodeAbortedAfter int) {
	for id, o := range decodeRooms {
		p, ok := prefillRooms[id]
		ps := strings.HasPrefix(p, "Success")
		switch {
		case !ok:
			disagree = append(disagree, "room "+id+": decode "+o+", never seen by the scheduler")
		case o == "success" && !ps:
			disagree = append(disagree, fmt.Sprintf("room %s: decode %s, prefill %s", id, o, p))
		case o != "success" && ps && o == "aborted":
			decodeAbortedAfter++
		case o != "success" && ps:
			disagree = append(disagree, fmt.Sprintf("room %s: decode %s, prefill %s", id, o, p))
		}
	}
	return disagree, decodeAbortedAfter
}

// TestHostsEmulator runs kvxfer-decode -nixl-backend nixl on the decode host.
func TestHostsEmulator(t *testing.T) {
	needHosts(t)
	needNIXL(t)
	for _, release := range []string{"0.5.23", "0.5.18"} {
		t.Run(release, func(t *testing.T) { emulatorScenarios(t, release) })
	}
	t.Run("0.5.23", func(t *testing.T) {
		scenario(t, "kvxfer-decode 0.5.23", "-host 0.0.0.0", func(t *testing.T, note func(string, ...any)) {
			d := startKvxferd(t, []string{"-host", "0.0.0.0"})
			r := startEmul(t, d, "0.5.23", 50, 8)
			if err := waitCmd(t, "kvxfer-sched", r.schedDone, 120*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := waitCmd(t, "kvxfer-decode", r.decDone, 60*time.Second); err != nil {
				t.Fatal(err)
			}
			if ip, _ := route(t, d.boot); ip != prefillIP {
				t.Fatalf("decode is told rank_ip %s, want the detected %s", ip, prefillIP)
			}
			var ds decode.Summary
			readJSON(t, filepath.Join(r.dir, "decode.json"), &ds)
			if ds.Outcomes["success"] == 0 || ds.WrongBytes != 0 {
				t.Fatalf("decode: %v, %d wrong bytes", ds.Outcomes, ds.WrongBytes)
			}
			note("rank_ip %s detected; 50 rooms %v, %d bytes verified", prefillIP, joinCounts(ds.Outcomes), ds.BytesVerified)
		})
	})
	printTable(t)
}

func emulatorScenarios(t *testing.T, release string) {
	{
		label := "kvxfer-decode " + release
		scenario(t, label, "200-room workload", func(t *testing.T, note func(string, ...any)) {
			d := startKvxferd(t, []string{"-host", prefillIP})
			r := startEmul(t, d, release, 200, 16)
			schedErr := waitCmd(t, "kvxfer-sched", r.schedDone, 120*time.Second)
			decErr := waitCmd(t, "kvxfer-decode", r.decDone, 60*time.Second)
			if schedErr != nil || decErr != nil {
				t.Fatalf("kvxfer-sched: %v; kvxfer-decode: %v", schedErr, decErr)
			}
			var ds decode.Summary
			var ss sched.Summary
			var dr, pr map[string]string
			readJSON(t, filepath.Join(r.dir, "decode.json"), &ds)
			readJSON(t, filepath.Join(r.dir, "sched.json"), &ss)
			readJSON(t, filepath.Join(r.dir, "decode-rooms.json"), &dr)
			readJSON(t, filepath.Join(r.dir, "sched-rooms.json"), &pr)
			bad, after := join(dr, pr)
			if len(bad) > 0 {
				t.Fatalf("%d rooms the two sides disagree on: %v", len(bad), bad[:min(len(bad), 10)])
			}
			if ds.WrongBytes != 0 || ds.AuxErrors != 0 || ds.BytesVerified == 0 || ss.Pinned != 0 || ds.Rooms != 200 {
				t.Fatalf("decode: %d rooms, %d bytes verified, %d wrong, %d aux errors; prefill pinned %d", ds.Rooms, ds.BytesVerified, ds.WrongBytes, ds.AuxErrors, ss.Pinned)
			}
			note("200 rooms: %v on decode, %d bytes verified, 0 wrong, sides agree (%d decode aborts after prefill's success); prefill p50 %.1f ms", joinCounts(ds.Outcomes), ds.BytesVerified, after, ss.P50Millis)
		})
		if release == "0.5.23" { // 0.5.18 across a cut: SGLang's own decode
			scenario(t, label, "link cut 10 s", func(t *testing.T, note func(string, ...any)) {
				emulLinkCut(t, release, note)
			})
		}
		scenario(t, label, "decode kill -9", func(t *testing.T, note func(string, ...any)) {
			dbg := freePort(t)
			d := startKvxferd(t, []string{"-host", prefillIP, "-debug-addr", "127.0.0.1:" + strconv.Itoa(dbg)}, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=4")
			r := startEmul(t, d, release, 100000, 16, "-abort-share", "0")
			cli, err := control.Dial(d.ctl) // a second client, only to poll
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			// Kill once the run is warm and decode has rooms in flight on kvxferd.
			time.Sleep(time.Second)
			deadline := time.Now().Add(30 * time.Second)
			var inflight []uint64
			for len(inflight) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("no room with a decode agent after 30 s")
				}
				inflight = liveAgentRooms(t, dbg)
			}
			at := time.Now()
			r.dec.Process.Kill()
			<-r.decDone
			var reps []kv.Reply
			for {
				if reps, err = cli.Poll(inflight, nil); err != nil {
					t.Fatal(err)
				}
				done := true
				for _, rep := range reps {
					done = done && rep.Status.Terminal()
				}
				if done {
					break
				}
				if time.Since(at) > 30*time.Second {
					t.Fatalf("rooms of the killed decode still live 30 s after the kill: %v", reps)
				}
				time.Sleep(2 * time.Millisecond)
			}
			took := time.Since(at)
			r.sched.Process.Signal(syscall.SIGTERM)
			lost := 0
			for i, rep := range reps {
				switch {
				case rep.Status == kv.StatusFailed && rep.Reason.String() == "peer_lost":
					lost++
				case rep.Status == kv.StatusSuccess: // completed before the kill reached kvxferd
				default:
					t.Fatalf("room %d ended %v/%v after decode's SIGKILL, want Failed/peer_lost", inflight[i], rep.Status, rep.Reason)
				}
			}
			if lost == 0 {
				t.Fatalf("none of the %d rooms in flight ended peer_lost", len(inflight))
			}
			note("%d of %d rooms in flight peer_lost (the rest completed first), all terminal %.2f s after the kill", lost, len(inflight), took.Seconds())
		})
	}
}

// emulLinkCut runs 150 rooms at 20 a second (no abort plans) and cuts the
// link for 10 s once 30 rooms have finished. Both processes must finish
// cleanly (no wrong byte: decode poisons pages before it hands them out, so a
// late write into a page it gave up shows up when the page is reused; nothing
// pinned) and the two sides must agree on every room. The rooms that succeed
// after the link returns are counted, not asserted: during the cut decode's
// new rooms fail at once (no bootstrap server), so decode runs ahead of the
// scheduler, whose rooms wait for their bootstrap deadline, and the two
// emulators' windows need not meet again (SGLang's decode asserts it).
func emulLinkCut(t *testing.T, release string, note func(string, ...any)) {
	const rooms, last = 110, 15
	dbg := freePort(t)
	// Rooms decode gave up during the cut (and never sends a transfer info
	// for again) fill the scheduler's window until their bootstrap deadline:
	// keep it short here.
	d := startKvxferd(t, []string{"-host", prefillIP, "-debug-addr", "127.0.0.1:" + strconv.Itoa(dbg)}, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=8")
	defer func() {
		if t.Failed() {
			for _, path := range []string{"/debug/rooms?limit=20", "/debug/peers"} {
				if resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(dbg) + path); err == nil {
					b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<10))
					resp.Body.Close()
					t.Logf("kvxferd %s:\n%s", path, b)
				}
			}
		}
	}()
	r := startEmul(t, d, release, rooms, 16, "-abort-share", "0", "-seed", "1", "-rate", "4")
	// Cut once decode is registered and rooms are completing (decode's NIXL
	// agent must have been created with the link up: UCX publishes only the
	// interfaces that are up).
	for deadline := time.Now().Add(30 * time.Second); tombstones(t, dbg) < 10; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 10 rooms finished in 30 s; kvxfer-decode:\n%s", testrig.LastLines(r.decOut.String(), 20))
		}
	}
	t0 := time.Now()
	setLink(t, false)
	time.Sleep(10 * time.Second)
	setLink(t, true)
	successAtUp := retiredSuccess(t, dbg)
	schedErr, decErr := errors.New("did not finish in 100 s"), errors.New("did not finish in 100 s")
	select {
	case schedErr = <-r.schedDone:
		select {
		case decErr = <-r.decDone:
		case <-time.After(30 * time.Second):
		}
	case <-time.After(100 * time.Second):
		if os.Getenv("KVXFER_HOSTS_STACKS") == "1" { // goroutine dumps of both emulators
			r.sched.Process.Signal(syscall.SIGQUIT)
			r.dec.Process.Signal(syscall.SIGQUIT)
			time.Sleep(2 * time.Second)
			os.WriteFile("/tmp/kvx-sched-stacks.txt", r.schedOut.Bytes(), 0o644)
			os.WriteFile("/tmp/kvx-decode-stacks.txt", r.decOut.Bytes(), 0o644)
		}
		t.Fatalf("kvxfer-sched did not finish within 100 s of the cut; kvxfer-sched:\n%s\nkvxfer-decode:\n%s",
			testrig.LastLines(r.schedOut.String(), 5), testrig.LastLines(r.decOut.String(), 20))
	}
	took := time.Since(t0)
	successAfter := retiredSuccess(t, dbg) - successAtUp
	var ds decode.Summary
	var ss sched.Summary
	var dr, pr map[string]string
	readJSON(t, filepath.Join(r.dir, "decode.json"), &ds)
	readJSON(t, filepath.Join(r.dir, "sched.json"), &ss)
	readJSON(t, filepath.Join(r.dir, "decode-rooms.json"), &dr)
	readJSON(t, filepath.Join(r.dir, "sched-rooms.json"), &pr)
	prefillBy := map[string]int{}
	for _, o := range pr {
		prefillBy[o]++
	}
	bad, _ := join(dr, pr)
	var lateFail []string
	for i := rooms - last; i < rooms; i++ {
		id := strconv.FormatUint(workload.RoomID(1, i), 10)
		if dr[id] != "success" || !strings.HasPrefix(pr[id], "Success") {
			lateFail = append(lateFail, fmt.Sprintf("room %s (plan %d): decode %q, prefill %q", id, i, dr[id], pr[id]))
		}
	}
	note("decode %v (heartbeat losses %d), prefill %s; %d disagreements, %d wrong bytes, %d pinned; %d rooms succeeded after the link returned, the last %d rooms: %d failed; %.1f s from the cut to both exits",
		joinCounts(ds.Outcomes), ds.HeartbeatLosses, joinCounts(prefillBy), len(bad), ds.WrongBytes, ss.Pinned, successAfter, last, len(lateFail), took.Seconds())
	if schedErr != nil || decErr != nil {
		t.Errorf("kvxfer-sched: %v; kvxfer-decode: %v", schedErr, decErr)
	}
	if len(bad) > 0 {
		t.Errorf("%d rooms the two sides disagree on: %v", len(bad), bad[:min(len(bad), 10)])
	}
	if ds.WrongBytes != 0 || ds.AuxErrors != 0 || ss.Pinned != 0 {
		t.Errorf("decode: %d wrong bytes, %d aux errors; prefill: %d pinned", ds.WrongBytes, ds.AuxErrors, ss.Pinned)
	}
	if len(lateFail) > 0 {
		t.Errorf("rooms started after the link returned failed: %v", lateFail[:min(len(lateFail), 5)])
	}
}

// retiredSuccess reads kvxferd's count of rooms retired as Success (/metrics).
func retiredSuccess(t *testing.T, dbg int) int {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(dbg) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "kvxfer_rooms_retired") && strings.Contains(line, `"Success"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += int(v)
		}
	}
	return n
}

// tombstones is the number of finished rooms kvxferd keeps.
func tombstones(t *testing.T, dbg int) int {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(dbg) + "/debug/rooms?limit=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Stats struct{ Tombstones int } `json:"stats"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Stats.Tombstones
}

// liveAgentRooms lists the non-terminal rooms on kvxferd that a decode agent
// has sent a transfer info for.
func liveAgentRooms(t *testing.T, dbg int) []uint64 {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(dbg) + "/debug/rooms?limit=10000")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Rooms []struct {
			Room   uint64   `json:"room"`
			Agents []string `json:"Agents"`
		} `json:"rooms"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, r := range body.Rooms {
		if len(r.Agents) > 0 {
			out = append(out, r.Room)
		}
	}
	return out
}

// printTable logs the scenario table; KVXFER_HOSTS_DOC=path writes it into
// that markdown file between the hosts-table markers.
func printTable(t *testing.T) {
	md := results.markdown()
	t.Log("\n" + md)
	doc := os.Getenv("KVXFER_HOSTS_DOC")
	if doc == "" {
		return
	}
	if !filepath.IsAbs(doc) {
		doc = filepath.Join(repoRoot(), doc)
	}
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Logf("KVXFER_HOSTS_DOC: %v", err)
		return
	}
	const begin, end = "<!-- hosts-table:begin -->", "<!-- hosts-table:end -->"
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Logf("KVXFER_HOSTS_DOC: %s has no %s … %s markers", doc, begin, end)
		return
	}
	out := s[:i+len(begin)] + "\n" + md + s[j:]
	if err := os.WriteFile(doc, []byte(out), 0o644); err != nil {
		t.Logf("KVXFER_HOSTS_DOC: %v", err)
	}
}
