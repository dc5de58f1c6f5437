package loopback

import (
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

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
	addr := &net.UnixAddr{Name: filepath.Join(t.TempDir(), "stuck.sock"), Net: "unixgram"}
	sink, err := net.ListenUnixgram("unixgram", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
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
