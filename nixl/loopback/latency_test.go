package loopback_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// latencyRig is a prefill agent on a fake clock writing 4 KiB to a decode agent.
type latencyRig struct {
	clk     *clock.Fake
	a, d    *loopback.Agent
	peer    string
	src     []byte
	dst     []byte
	woke    chan struct{}
	created time.Time
}

func newLatencyRig(t *testing.T) *latencyRig {
	t.Helper()
	r := &latencyRig{clk: clock.NewFake(time.Unix(1000, 0)), woke: make(chan struct{}, 1)}
	var err error
	if r.a, err = loopback.New("lat-a-"+t.Name(), loopback.Options{Clock: r.clk}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.a.Close() })
	r.d = newAgent(t)
	if r.src, _, err = r.a.AllocRegistered(nixl.DRAM, 0, 4096); err != nil {
		t.Fatal(err)
	}
	if r.dst, _, err = r.d.AllocRegistered(nixl.DRAM, 0, 4096); err != nil {
		t.Fatal(err)
	}
	for i := range r.src {
		r.src[i] = byte(i*7 + 1)
	}
	md, _ := r.d.LocalMetadata()
	if r.peer, err = r.a.LoadPeer(md); err != nil {
		t.Fatal(err)
	}
	stop := r.a.OnProgress(func() {
		select {
		case r.woke <- struct{}{}:
		default:
		}
	})
	t.Cleanup(stop)
	return r
}

func (r *latencyRig) post(t *testing.T) nixl.XferID {
	t.Helper()
	x, err := r.a.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(r.src, 0)}, r.peer, nixl.DRAM, []nixl.Desc{nixl.DescOf(r.dst, 0)}, []byte("room-7"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := r.a.Post(x); err != nil || st != nixl.InProgress {
		t.Fatalf("post: %v %v", st, err)
	}
	return x
}

// waitWake waits for the agent's OnProgress wake (the worker landed the
// request). The bound only turns a hang into a failure.
func (r *latencyRig) waitWake(t *testing.T) {
	t.Helper()
	select {
	case <-r.woke:
	case <-time.After(20 * time.Second):
		t.Fatal("no OnProgress wake after the worker ran")
	}
}

func (r *latencyRig) poll(t *testing.T, x nixl.XferID) nixl.Status {
	t.Helper()
	st := make([]nixl.Status, 1)
	if err := r.a.Poll([]nixl.XferID{x}, st); err != nil {
		t.Fatal(err)
	}
	return st[0]
}

// TestLatencyCompletesWhenPolledAtDue: a post with injected latency copies at
// once, but sends its notification and reports Done only in a poll at or after
// post time + latency + bytes ÷ bandwidth, read from the agent's clock. Nothing
// fires on its own: with the clock stopped it stays InProgress however long
// real time passes, and Due reports the exact due time.
func TestLatencyCompletesWhenPolledAtDue(t *testing.T) {
	r := newLatencyRig(t)
	r.a.SetFault(r.peer, loopback.Fault{Latency: loopback.Fixed(100 * time.Microsecond), Bandwidth: 1 << 30})
	<-r.woke // SetFault wakes pollers; drain it
	t0 := r.clk.Now()
	x := r.post(t)
	want := t0.Add(100*time.Microsecond + 4096*time.Second/(1<<30))
	if due, ok := r.a.Due(); !ok || !due.Equal(want) {
		t.Fatalf("Due = %v %v, want %v", due, ok, want)
	}
	r.waitWake(t)
	if string(r.dst[:64]) != string(r.src[:64]) || r.dst[4095] != r.src[4095] {
		t.Fatal("the bytes did not land at post time")
	}
	if st := r.poll(t, x); st.State != nixl.InProgress {
		t.Fatalf("before due: %v %v", st.State, st.Err)
	}
	r.clk.Advance(want.Sub(t0) - time.Nanosecond)
	if st := r.poll(t, x); st.State != nixl.InProgress {
		t.Fatalf("1 ns before due: %v %v", st.State, st.Err)
	}
	if ns, _ := r.d.Notifs(nil); len(ns) != 0 {
		t.Fatalf("notification before the request is due: %v", ns)
	}
	r.clk.Advance(time.Nanosecond)
	if st := r.poll(t, x); st.State != nixl.Done || st.Err != nil {
		t.Fatalf("at due: %v %v", st.State, st.Err)
	}
	if _, ok := r.a.Due(); ok {
		t.Fatal("Due still reports a request after it completed")
	}
	// The notification was sent before Done was reported; it arrives.
	var got []nixl.Notif
	for end := time.Now().Add(20 * time.Second); len(got) == 0 && time.Now().Before(end); {
		got, _ = r.d.Notifs(got)
		time.Sleep(time.Millisecond)
	}
	if len(got) != 1 || got[0].Msg != "room-7" || got[0].Peer != r.a.Name() {
		t.Fatalf("notifications: %+v", got)
	}
	if err := r.a.Release(x); err != nil {
		t.Fatal(err)
	}
}

