package hostile

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/transport/control"
)

// Baseline: the honest workload alone, for the resource figures the bounds
// are judged against.
func TestBaseline(t *testing.T) {
	hostile(t)
	d := startDaemon(t, daemonOpts{})
	idle := d.proc()
	w := startWorkload(t, d, workloadOpts{rooms: 300, rate: 100})
	s := d.sample(50 * time.Millisecond)
	checkHonest(t, w, 60*time.Second)
	peak := s.end()
	record(t, "no attack (reference)", "—", fmt.Sprintf("idle %s; peak under the honest workload %s", idle, peak), true)
	checkDaemon(t, d, peak, bounds.steady)
}

// F1: a decode registration whose loopback metadata names an ordinary file,
// then one transfer info; then a decode that truncates its own (legitimate)
// segment before a write.
func TestF1LoopbackNamespace(t *testing.T) {
	hostile(t)
	d := startDaemon(t, daemonOpts{})
	tmpCanary := newCanary(t, t.TempDir(), 1<<16)
	shmDir := "/dev/shm"
	if st, err := os.Stat(shmDir); err != nil || !st.IsDir() {
		shmDir = t.TempDir()
	}
	w := startWorkload(t, d, workloadOpts{rooms: 300, rate: 60})
	if err := d.waitLive(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	s := d.sample(50 * time.Millisecond)
	cli := dialControl(t, d)
	push := dialPusher(t, d.zmqPort)
	f := newFakeDecode(t, "f1", 0)

	// F1a: the metadata's only segment is an ordinary 0644 file (one in
	// /dev/shm outside the namespace, one in a temp dir).
	for i, dir := range []string{shmDir, ""} {
		var c *canary
		if dir == "" {
			c = tmpCanary
		} else {
			// Sized exactly as the layout needs, so the old backend accepts it.
			_, _, _, size := canaryMetadata("x", "/x", "/x", 2)
			c = newCanary(t, dir, int(size))
		}
		agent := fmt.Sprintf("hostile-f1-canary-%d", i)
		md, kv, aux, _ := canaryMetadata(agent, filepath.Join(t.TempDir(), "no-notif.sock"), c.path, 2)
		if err := push.send(registrationFrames(agent, f.port, md, kv, aux, 2)); err != nil {
			t.Fatal(err)
		}
		id := attackRoom(i)
		if _, err := cli.Open(id, ""); err != nil {
			t.Fatal(err)
		}
		if err := push.send(transferInfo(agent, f.port, id, 2)); err != nil {
			t.Fatal(err)
		}
		rep, err := serveRoom(cli, id, []int32{prefillSlots - 2, prefillSlots - 1}, prefillAux-1)
		why := c.check()
		m := "unchanged; room " + replyString(rep)
		if err != nil {
			m += " (" + err.Error() + ")"
		}
		if why != "" {
			m = why + "; room " + replyString(rep)
		}
		record(t, "F1a metadata names an ordinary file in "+filepath.Dir(c.path), "file untouched, room Failed",
			m, why == "" && err == nil && rep.Status.String() == "Failed")
		cli.Clear(id)
	}

	// F1b: a legitimate decode segment, truncated by its owner after the
	// registration, then a write into it.
	if err := push.send(f.registration(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	for _, p := range segmentFiles(t, f.node.Agent) {
		if err := os.Truncate(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	id := attackRoom(10)
	if _, err := cli.Open(id, ""); err != nil {
		t.Fatal(err)
	}
	if err := push.send(transferInfo(f.name(), f.port, id, 2)); err != nil {
		t.Fatal(err)
	}
	rep, err := serveRoom(cli, id, []int32{prefillSlots - 2, prefillSlots - 1}, prefillAux-1)
	time.Sleep(200 * time.Millisecond)
	m := "room " + replyString(rep)
	if err != nil {
		m += " (" + err.Error() + ")"
	}
	if !d.Alive() {
		m = "kvxferd died: " + d.ExitDesc() + sigbus(d)
	}
	record(t, "F1b decode truncates its registered segment, then a WRITE", "room Failed, daemon alive",
		m, d.Alive() && rep.Status.String() == "Failed")

	checkHonest(t, w, 60*time.Second)
	checkDaemon(t, d, s.end(), bounds.steady, tmpCanary)
}

// F1c: the scheduler truncates its own registered shared-memory file, then a
// room reads from it. The test plays the scheduler (memory in /dev/shm, as
// kvxfer-sched's), so there is no honest workload on this daemon.
func TestF1SchedulerTruncates(t *testing.T) {
	hostile(t)
	d := startDaemon(t, daemonOpts{})
	cli := dialControl(t, d)
	root := "/dev/shm"
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		root = os.TempDir()
	}
	dir, err := os.MkdirTemp(root, "kvxfer-sched-hostile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	const slots, auxSlots = 64, 16
	kvLen := uint64(slots * prefillItem)
	kvPath, auxPath := filepath.Join(dir, "kv"), filepath.Join(dir, "aux")
	auxTotal := uint64(0)
	for _, it := range auxItems() {
		auxTotal += it * auxSlots
	}
	for p, n := range map[string]uint64{kvPath: 2 * prefillLayers * kvLen, auxPath: auxTotal} {
		if err := os.WriteFile(p, make([]byte, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kv := &control.MemoryRegistration{Kind: control.KindKV}
	for b := range 2 * prefillLayers {
		kv.Buffers = append(kv.Buffers, control.Region{Shm: kvPath, Offset: uint64(b) * kvLen, Length: kvLen, ItemLen: prefillItem, Mem: nixl.DRAM})
	}
	aux := &control.MemoryRegistration{Kind: control.KindAux}
	off := uint64(0)
	for _, it := range auxItems() {
		aux.Buffers = append(aux.Buffers, control.Region{Shm: auxPath, Offset: off, Length: it * auxSlots, ItemLen: it, Mem: nixl.DRAM})
		off += it * auxSlots
	}
	for _, r := range []*control.MemoryRegistration{kv, aux} {
		if _, err := cli.RegisterMemory(r); err != nil {
			t.Fatalf("register_memory %s: %v", r.Kind, err)
		}
	}
	if err := d.waitLive(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	f := newFakeDecode(t, "f1c", 0)
	push := dialPusher(t, d.zmqPort)
	if err := push.send(f.registration(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	// A first room before the truncation proves the path works.
	id0 := attackRoom(20)
	cli.Open(id0, "")
	push.send(transferInfo(f.name(), f.port, id0, 2))
	rep0, err0 := serveRoom(cli, id0, []int32{0, 1}, 0)
	if err := os.Truncate(kvPath, 0); err != nil {
		t.Fatal(err)
	}
	id := attackRoom(21)
	cli.Open(id, "")
	push.send(transferInfo(f.name(), f.port, id, 2))
	rep, err := serveRoom(cli, id, []int32{slots - 2, slots - 1}, 1)
	time.Sleep(200 * time.Millisecond)
	m := fmt.Sprintf("before truncation room %s (%v); after: room %s", replyString(rep0), err0, replyString(rep))
	if err != nil {
		m += " (" + err.Error() + ")"
	}
	if !d.Alive() {
		m += "; kvxferd died: " + d.ExitDesc() + sigbus(d)
	}
	record(t, "F1c scheduler truncates its registered KV file, then a WRITE", "room Failed, daemon alive",
		m, d.Alive() && rep.Status.String() == "Failed")
	err = d.health(5 * time.Second)
	record(t, "daemon alive and answering", "alive, /health and /healthz 200", fmt.Sprint(err), err == nil)
}

// sigbus names a fatal signal found in the daemon's log.
func sigbus(d *kvxferd) string {
	for _, s := range []string{"SIGBUS", "SIGSEGV", "unexpected fault address"} {
		if d.logCount(s) > 0 {
			return " (" + s + " in the log)"
		}
	}
	return ""
}
