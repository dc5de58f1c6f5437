package connguard

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func dialAccept(t *testing.T, ln net.Listener) (client, server net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// closed reports whether the server closed the client's connection (EOF or
// reset); a deadline only guards against a hang.
func closed(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return err != nil
}

func TestGuardPoolsAndEviction(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Wrap(inner, Config{Max: 2, Reserve: 2}).(*Listener)
	defer ln.Close()
	var clients, servers []net.Conn
	for range 5 {
		c, s := dialAccept(t, ln)
		clients = append(clients, c)
		servers = append(servers, s)
	}
	// Main: 0, 1. Reserve: 2, 3, then 4 evicts 2.
	st := ln.stats()
	if st.Main != 2 || st.Reserve != 2 || st.Accepted != 5 || st.Overflowed != 3 || st.Evicted != 1 {
		t.Fatalf("stats %+v", st)
	}
	if !closed(t, clients[2]) {
		t.Fatal("oldest reserve connection not closed")
	}
	for _, i := range []int{0, 1, 3, 4} {
		if closed(t, clients[i]) {
			t.Fatalf("connection %d closed", i)
		}
	}
	// Closing a main connection frees a main slot; the next one goes there.
	servers[0].Close()
	servers[0].Close() // twice: counted once
	c, s := dialAccept(t, ln)
	defer c.Close()
	if st := ln.stats(); st.Main != 2 || st.Reserve != 2 || st.Evicted != 1 {
		t.Fatalf("after close: %+v", st)
	}
	// Closing an evicted connection again changes nothing.
	servers[2].Close()
	servers[3].Close()
	if st := ln.stats(); st.Main != 2 || st.Reserve != 1 {
		t.Fatalf("after reserve close: %+v", st)
	}
	if _, err := io.WriteString(s, "x"); err != nil {
		t.Fatal(err)
	}
	for _, x := range append(clients, servers...) {
		x.Close()
	}
}

func TestWrapUnlimited(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	if Wrap(inner, Config{Max: -1}) != inner || Wrap(inner, Config{}) != inner {
		t.Fatal("Max <= 0 must not wrap")
	}
	if m := DefaultMax(); m < 16 || m > 1024 {
		t.Fatalf("DefaultMax %d", m)
	}
}
