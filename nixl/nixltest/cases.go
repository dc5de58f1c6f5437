package nixltest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
)

const page = 4096

func testMetadata(t *testing.T, p Pair) {
	newSide(t, p, p.B, 2, page)
	peer := connect(t, p.A, p.B)
	md, _ := p.B.LocalMetadata()
	if again, err := p.A.LoadPeer(md); err != nil || again != peer {
		t.Fatalf("reloading the same metadata: %q, %v", again, err)
	}
	if _, err := p.A.LoadPeer([]byte("not metadata")); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("garbage metadata: %v, want ErrInvalid", err)
	}
	if _, err := p.A.Prep("no-such-peer", nixl.DRAM, []nixl.Desc{{Addr: 4096, Len: 1}}); !errors.Is(err, nixl.ErrPeerUnknown) {
		t.Fatalf("Prep for unknown peer: %v, want ErrPeerUnknown", err)
	}
	if err := p.A.DropPeer("no-such-peer"); !errors.Is(err, nixl.ErrPeerUnknown) {
		t.Fatalf("DropPeer unknown: %v", err)
	}
}

// testPreppedWrite moves pages by index, with runs that merge and runs that do
// not, and checks every byte plus the notification.
func testPreppedWrite(t *testing.T, p Pair) {
	src, dst := newSide(t, p, p.A, 16, page), newSide(t, p, p.B, 16, page)
	peer := connect(t, p.A, p.B)
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	si, di := idx(0, 1, 2, 3, 9, 5, 15), idx(4, 5, 6, 7, 0, 12, 1)
	for i, s := range si {
		src.fill(int(s), byte(i+1))
	}
	x, err := p.A.Make(nixl.Write, l, si, r, di, []byte("pw"))
	if err != nil {
		t.Fatalf("Make: %v", err)
	}
	post(t, p.A, x)
	mustDone(t, p.A, x)
	for i, s := range si {
		copy(src.pageBytes(int(s)), make([]byte, page)) // the source may be reused now
		dst.check(t, int(di[i]), byte(i+1)^byte(s*31)^byte(di[i]*31))
	}
	mustMsg(t, waitNotifs(t, p.B, 1), p.A.Name(), "pw")
	release(t, p.A, x)
	if untouched := dst.pageBytes(2); untouched[0] != 0 || untouched[page-1] != 0 {
		t.Fatal("a page outside the index list was written")
	}
}

func testPreppedRead(t *testing.T, p Pair) {
	loc, rem := newSide(t, p, p.A, 4, page), newSide(t, p, p.B, 4, page)
	peer := connect(t, p.A, p.B)
	rem.fill(3, 9)
	l, r := prep(t, p.A, "", loc.descs), prep(t, p.A, peer, rem.descs)
	x, err := p.A.Make(nixl.Read, l, idx(0), r, idx(3), []byte("rd"))
	if err != nil {
		t.Fatalf("Make READ: %v", err)
	}
	post(t, p.A, x)
	mustDone(t, p.A, x)
	loc.check(t, 0, 9^byte(3*31))
	mustMsg(t, waitNotifs(t, p.B, 1), p.A.Name(), "rd")
	release(t, p.A, x)
}

// testCreateWrite uses explicit descriptors of mixed sizes, the aux/state path.
func testCreateWrite(t *testing.T, p Pair) {
	src, dst := newSide(t, p, p.A, 4, page), newSide(t, p, p.B, 4, page)
	peer := connect(t, p.A, p.B)
	for i := range 4 {
		src.fill(i, 0x5a)
	}
	ls := []nixl.Desc{nixl.DescOf(src.mem[100:300], 0), nixl.DescOf(src.mem[page:3*page], 0)}
	rs := []nixl.Desc{nixl.DescOf(dst.mem[3*page+8:3*page+208], 0), nixl.DescOf(dst.mem[0:2*page], 0)}
	x, err := p.A.Create(nixl.Write, nixl.DRAM, ls, peer, nixl.DRAM, rs, nil)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	post(t, p.A, x)
	mustDone(t, p.A, x)
	if string(dst.mem[3*page+8:3*page+208]) != string(src.mem[100:300]) || string(dst.mem[:2*page]) != string(src.mem[page:3*page]) {
		t.Fatal("Create WRITE bytes differ")
	}
	if dst.mem[3*page+7] != 0 || dst.mem[3*page+208] != 0 {
		t.Fatal("Create WRITE touched bytes next to the descriptor")
	}
	release(t, p.A, x)
}

