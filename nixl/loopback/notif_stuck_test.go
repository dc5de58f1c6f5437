package loopback

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/nixl"
)

// TestNotifyStuckPeerFailsOnlyThatPeer: a peer whose socket takes no
// datagram (a stopped or hung process: its queue fills and stays full) makes
// a send fail with ErrRemoteDisconnect once Options.NotifyTimeout passes,
// instead of holding the sender (a copy worker) forever; later sends to it
// fail at once; another peer's notifications still arrive.
func TestNotifyStuckPeerFailsOnlyThatPeer(t *testing.T) {
	a, err := New("stuck-sender", Options{NotifyTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	live, err := New("live-peer", Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = live.Close() })
	md, err := live.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadPeer(md); err != nil {
		t.Fatal(err)
	}
	// The stuck peer: a bound socket nobody reads.
	addr := unreadSocket(t)
	a.mu.Lock()
	a.peers["stuck"] = &peer{name: "stuck", sock: addr}
	a.mu.Unlock()

	msg := make([]byte, 1024)
	var sendErr error
	for i := 0; i < 1<<16 && sendErr == nil; i++ { // the queue holds far fewer
		sendErr = a.SendNotif("stuck", msg)
	}
	if !errors.Is(sendErr, nixl.ErrRemoteDisconnect) {
		t.Fatalf("sends to a peer that reads nothing: %v, want ErrRemoteDisconnect", sendErr)
	}
	if err := a.SendNotif("stuck", []byte("again")); !errors.Is(err, nixl.ErrRemoteDisconnect) {
		t.Fatalf("a send after the peer was marked gone: %v", err)
	}
	if err := a.SendNotif(live.Name(), []byte("still here")); err != nil {
		t.Fatalf("a send to the live peer: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		got, err := live.Notifs(nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 1 && got[0].Msg == "still here" && got[0].Peer == a.Name() {
			return
		}
		if len(got) > 0 {
			t.Fatalf("live peer got %+v", got)
		}
		if time.Now().After(deadline) {
			t.Fatal("the live peer's notification never arrived")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStuckPeerHoldsNoOtherPeer: a peer that reads no notification (its
// queue full, its process stopped) holds nobody: with a minute's
// NotifyTimeout, requests to it copy and then wait, in flight, with their
// notifications in its outbox, while requests to a live peer posted after
// them on the same agent (the same copy workers) complete and are notified;
// sends to the stuck peer return at once. A sender that waited for the
// stuck queue held a copy worker, and the live peer's requests behind it.
func TestStuckPeerHoldsNoOtherPeer(t *testing.T) {
	a, err := New("holds-no-one", Options{NotifyTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	live, err := New("live-decode", Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = live.Close() })
	stuck, err := New("stuck-decode", Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stuck.Close() })
	src, _, err := a.AllocRegistered(nixl.DRAM, 0, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	dsts := map[string][]byte{}
	for _, d := range []*Agent{live, stuck} {
		if dsts[d.Name()], _, err = d.AllocRegistered(nixl.DRAM, 0, 1<<16); err != nil {
			t.Fatal(err)
		}
		md, _ := d.LocalMetadata()
		if _, err := a.LoadPeer(md); err != nil {
			t.Fatal(err)
		}
	}
	// The stuck decode's notifications go to a socket nobody reads.
	addr := unreadSocket(t)
	a.mu.Lock()
	a.peers[stuck.Name()].sock = addr
	a.mu.Unlock()

	post := func(to string, i int) nixl.XferID {
		t.Helper()
		off := (i % 64) * 1024
		x, err := a.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src[off:off+1024], 0)}, to, nixl.DRAM,
			[]nixl.Desc{nixl.DescOf(dsts[to][off:off+1024], 0)}, []byte(fmt.Sprintf("%s-%d", to, i)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Post(x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	// Fill the stuck queue: the sends return at once (a waiting sender
	// would hang here for the minute), the rest waits in the outbox.
	sends := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < 64 && err == nil; i++ { // far more than its 10 datagrams
			err = a.SendNotif(stuck.Name(), []byte("signal"))
		}
		sends <- err
	}()
	select {
	case err := <-sends:
		if err != nil {
			t.Fatalf("a send to the stuck decode: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("sends to the stuck decode waited for it")
	}
	p := a.peers[stuck.Name()]
	p.obMu.Lock()
	waiting := len(p.ob.queue)
	p.obMu.Unlock()
	if waiting == 0 {
		t.Fatal("nothing waits in the stuck decode's outbox after 64 datagrams")
	}
	var held []nixl.XferID
	for i := range 16 {
		held = append(held, post(stuck.Name(), i))
	}
	var ids []nixl.XferID
	for i := range 32 {
		ids = append(ids, post(live.Name(), i))
	}
	st := make([]nixl.Status, len(ids))
	testrig.Eventually(t, 20*time.Second, "the live decode's requests done", func() bool {
		if err := a.Poll(ids, st); err != nil {
			t.Fatal(err)
		}
		for _, s := range st {
			if s.State != nixl.Done {
				return false
			}
		}
		return true
	})
	var got []nixl.Notif
	testrig.Eventually(t, 20*time.Second, "the live decode's notifications", func() bool {
		got, _ = live.Notifs(got)
		return len(got) >= len(ids)
	})
	seen := map[string]bool{} // requests on two copy workers: any order
	for _, n := range got {
		seen[n.Msg] = true
	}
	for i := range ids {
		if want := fmt.Sprintf("%s-%d", live.Name(), i); !seen[want] || len(got) != len(ids) {
			t.Fatalf("live notifications %v: want each of %d once", got, len(ids))
		}
	}
	st = make([]nixl.Status, len(held))
	if err := a.Poll(held, st); err != nil {
		t.Fatal(err)
	}
	for i, s := range st {
		if s.State != nixl.InProgress {
			t.Fatalf("request %d to the stuck decode: %v, want in flight behind its notifications", i, s.State)
		}
	}
}

// unreadSocket is a bound datagram socket nobody reads (a stopped or hung
// peer): its queue fills and stays full.
func unreadSocket(t *testing.T) *net.UnixAddr {
	t.Helper()
	addr := &net.UnixAddr{Name: filepath.Join(t.TempDir(), "stuck.sock"), Net: "unixgram"}
	sink, err := net.ListenUnixgram("unixgram", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	return addr
}