// TestLatencyFailureWaitsForDue: an injected failure with latency ends Failed
// at its due time, not before; a disconnect fails it at once and wakes.
func TestLatencyFailureWaitsForDue(t *testing.T) {
	r := newLatencyRig(t)
	r.a.SetFault(r.peer, loopback.Fault{Latency: loopback.Fixed(time.Millisecond), Fail: true})
	<-r.woke
	x := r.post(t)
	r.waitWake(t)
	if st := r.poll(t, x); st.State != nixl.InProgress {
		t.Fatalf("before due: %v", st.State)
	}
	r.clk.Advance(time.Millisecond)
	if st := r.poll(t, x); st.State != nixl.Failed || !errors.Is(st.Err, nixl.ErrBackend) {
		t.Fatalf("at due: %v %v", st.State, st.Err)
	}

	r.a.SetFault(r.peer, loopback.Fault{Latency: loopback.Fixed(time.Hour)})
	<-r.woke
	y := r.post(t)
	r.waitWake(t)
	r.a.SetFault(r.peer, loopback.Fault{Latency: loopback.Fixed(time.Hour), Disconnect: true})
	r.waitWake(t)
	if st := r.poll(t, y); st.State != nixl.Failed || !errors.Is(st.Err, nixl.ErrRemoteDisconnect) {
		t.Fatalf("after disconnect: %v %v", st.State, st.Err)
	}
	if _, ok := r.a.Due(); ok {
		t.Fatal("Due reports a failed request")
	}
}

// TestRepostGetsNewDue: a request posted again after completing gets a new due
// time from the new post; the old heap entry does not complete it early.
func TestRepostGetsNewDue(t *testing.T) {
	r := newLatencyRig(t)
	r.a.SetFault(r.peer, loopback.Fault{Latency: loopback.Fixed(time.Millisecond)})
	<-r.woke
	x := r.post(t)
	r.waitWake(t)
	r.clk.Advance(time.Millisecond)
	if st := r.poll(t, x); st.State != nixl.Done {
		t.Fatalf("first post: %v", st.State)
	}
	r.a.SetFault(r.peer, loopback.Fault{Latency: loopback.Fixed(5 * time.Millisecond)})
	<-r.woke
	t1 := r.clk.Now()
	if _, err := r.a.Post(x); err != nil {
		t.Fatal(err)
	}
	r.waitWake(t)
	if due, ok := r.a.Due(); !ok || !due.Equal(t1.Add(5*time.Millisecond)) {
		t.Fatalf("Due after repost = %v %v", due, ok)
	}
	r.clk.Advance(4 * time.Millisecond)
	if st := r.poll(t, x); st.State != nixl.InProgress {
		t.Fatalf("repost completed early: %v", st.State)
	}
	r.clk.Advance(time.Millisecond)
	if st := r.poll(t, x); st.State != nixl.Done {
		t.Fatalf("repost at due: %v", st.State)
	}
}

// TestLatencyDueNotificationsBatchPerPeer: requests to two peers that come
// due together complete in one poll, which sends each peer its notifications
// in one datagram, in post order, not a datagram per request (a poller sent
// one write per request and blocked on the peer's queue).
func TestLatencyDueNotificationsBatchPerPeer(t *testing.T) {
	r := newLatencyRig(t)
	d2 := newAgent(t)
	dst2, _, err := d2.AllocRegistered(nixl.DRAM, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	md2, _ := d2.LocalMetadata()
	peer2, err := r.a.LoadPeer(md2)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{r.peer, peer2} {
		r.a.SetFault(p, loopback.Fault{Latency: loopback.Fixed(50 * time.Microsecond)})
	}
	const n = 48 // 64-byte segments: request i writes segment i
	var ids []nixl.XferID
	want := map[string][]string{}
	for i := range n {
		peer, dst, to := r.peer, r.dst, r.d.Name()
		if i%3 == 2 {
			peer, dst, to = peer2, dst2, d2.Name()
		}
		msg := fmt.Sprintf("room-%d", i)
		x, err := r.a.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(r.src[i*64:(i+1)*64], 0)},
			peer, nixl.DRAM, []nixl.Desc{nixl.DescOf(dst[i*64:(i+1)*64], 0)}, []byte(msg))
		if err != nil {
			t.Fatal(err)
		}
		if st, err := r.a.Post(x); err != nil || st != nixl.InProgress {
			t.Fatalf("post %d: %v %v", i, st, err)
		}
		ids = append(ids, x)
		want[to] = append(want[to], msg)
	}
	testrig.Eventually(t, 20*time.Second, "every request landed", func() bool {
		for _, x := range ids {
			if !r.a.Landed(x) {
				return false
			}
		}
		return true
	})
	before := r.a.Datagrams()
	r.clk.Advance(time.Second)
	st := make([]nixl.Status, n)
	if err := r.a.Poll(ids, st); err != nil {
		t.Fatal(err)
	}
	for i, s := range st {
		if s.State != nixl.Done || s.Err != nil {
			t.Fatalf("request %d: %v %v", i, s.State, s.Err)
		}
	}
	if got := r.a.Datagrams() - before; got != 2 {
		t.Fatalf("%d datagrams for %d notifications to 2 peers, want one per peer", got, n)
	}
	for _, d := range []*loopback.Agent{r.d, d2} {
		var got []nixl.Notif
		testrig.Eventually(t, 20*time.Second, "notifications of "+d.Name(), func() bool {
			got, _ = d.Notifs(got)
			return len(got) >= len(want[d.Name()])
		})
		for i, m := range want[d.Name()] {
			if got[i].Msg != m || got[i].Peer != r.a.Name() {
				t.Fatalf("%s notification %d: %+v, want %q", d.Name(), i, got[i], m)
			}
		}
	}
}