// testNotifAfterBytes checks, for many requests in flight at once, that when a
// notification is seen the bytes of that request are already in place.
func testNotifAfterBytes(t *testing.T, p Pair) {
	const n = 32
	src, dst := newSide(t, p, p.A, n, page), newSide(t, p, p.B, n, page)
	peer := connect(t, p.A, p.B)
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	xs := make([]nixl.XferID, n)
	for i := range n {
		src.fill(i, 0x33)
		x, err := p.A.Make(nixl.Write, l, idx(i), r, idx(i), []byte(label(i)))
		if err != nil {
			t.Fatalf("Make: %v", err)
		}
		xs[i] = x
	}
	for _, x := range xs {
		post(t, p.A, x)
	}
	seen := map[string]bool{}
	deadline := time.Now().Add(Timeout)
	var buf []nixl.Notif
	for spin := 0; len(seen) < n; spin++ {
		buf, _ = p.B.Notifs(buf[:0])
		for _, nf := range buf {
			var i int
			for i = 0; i < n && label(i) != nf.Msg; i++ {
			}
			if i == n || seen[nf.Msg] {
				t.Fatalf("unexpected notification %v", nf)
			}
			seen[nf.Msg] = true
			dst.check(t, i, 0x33) // bytes must be there already
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d of %d notifications", len(seen), n)
		}
		backoff(spin)
	}
	for _, x := range xs {
		mustDone(t, p.A, x)
		release(t, p.A, x)
	}
}

func testBatchedPoll(t *testing.T, p Pair) {
	const n = 24
	src, dst := newSide(t, p, p.A, n, page), newSide(t, p, p.B, n, page)
	peer := connect(t, p.A, p.B)
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	xs := make([]nixl.XferID, n)
	for i := range n {
		src.fill(i, 7)
		xs[i], _ = p.A.Make(nixl.Write, l, idx(i), r, idx(n-1-i), nil)
	}
	st := make([]nixl.Status, n)
	if err := p.A.Poll(xs, st); err != nil {
		t.Fatalf("Poll: %v", err)
	}
	for i := range st {
		if st[i].State != nixl.Idle {
			t.Fatalf("unposted request reports %v", st[i].State)
		}
	}
	for _, x := range xs {
		post(t, p.A, x)
	}
	deadline := time.Now().Add(Timeout)
	for spin := 0; ; spin++ {
		if err := p.A.Poll(xs, st); err != nil {
			t.Fatalf("Poll: %v", err)
		}
		done := 0
		for i := range st {
			switch st[i].State {
			case nixl.Done:
				done++
			case nixl.Failed:
				t.Fatalf("request %d failed: %v", i, st[i].Err)
			}
		}
		if done == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d done", done, n)
		}
		backoff(spin)
	}
	for i := range n {
		dst.check(t, n-1-i, 7^byte(i*31)^byte((n-1-i)*31))
		release(t, p.A, xs[i])
	}
	if err := p.A.Poll(xs[:1], st[:0]); !errors.Is(err, nixl.ErrInvalid) {
		t.Fatalf("Poll with a short out slice: %v", err)
	}
}

// testRepost: a finished request may be posted again and moves the bytes again.
func testRepost(t *testing.T, p Pair) {
	src, dst := newSide(t, p, p.A, 1, page), newSide(t, p, p.B, 1, page)
	peer := connect(t, p.A, p.B)
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	x, _ := p.A.Make(nixl.Write, l, idx(0), r, idx(0), []byte("again"))
	for round := range 3 {
		src.fill(0, byte(round+1))
		post(t, p.A, x)
		mustDone(t, p.A, x)
		dst.check(t, 0, byte(round+1))
		mustMsg(t, waitNotifs(t, p.B, 1), p.A.Name(), "again")
	}
	release(t, p.A, x)
}

