package libnixl_test

import (
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// TestInteropPythonDecode: a Python process using NIXL's own API plays SGLang's
// decode side (DRAM buffer, metadata handed over, notifications drained as
// decode does). Go writes two KV chunks by prepared lists, then aux and state by
// explicit descriptors, with the notification strings of sglang-nixl-protocol
// §5.3. Python checks each notification's bytes were there when it arrived,
// and its is_done rule; Go checks the notification set is exactly ours.
func TestInteropPythonDecode(t *testing.T) {
	const (
		page   = 16 << 10
		pages  = 64
		auxOff = pages * page
		auxLen = 64
		stOff  = auxOff + 4096
		stLen  = 1024
		size   = stOff + 4096
		room   = uint64(7340033)
	)
	g := newAgent(t, "go-prefill")
	py := startPeer(t, true, "decode", "--name", "py-decode", "--size", strconv.Itoa(size))
	if py.Len != size {
		t.Fatalf("python buffer %d bytes, want %d", py.Len, size)
	}
	src := alloc(t, g, size)
	if _, err := g.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}); err != nil {
		t.Fatal(err)
	}
	peer, err := g.LoadPeer(py.MD)
	if err != nil || peer != py.Name {
		t.Fatalf("LoadPeer: %q, %v", peer, err)
	}
	var local, remote []nixl.Desc
	for i := range pages {
		local = append(local, nixl.DescOf(src[i*page:(i+1)*page], 0))
		remote = append(remote, nixl.Desc{Addr: py.Addr + uintptr(i*page), Len: page})
	}
	l, err := g.Prep("", nixl.DRAM, local)
	if err != nil {
		t.Fatal(err)
	}
	r, err := g.Prep(peer, nixl.DRAM, remote)
	if err != nil {
		t.Fatal(err)
	}

	sender := sglang.SenderID(1, 2, 1)
	chunks := []struct{ src, dst []int32 }{
		{src: []int32{0, 1, 2, 3, 4, 5, 6, 7}, dst: []int32{10, 11, 12, 13, 14, 15, 16, 17}},
		{src: []int32{8, 9, 10, 11}, dst: []int32{30, 31, 40, 2}},
	}
	expect := map[string][][3]int{}
	var notifs []string
	var xs []nixl.XferID
	for c, ch := range chunks {
		msg := sglang.AppendKVNotif(nil, room, c, c == len(chunks)-1, sender)
		for k, s := range ch.src {
			seed := int(s) + 1
			pattern(src[int(s)*page:(int(s)+1)*page], seed)
			expect[string(msg)] = append(expect[string(msg)], [3]int{int(ch.dst[k]) * page, page, seed})
		}
		notifs = append(notifs, string(msg))
	}
	aux := src[auxOff : auxOff+auxLen]
	pattern(aux, 200)
	binary.LittleEndian.PutUint64(aux, room) // bootstrap_room, as SGLang's aux carries it
	auxMsg := string(sglang.AppendAuxNotif(nil, room))
	stMsg := string(sglang.AppendStateNotif(nil, room, sender, 0))
	pattern(src[stOff:stOff+stLen], 99)
	expect[stMsg] = [][3]int{{stOff, stLen, 99}}
	expect[auxMsg] = nil // checked below, not a pure pattern
	notifs = append(notifs, auxMsg, stMsg)
	py.send(t, map[string]any{"expect": expect, "room_at": []uint64{auxOff, room}})

	for c, ch := range chunks {
		x, err := g.Make(nixl.Write, l, ch.src, r, ch.dst, []byte(notifs[c]))
		if err != nil {
			t.Fatal(err)
		}
		xs = append(xs, x)
	}
	for _, e := range []struct {
		off, n int
		msg    string
	}{{auxOff, auxLen, auxMsg}, {stOff, stLen, stMsg}} {
		x, err := g.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src[e.off:e.off+e.n], 0)},
			peer, nixl.DRAM, []nixl.Desc{{Addr: py.Addr + uintptr(e.off), Len: uint64(e.n)}}, []byte(e.msg))
		if err != nil {
			t.Fatal(err)
		}
		xs = append(xs, x)
	}
	for _, x := range xs {
		if _, err := g.Post(x); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, g, xs...)
	for _, x := range xs {
		if err := g.Release(x); err != nil {
			t.Fatal(err)
		}
	}

	var res struct {
		Notifs [][2]string
		Bad    []any
		Done   bool
	}
	py.read(t, &res)
	var got []string
	for _, n := range res.Notifs {
		if n[0] != g.Name() {
			t.Errorf("notification %q from %q, want %q", n[1], n[0], g.Name())
		}
		got = append(got, n[1])
	}
	slices.Sort(got)
	slices.Sort(notifs)
	if !slices.Equal(got, notifs) {
		t.Fatalf("python got notifications %q, want exactly %q", got, notifs)
	}
	if len(res.Bad) != 0 || !res.Done {
		t.Fatalf("python decode: bad ranges %v (bytes missing when the notification came), is_done=%v", res.Bad, res.Done)
	}
	t.Logf("python decode received %q", got)
}

