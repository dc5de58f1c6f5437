package nixltest

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

// Fault is the backend-neutral fault a suite case asks for; see Pair.Inject.
type Fault struct {
	Latency    time.Duration
	Fail       bool
	Hang       bool
	Disconnect bool
}

// Pair is what a backend hands the suite: two fresh agents and how to get memory.
type Pair struct {
	A, B nixl.Agent
	// Alloc returns n zeroed bytes that ag can Register (not Go heap).
	Alloc func(t testing.TB, ag nixl.Agent, n int) []byte
	// Inject sets the fault that transfers from ag to peer suffer; Fault{} clears
	// it. Nil skips the fault-injection cases.
	Inject func(ag nixl.Agent, peer string, f Fault)
}

// Timeout bounds every wait in the suite; nothing in it depends on timing otherwise.
var Timeout = 20 * time.Second

// Run runs the whole suite. newPair is called once per case and should register
// t.Cleanup to close the agents.
func Run(t *testing.T, newPair func(t *testing.T) Pair) {
	cases := []struct {
		name string
		fn   func(t *testing.T, p Pair)
	}{
		{"Metadata", testMetadata},
		{"PreppedWrite", testPreppedWrite},
		{"PreppedRead", testPreppedRead},
		{"CreateWrite", testCreateWrite},
		{"NotifAfterBytes", testNotifAfterBytes},
		{"BatchedPoll", testBatchedPoll},
		{"Repost", testRepost},
		{"SendNotif", testSendNotif},
		{"SendNotifs", testSendNotifs},
		{"MisuseDescriptors", testMisuseDescriptors},
		{"MisuseIndices", testMisuseIndices},
		{"MisuseHandles", testMisuseHandles},
		{"DropPeer", testDropPeer},
		{"Concurrent", testConcurrent},
		{"FaultLatency", testFaultLatency},
		{"FaultFail", testFaultFail},
		{"FaultHang", testFaultHang},
		{"FaultDisconnect", testFaultDisconnect},
		{"Close", testClose},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newPair(t)) })
	}
}

// side is one agent's registered test memory: n pages of size bytes.
type side struct {
	ag    nixl.Agent
	mem   []byte
	page  int
	n     int
	reg   nixl.RegID
	descs []nixl.Desc
}

func newSide(t testing.TB, p Pair, ag nixl.Agent, pages, page int) *side {
	t.Helper()
	s := &side{ag: ag, mem: p.Alloc(t, ag, pages*page), page: page, n: pages}
	reg, err := ag.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(s.mem, 0)})
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	s.reg = reg
	for i := range pages {
		s.descs = append(s.descs, nixl.DescOf(s.pageBytes(i), 0))
	}
	return s
}

func (s *side) pageBytes(i int) []byte { return s.mem[i*s.page : (i+1)*s.page] }

// fill writes a pattern that identifies (tag, page) into page i.
func (s *side) fill(i int, tag byte) {
	b := s.pageBytes(i)
	for k := range b {
		b[k] = tag ^ byte(i*31) ^ byte(k*7)
	}
}

func (s *side) check(t testing.TB, i int, tag byte) {
	t.Helper()
	b := s.pageBytes(i)
	for k := range b {
		if want := tag ^ byte(i*31) ^ byte(k*7); b[k] != want {
			t.Fatalf("%s page %d byte %d = %#x, want %#x", s.ag.Name(), i, k, b[k], want)
		}
	}
}

// connect loads b's metadata into a and returns b's name as a sees it.
func connect(t testing.TB, a, b nixl.Agent) string {
	t.Helper()
	md, err := b.LocalMetadata()
	if err != nil {
		t.Fatalf("LocalMetadata: %v", err)
	}
	name, err := a.LoadPeer(md)
	if err != nil {
		t.Fatalf("LoadPeer: %v", err)
	}
	if name != b.Name() {
		t.Fatalf("LoadPeer returned %q, want %q", name, b.Name())
	}
	return name
}

func prep(t testing.TB, ag nixl.Agent, peer string, descs []nixl.Desc) nixl.ListID {
	t.Helper()
	id, err := ag.Prep(peer, nixl.DRAM, descs)
	if err != nil {
		t.Fatalf("Prep(%q): %v", peer, err)
	}
	return id
}

// waitTerminal polls until x is terminal and returns its status.
func waitTerminal(t testing.TB, ag nixl.Agent, x nixl.XferID) nixl.Status {
	t.Helper()
	st := make([]nixl.Status, 1)
	deadline := time.Now().Add(Timeout)
	for spin := 0; ; spin++ {
		if err := ag.Poll([]nixl.XferID{x}, st); err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if st[0].State.Terminal() && st[0].State != nixl.Idle {
			return st[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("request %d still %v after %v", x, st[0].State, Timeout)
		}
		backoff(spin)
	}
}

func mustDone(t testing.TB, ag nixl.Agent, x nixl.XferID) {
	t.Helper()
	if st := waitTerminal(t, ag, x); st.State != nixl.Done {
		t.Fatalf("request %d ended %v: %v", x, st.State, st.Err)
	}
}

func backoff(spin int) {
	if spin < 50 {
		runtime.Gosched()
		return
	}
	time.Sleep(time.Duration(min(spin, 1000)) * time.Microsecond)
}

// waitNotifs drains ag until n notifications arrived (more is an error only if
// they show up in the same drain).
func waitNotifs(t testing.TB, ag nixl.Agent, n int) []nixl.Notif {
	t.Helper()
	var got []nixl.Notif
	deadline := time.Now().Add(Timeout)
	for spin := 0; len(got) < n; spin++ {
		var err error
		if got, err = ag.Notifs(got); err != nil {
			t.Fatalf("Notifs: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s got %d of %d notifications: %v", ag.Name(), len(got), n, got)
		}
		backoff(spin)
	}
	return got
}

func post(t testing.TB, ag nixl.Agent, x nixl.XferID) {
	t.Helper()
	if st, err := ag.Post(x); err != nil || (st != nixl.InProgress && st != nixl.Done) {
		t.Fatalf("Post(%d) = %v, %v", x, st, err)
	}
}

func release(t testing.TB, ag nixl.Agent, x nixl.XferID) {
	t.Helper()
	if err := ag.Release(x); err != nil {
		t.Fatalf("Release(%d): %v", x, err)
	}
}

func wantErr(t testing.TB, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

func idx(v ...int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

func notifSet(ns []nixl.Notif) map[string]string {
	m := map[string]string{}
	for _, n := range ns {
		m[n.Msg] = n.Peer
	}
	return m
}

func mustMsg(t testing.TB, ns []nixl.Notif, from, msg string) {
	t.Helper()
	if p, ok := notifSet(ns)[msg]; !ok || p != from {
		t.Fatalf("notification %q from %q not in %v", msg, from, ns)
	}
}

func label(i int) string { return fmt.Sprintf("n%d", i) }