func testSendNotif(t *testing.T, p Pair) {
	newSide(t, p, p.B, 1, page)
	peer := connect(t, p.A, p.B)
	if err := p.A.SendNotif(peer, []byte("hi")); err != nil {
		t.Fatalf("SendNotif: %v", err)
	}
	if err := p.A.SendNotif(peer, []byte{}); err != nil {
		t.Fatalf("SendNotif empty: %v", err)
	}
	got := waitNotifs(t, p.B, 2)
	mustMsg(t, got, p.A.Name(), "hi")
	mustMsg(t, got, p.A.Name(), "")
	if err := p.A.SendNotif("nobody", []byte("x")); !errors.Is(err, nixl.ErrPeerUnknown) {
		t.Fatalf("SendNotif to unknown peer: %v", err)
	}
}

// testSendNotifs: nixl.SendNotifs (one call where the agent batches them)
// delivers every message, and names an unknown peer's error.
func testSendNotifs(t *testing.T, p Pair) {
	newSide(t, p, p.B, 1, page)
	peer := connect(t, p.A, p.B)
	msgs := [][]byte{[]byte("one"), {}, []byte("three")}
	if err := nixl.SendNotifs(p.A, peer, msgs); err != nil {
		t.Fatalf("SendNotifs: %v", err)
	}
	got := waitNotifs(t, p.B, len(msgs))
	for _, m := range msgs {
		mustMsg(t, got, p.A.Name(), string(m))
	}
	if err := nixl.SendNotifs(p.A, peer, nil); err != nil {
		t.Fatalf("SendNotifs of nothing: %v", err)
	}
	if err := nixl.SendNotifs(p.A, "nobody", msgs); !errors.Is(err, nixl.ErrPeerUnknown) {
		t.Fatalf("SendNotifs to unknown peer: %v", err)
	}
}

func testMisuseDescriptors(t *testing.T, p Pair) {
	src, dst := newSide(t, p, p.A, 2, page), newSide(t, p, p.B, 2, page)
	peer := connect(t, p.A, p.B)
	over := nixl.Desc{Addr: src.descs[1].Addr + 1, Len: page, DevID: 0}
	_, err := p.A.Prep("", nixl.DRAM, []nixl.Desc{src.descs[0], over})
	wantErr(t, err, nixl.ErrInvalid, "local Prep past the region end")
	_, err = p.A.Prep(peer, nixl.DRAM, []nixl.Desc{{Addr: dst.descs[0].Addr - 1, Len: 2}})
	wantErr(t, err, nixl.ErrInvalid, "remote Prep before the region start")
	_, err = p.A.Prep(peer, nixl.VRAM, dst.descs)
	wantErr(t, err, nixl.ErrInvalid, "remote Prep with the wrong memory kind")
	_, err = p.A.Prep("", nixl.DRAM, []nixl.Desc{{Addr: src.descs[0].Addr, Len: page, DevID: 3}})
	wantErr(t, err, nixl.ErrInvalid, "local Prep with the wrong device")
	_, err = p.A.Prep(peer, nixl.DRAM, []nixl.Desc{src.descs[0]})
	wantErr(t, err, nixl.ErrInvalid, "remote Prep of local memory")
	_, err = p.A.Create(nixl.Write, nixl.DRAM, src.descs[:1], peer, nixl.DRAM, []nixl.Desc{over}, nil)
	wantErr(t, err, nixl.ErrInvalid, "Create outside the remote region")
	_, err = p.A.Create(nixl.Write, nixl.DRAM, []nixl.Desc{{Addr: src.descs[0].Addr, Len: 8}}, peer, nixl.DRAM, []nixl.Desc{{Addr: dst.descs[0].Addr, Len: 16}}, nil)
	wantErr(t, err, nixl.ErrInvalid, "Create with unequal lengths")
	_, err = p.A.Create(nixl.Write, nixl.DRAM, src.descs, peer, nixl.DRAM, dst.descs[:1], nil)
	wantErr(t, err, nixl.ErrInvalid, "Create with unequal counts")
	_, err = p.A.Create(nixl.Write, nixl.DRAM, src.descs, "nobody", nixl.DRAM, dst.descs, nil)
	wantErr(t, err, nixl.ErrPeerUnknown, "Create for an unknown peer")
	// Unequal lengths through prepared lists.
	l := prep(t, p.A, "", []nixl.Desc{{Addr: src.descs[0].Addr, Len: 64}})
	r := prep(t, p.A, peer, []nixl.Desc{{Addr: dst.descs[0].Addr, Len: 128}})
	_, err = p.A.Make(nixl.Write, l, idx(0), r, idx(0), nil)
	wantErr(t, err, nixl.ErrInvalid, "Make with unequal descriptor lengths")
	// Nothing above may have written anything.
	for _, b := range dst.mem {
		if b != 0 {
			t.Fatal("a rejected request wrote bytes")
		}
	}
}