// TestPeerGone kills a Python peer and checks that NIXL's report of it comes
// back typed: a later post fails with ErrRemoteDisconnect (with RawStatus;
// through the C API alone NIXL 1.5 only says BACKEND), nothing hangs, the
// request can be released, and the peer stays unusable until dropped.
func TestPeerGone(t *testing.T) {
	g := newAgent(t, "go-gone")
	py := startPeer(t, true, "target", "--name", "py-gone", "--size", "65536", "--timeout", "30")
	src := alloc(t, g, 65536)
	if _, err := g.Register(nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}); err != nil {
		t.Fatal(err)
	}
	peer, err := g.LoadPeer(py.MD)
	if err != nil {
		t.Fatal(err)
	}
	x, err := g.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}, peer, nixl.DRAM,
		[]nixl.Desc{{Addr: py.Addr, Len: 65536}}, []byte("alive"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Post(x); err != nil {
		t.Fatal(err)
	}
	waitAll(t, g, x)
	py.cmd.Process.Kill()
	py.cmd.Process.Wait()

	var last error
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		st, err := g.Post(x)
		if err == nil {
			s := make([]nixl.Status, 1)
			for st == nixl.InProgress && time.Now().Before(deadline) {
				if err := g.Poll([]nixl.XferID{x}, s); err != nil {
					t.Fatal(err)
				}
				st, err = s[0].State, s[0].Err
				time.Sleep(time.Millisecond)
			}
			if st == nixl.InProgress {
				t.Fatalf("transfer to a dead peer still in progress after 20s")
			}
		}
		if err != nil {
			last = err
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if last == nil {
		t.Fatal("posts to a killed peer kept succeeding")
	}
	if libnixl.RawStatus() && !errors.Is(last, nixl.ErrRemoteDisconnect) {
		t.Fatalf("post to a killed peer: %v, want ErrRemoteDisconnect", last)
	}
	if !errors.Is(last, nixl.ErrRemoteDisconnect) && !errors.Is(last, nixl.ErrBackend) {
		t.Fatalf("post to a killed peer: %v, want ErrRemoteDisconnect or ErrBackend", last)
	}
	t.Logf("post to a killed peer: %v (raw status: %v)", last, libnixl.RawStatus())
	if err := g.Release(x); err != nil {
		t.Fatalf("Release after failure: %v", err)
	}
	if errors.Is(last, nixl.ErrRemoteDisconnect) {
		if err := g.SendNotif(peer, []byte("x")); !errors.Is(err, nixl.ErrRemoteDisconnect) {
			t.Fatalf("SendNotif to a disconnected peer: %v", err)
		}
		if _, err := g.Create(nixl.Write, nixl.DRAM, []nixl.Desc{nixl.DescOf(src, 0)}, peer, nixl.DRAM,
			[]nixl.Desc{{Addr: py.Addr, Len: 65536}}, nil); !errors.Is(err, nixl.ErrRemoteDisconnect) {
			t.Fatalf("Create for a disconnected peer: %v", err)
		}
	}
	if err := g.DropPeer(peer); err != nil {
		t.Fatalf("DropPeer: %v", err)
	}
}
