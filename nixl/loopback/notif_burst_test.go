package loopback_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// TestNotifBurstArrivesInOrder: bursts far deeper than a datagram queue (10
// by default, net.unix.max_dgram_qlen) from several senders, one
// notification at a time and in batches (SendNotifs), all arrive, each
// sender's in order, while the receiver drains slowly; a full queue makes a
// sender wait, never drop.
func TestNotifBurstArrivesInOrder(t *testing.T) {
	dst := newAgent(t)
	md, err := dst.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	const senders, each = 3, 600
	var srcs []*loopback.Agent
	for range senders {
		a := newAgent(t)
		if _, err := a.LoadPeer(md); err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, a)
	}
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for _, a := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; {
				if i%3 == 0 { // a batch of 1..5
					var msgs [][]byte
					for k := 0; k < 1+i%5 && i < each; k++ {
						msgs = append(msgs, fmt.Appendf(nil, "%d", i))
						i++
					}
					if err := a.SendNotifs(dst.Name(), msgs); err != nil {
						errs <- err
						return
					}
					continue
				}
				if err := a.SendNotif(dst.Name(), fmt.Appendf(nil, "%d", i)); err != nil {
					errs <- err
					return
				}
				i++
			}
		}()
	}
	next := map[string]int{}
	var got []nixl.Notif
	deadline := time.Now().Add(60 * time.Second)
	for total := 0; total < senders*each; {
		time.Sleep(time.Millisecond) // a slow reader: the queue fills
		if got, err = dst.Notifs(got[:0]); err != nil {
			t.Fatal(err)
		}
		for _, n := range got {
			if want := fmt.Sprint(next[n.Peer]); n.Msg != want {
				t.Fatalf("from %s: %q, want %q", n.Peer, n.Msg, want)
			}
			next[n.Peer]++
			total++
		}
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d notifications after 60 s: %v", total, senders*each, next)
		}
	}
	wg.Wait()
	for _, a := range srcs {
		if next[a.Name()] != each {
			t.Errorf("%s: %d of %d", a.Name(), next[a.Name()], each)
		}
	}
}

// TestOnNotifWakesAfterArrival: OnNotif's wake-up comes after notifications
// arrived, and Notifs then returns them (a poller waits for it instead of a
// timer); none comes after stop.
func TestOnNotifWakesAfterArrival(t *testing.T) {
	dst, src := newAgent(t), newAgent(t)
	md, err := dst.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.LoadPeer(md); err != nil {
		t.Fatal(err)
	}
	woken := make(chan struct{}, 1)
	stop := dst.OnNotif(func() {
		select {
		case woken <- struct{}{}:
		default:
		}
	})
	for i := range 50 {
		if err := src.SendNotifs(dst.Name(), [][]byte{fmt.Appendf(nil, "%d_kv", i), fmt.Appendf(nil, "%d_aux", i)}); err != nil {
			t.Fatal(err)
		}
		var got []nixl.Notif
		for len(got) < 2 {
			select {
			case <-woken:
			case <-time.After(30 * time.Second):
				t.Fatalf("round %d: no wake-up (%d notifications)", i, len(got))
			}
			if got, err = dst.Notifs(got); err != nil {
				t.Fatal(err)
			}
		}
		if len(got) != 2 || got[0].Msg != fmt.Sprintf("%d_kv", i) || got[1].Msg != fmt.Sprintf("%d_aux", i) {
			t.Fatalf("round %d: %+v", i, got)
		}
	}
	stop()
	select {
	case <-woken:
	default:
	}
	if err := src.SendNotif(dst.Name(), []byte("late")); err != nil {
		t.Fatal(err)
	}
	testrig.Eventually(t, 20*time.Second, "the late notification delivered", func() bool {
		ns, err := dst.Notifs(nil)
		if err != nil {
			t.Fatal(err)
		}
		return len(ns) > 0
	})
	select {
	case <-woken:
		t.Fatal("woken after stop")
	default:
	}
}