func testMisuseIndices(t *testing.T, p Pair) {
	src, dst := newSide(t, p, p.A, 4, page), newSide(t, p, p.B, 4, page)
	peer := connect(t, p.A, p.B)
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	for _, c := range []struct {
		name   string
		li, ri []int32
	}{
		{"local index past the end", idx(4), idx(0)},
		{"remote index past the end", idx(0), idx(4)},
		{"negative index", idx(-1), idx(0)},
		{"unequal counts", idx(0, 1), idx(0)},
		{"empty", nil, nil},
	} {
		_, err := p.A.Make(nixl.Write, l, c.li, r, c.ri, nil)
		wantErr(t, err, nixl.ErrInvalid, c.name)
	}
	_, err := p.A.Make(nixl.Write, r, idx(0), l, idx(0), nil)
	wantErr(t, err, nixl.ErrInvalid, "Make with the sides swapped")
	_, err = p.A.Make(nixl.Write, l, idx(0), nixl.ListID(1<<40), idx(0), nil)
	wantErr(t, err, nixl.ErrInvalid, "Make with an unknown list")
	if err := p.A.ReleaseList(l); err != nil {
		t.Fatalf("ReleaseList: %v", err)
	}
	_, err = p.A.Make(nixl.Write, l, idx(0), r, idx(0), nil)
	wantErr(t, err, nixl.ErrInvalid, "Make with a released list")
	wantErr(t, p.A.ReleaseList(l), nixl.ErrInvalid, "ReleaseList twice")
}

func testMisuseHandles(t *testing.T, p Pair) {
	src, dst := newSide(t, p, p.A, 1, page), newSide(t, p, p.B, 1, page)
	peer := connect(t, p.A, p.B)
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	x, _ := p.A.Make(nixl.Write, l, idx(0), r, idx(0), nil)
	release(t, p.A, x) // never posted: releasable
	wantErr(t, p.A.Release(x), nixl.ErrInvalid, "Release twice")
	_, err := p.A.Post(x)
	wantErr(t, err, nixl.ErrInvalid, "Post after Release")
	st := make([]nixl.Status, 1)
	if err := p.A.Poll([]nixl.XferID{x}, st); err != nil || st[0].State != nixl.Failed || !errors.Is(st[0].Err, nixl.ErrInvalid) {
		t.Fatalf("Poll of a released request: %v %v", st[0], err)
	}
	wantErr(t, p.A.Deregister(nixl.RegID(1<<40)), nixl.ErrInvalid, "Deregister unknown")
}

