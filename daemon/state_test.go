package daemon

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// A restarted daemon with the same -state-dir serves a decode that registered
// with the one before it: the decode's next room succeeds without it
// registering again (SGLang's decode registers once per connection-pool entry).
func TestStateDirReplaysRegistrationsAfterRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	port := freePort(t)
	logs := &logBuf{}
	mod := func(c *Config) {
		c.StateDir, c.PullPort = dir, port
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}
	d1 := startDaemonWith(t, mod)
	s1 := newScheduler(t, d1)
	dec := newDecode(t, d1)
	run := func(d *Daemon, s *scheduler, id uint64, base int) {
		t.Helper()
		dst := seqPages(base, 3)
		dec.checker.Expect(id, 1, false)
		dec.send(t, dec.info(id, dst, int(id%8), 1))
		s.start(t, roomSpec{id: id, src: seqPages(0, 3), chunks: []int{2, 1}, aux: int(id % 8)})
		if rep := s.waitTerminal(t, id); rep.Status != kv.StatusSuccess {
			t.Fatalf("room %d ended %v/%v", id, rep.Status, rep.Reason)
		}
		dec.verify(t, id, dst, int(id%8))
		s.cli.Clear(id)
	}
	run(d1, s1, 1, 10)
	d1.state.sync() // kept as the decode registered: on disk once its writer is past it
	fi, err := os.Stat(filepath.Join(dir, stateFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v", fi.Mode().Perm())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	d1.Shutdown(ctx)
	cancel()

	d2 := startDaemonWith(t, mod)
	s2 := newScheduler(t, d2) // goes live: the registration is replayed
	deadline := time.Now().Add(5 * time.Second)
	for d2.Counters()["registrations"] != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if d2.Counters()["registrations"] != 1 {
		t.Fatalf("registrations after the replay: %v\n%s", d2.Counters(), logs.String())
	}
	run(d2, s2, 2, 20) // the decode's PUSH socket reconnects to the same port; no new registration
	if !strings.Contains(logs.String(), "replayed=1") {
		t.Fatalf("no replay logged:\n%s", logs.String())
	}
}

// A replayed registration whose decode is gone is dropped quietly and
// forgotten; a new registration from the same endpoint replaces the kept one.
func TestStateStoreDedupAndReplayOfAGoneDecode(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	s, msgs := openRegStore(dir, "scope", 4, log)
	if s == nil || msgs != nil {
		t.Fatal("fresh store")
	}
	reg := func(agent string, port int) *wire.Registration {
		return &wire.Registration{DecodeIP: "127.0.0.1", DecodePort: port, AgentName: agent, AgentMetadata: []byte("md"),
			DecodeTPSize: 1, HasLayerInfo: true, DCPSize: 1}
	}
	for _, r := range []*wire.Registration{reg("a", 1), reg("b", 2), reg("a2", 1), reg("c", 3), reg("d", 4), reg("e", 5)} {
		s.put(r, r.Encode())
	}
	s.sync()
	_, msgs = openRegStore(dir, "scope", 4, log)
	var names []string
	for _, m := range msgs {
		r, _ := wire.DecodeInbound(m)
		names = append(names, r.(*wire.Registration).AgentName)
	}
	// a2 replaced a (same endpoint); b, the oldest, went past the cap of 4.
	if strings.Join(names, ",") != "a2,c,d,e" {
		t.Fatalf("kept %v", names)
	}
	if _, msgs := openRegStore(dir, "other rank", 4, log); msgs != nil {
		t.Fatal("a state file of another scope was replayed")
	}
	for _, a := range []string{"a2", "c", "d", "e"} {
		s.remove(a)
	}
	s.sync()
	if _, err := os.Stat(filepath.Join(dir, stateFile)); !os.IsNotExist(err) {
		t.Fatalf("empty store left its file: %v", err)
	}

	// A decode gone before the restart: the daemon starts, goes live, and
	// forgets it.
	logs := &logBuf{}
	scope := (&Daemon{cfg: Config{HostIP: "127.0.0.1", Rank: Rank{TPSize: 1, PPSize: 1, CPSize: 1, DPSize: 1}}}).stateScope()
	s, _ = openRegStore(dir, scope, 4, log)
	s.put(reg("gone", 9), reg("gone", 9).Encode())
	s.close()
	d := startDaemonWith(t, func(c *Config) {
		c.StateDir = dir
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	if len(d.replay) != 1 {
		t.Fatalf("scope %q: nothing to replay:\n%s", scope, logs.String())
	}
	newScheduler(t, d)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "replayed decode registration dropped") {
		if time.Now().After(deadline) {
			t.Fatalf("no drop logged:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.state.sync()
	if _, err := os.Stat(filepath.Join(dir, stateFile)); !os.IsNotExist(err) {
		t.Fatalf("the gone decode's registration was kept: %v", err)
	}
}

// A state file that is corrupt, oversized, foreign-owned, of the wrong mode
// or a symlink is refused with a clear log line, and the daemon starts.
func TestStateFileRefused(t *testing.T) {
	good := func(dir string) {
		s, _ := openRegStore(dir, "x", 4, slog.New(slog.DiscardHandler))
		r := &wire.Registration{DecodeIP: "127.0.0.1", DecodePort: 1, AgentName: "a", DecodeTPSize: 1}
		s.put(r, r.Encode())
		s.close()
	}
	cases := map[string]struct {
		prep func(t *testing.T, path string)
		want string
	}{
		"corrupt": {func(t *testing.T, p string) {
			data, _ := os.ReadFile(p)
			if err := os.WriteFile(p, data[:len(data)-3], 0o600); err != nil || len(data) < 40 {
				t.Fatalf("%v: %d bytes", err, len(data))
			}
		}, "registration 0: truncated"},
		"bad magic": {func(t *testing.T, p string) { os.WriteFile(p, []byte("hello world, not ours"), 0o600) }, "bad magic"},
		"oversized": {func(t *testing.T, p string) {
			if err := os.Truncate(p, stateMaxFile+1); err != nil {
				t.Fatal(err)
			}
		}, "cap"},
		"mode": {func(t *testing.T, p string) { os.Chmod(p, 0o644) }, "want 0600"},
		"symlink": {func(t *testing.T, p string) {
			os.Rename(p, p+".real")
			os.Symlink(p+".real", p)
		}, "symlink"},
		"foreign": {func(t *testing.T, p string) {
			if os.Getuid() != 0 {
				t.Skip("chown needs root")
			}
			if err := os.Chown(p, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, "not us"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			good(dir)
			c.prep(t, filepath.Join(dir, stateFile))
			logs := &logBuf{}
			s, msgs := openRegStore(dir, "x", 4, slog.New(slog.NewTextHandler(logs, nil)))
			if s == nil || msgs != nil {
				t.Fatalf("store %v, replay %d", s, len(msgs))
			}
			if !strings.Contains(logs.String(), "state file refused") || !strings.Contains(logs.String(), c.want) {
				t.Fatalf("log:\n%s", logs.String())
			}
			d := startDaemonWith(t, func(cfg *Config) { cfg.StateDir = dir })
			newScheduler(t, d)
			if !d.Live() {
				t.Fatal("daemon not live")
			}
		})
	}
	// A directory others can reach turns the store off, and the daemon starts.
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	logs := &logBuf{}
	if s, _ := openRegStore(dir, "x", 4, slog.New(slog.NewTextHandler(logs, nil))); s != nil || !strings.Contains(logs.String(), "state dir refused") {
		t.Fatalf("open dir accepted:\n%s", logs.String())
	}
}