func testDropPeer(t *testing.T, p Pair) {
	src, dst := newSide(t, p, p.A, 1, page), newSide(t, p, p.B, 1, page)
	peer := connect(t, p.A, p.B)
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	x, _ := p.A.Make(nixl.Write, l, idx(0), r, idx(0), nil)
	if err := p.A.DropPeer(peer); err != nil {
		t.Fatalf("DropPeer: %v", err)
	}
	_, err := p.A.Post(x)
	wantErr(t, err, nixl.ErrPeerUnknown, "Post to a dropped peer")
	_, err = p.A.Make(nixl.Write, l, idx(0), r, idx(0), nil)
	wantErr(t, err, nixl.ErrPeerUnknown, "Make with a stale remote list")
	release(t, p.A, x)
	// Reload and rebuild: works again.
	connect(t, p.A, p.B)
	r2 := prep(t, p.A, peer, dst.descs)
	src.fill(0, 4)
	x2, err := p.A.Make(nixl.Write, l, idx(0), r2, idx(0), nil)
	if err != nil {
		t.Fatalf("Make after reload: %v", err)
	}
	post(t, p.A, x2)
	mustDone(t, p.A, x2)
	dst.check(t, 0, 4)
	release(t, p.A, x2)
}

// testConcurrent makes, posts, polls and releases from several goroutines.
func testConcurrent(t *testing.T, p Pair) {
	const workers, per = 4, 16
	src, dst := newSide(t, p, p.A, workers*per, page), newSide(t, p, p.B, workers*per, page)
	peer := connect(t, p.A, p.B)
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	for i := range workers * per {
		src.fill(i, 0x11)
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range per {
				i := w*per + k
				x, err := p.A.Make(nixl.Write, l, idx(i), r, idx(i), nil)
				if err == nil {
					_, err = p.A.Post(x)
				}
				if err != nil {
					errs <- err
					return
				}
				st := make([]nixl.Status, 1)
				for spin := 0; ; spin++ {
					if err := p.A.Poll([]nixl.XferID{x}, st); err != nil {
						errs <- err
						return
					}
					if st[0].State != nixl.InProgress {
						break
					}
					backoff(spin)
				}
				if st[0].State != nixl.Done {
					errs <- st[0].Err
					return
				}
				if err := p.A.Release(x); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range workers * per {
		dst.check(t, i, 0x11)
	}
}

func needInject(t *testing.T, p Pair) {
	if p.Inject == nil {
		t.Skip("backend has no fault injection")
	}
}

func testFaultLatency(t *testing.T, p Pair) {
	needInject(t, p)
	src, dst := newSide(t, p, p.A, 1, page), newSide(t, p, p.B, 1, page)
	peer := connect(t, p.A, p.B)
	const lat = 60 * time.Millisecond
	p.Inject(p.A, peer, Fault{Latency: lat})
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	src.fill(0, 2)
	x, _ := p.A.Make(nixl.Write, l, idx(0), r, idx(0), []byte("late"))
	start := time.Now()
	post(t, p.A, x)
	mustDone(t, p.A, x)
	if el := time.Since(start); el < lat {
		t.Fatalf("request with %v latency finished after %v", lat, el)
	}
	dst.check(t, 0, 2)
	mustMsg(t, waitNotifs(t, p.B, 1), p.A.Name(), "late")
	release(t, p.A, x)
}

func testFaultFail(t *testing.T, p Pair) {
	needInject(t, p)
	src, dst := newSide(t, p, p.A, 1, page), newSide(t, p, p.B, 1, page)
	peer := connect(t, p.A, p.B)
	p.Inject(p.A, peer, Fault{Fail: true})
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	x, _ := p.A.Make(nixl.Write, l, idx(0), r, idx(0), []byte("failed"))
	post(t, p.A, x)
	st := waitTerminal(t, p.A, x)
	if st.State != nixl.Failed || !errors.Is(st.Err, nixl.ErrBackend) {
		t.Fatalf("injected failure ended %v: %v", st.State, st.Err)
	}
	release(t, p.A, x)
	p.Inject(p.A, peer, Fault{})
	if err := p.A.SendNotif(peer, []byte("marker")); err != nil {
		t.Fatal(err)
	}
	if got := waitNotifs(t, p.B, 1); len(got) != 1 || got[0].Msg != "marker" {
		t.Fatalf("a failed request delivered a notification: %v", got)
	}
}

func testFaultHang(t *testing.T, p Pair) {
	needInject(t, p)
	src, dst := newSide(t, p, p.A, 1, page), newSide(t, p, p.B, 1, page)
	peer := connect(t, p.A, p.B)
	p.Inject(p.A, peer, Fault{Hang: true})
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	x, _ := p.A.Make(nixl.Write, l, idx(0), r, idx(0), []byte("never"))
	post(t, p.A, x)
	st := make([]nixl.Status, 1)
	for range 100 {
		if err := p.A.Poll([]nixl.XferID{x}, st); err != nil || st[0].State != nixl.InProgress {
			t.Fatalf("hung request reports %v, %v", st[0], err)
		}
		backoff(0)
	}
	wantErr(t, p.A.Release(x), nixl.ErrRequestActive, "Release of a hung request")
	_, err := p.A.Post(x)
	wantErr(t, err, nixl.ErrRequestActive, "re-Post of a hung request")
	// A disconnect settles it; only then may it be released.
	p.Inject(p.A, peer, Fault{Disconnect: true})
	if s := waitTerminal(t, p.A, x); s.State != nixl.Failed || !errors.Is(s.Err, nixl.ErrRemoteDisconnect) {
		t.Fatalf("hung request after disconnect: %v %v", s.State, s.Err)
	}
	release(t, p.A, x)
}

func testFaultDisconnect(t *testing.T, p Pair) {
	needInject(t, p)
	src, dst := newSide(t, p, p.A, 2, page), newSide(t, p, p.B, 2, page)
	peer := connect(t, p.A, p.B)
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	p.Inject(p.A, peer, Fault{Latency: time.Hour})
	inflight, _ := p.A.Make(nixl.Write, l, idx(0), r, idx(0), []byte("a"))
	post(t, p.A, inflight)
	p.Inject(p.A, peer, Fault{Disconnect: true})
	if s := waitTerminal(t, p.A, inflight); s.State != nixl.Failed || !errors.Is(s.Err, nixl.ErrRemoteDisconnect) {
		t.Fatalf("in-flight request after disconnect: %v %v", s.State, s.Err)
	}
	x, _ := p.A.Make(nixl.Write, l, idx(1), r, idx(1), []byte("b"))
	st, err := p.A.Post(x)
	wantErr(t, err, nixl.ErrRemoteDisconnect, "Post after disconnect")
	if st != nixl.Failed {
		t.Fatalf("Post after disconnect returned state %v", st)
	}
	wantErr(t, p.A.SendNotif(peer, []byte("c")), nixl.ErrRemoteDisconnect, "SendNotif after disconnect")
	release(t, p.A, inflight)
	release(t, p.A, x)
	// Clearing the fault and reloading the peer recovers.
	p.Inject(p.A, peer, Fault{})
	if err := p.A.DropPeer(peer); err != nil {
		t.Fatal(err)
	}
	connect(t, p.A, p.B)
	r2 := prep(t, p.A, peer, dst.descs)
	src.fill(1, 8)
	x2, _ := p.A.Make(nixl.Write, l, idx(1), r2, idx(1), nil)
	post(t, p.A, x2)
	mustDone(t, p.A, x2)
	dst.check(t, 1, 8)
	release(t, p.A, x2)
}

func testClose(t *testing.T, p Pair) {
	src, dst := newSide(t, p, p.A, 1, page), newSide(t, p, p.B, 1, page)
	peer := connect(t, p.A, p.B)
	l, r := prep(t, p.A, "", src.descs), prep(t, p.A, peer, dst.descs)
	if p.Inject != nil {
		p.Inject(p.A, peer, Fault{Hang: true})
	}
	x, _ := p.A.Make(nixl.Write, l, idx(0), r, idx(0), nil)
	post(t, p.A, x)
	if err := p.A.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.A.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := p.A.Post(x)
	wantErr(t, err, nixl.ErrClosed, "Post after Close")
	_, err = p.A.LocalMetadata()
	wantErr(t, err, nixl.ErrClosed, "LocalMetadata after Close")
	wantErr(t, p.A.Poll([]nixl.XferID{x}, make([]nixl.Status, 1)), nixl.ErrClosed, "Poll after Close")
}
