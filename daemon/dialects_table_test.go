package daemon

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/wire"
)

func tableReg(agent string, port int) *wire.Registration {
	return &wire.Registration{AgentName: agent, DecodeIP: "10.0.0.1", DecodePort: port, Frames: 23}
}

// Hostile registrations cannot grow the table: rejected agents past
// maxRejectedEntries and dropped ones past maxDroppedEntries are forgotten,
// oldest first, also when a record was replaced by a changed copy (upgraded
// by an ABORT's generation, then dropped).
func TestDialectTableBounded(t *testing.T) {
	tb := newDialects(wire.DialectUnknown, wire.Dialect0520)
	defer tb.close()
	for i := range maxRejectedEntries + 100 {
		tb.reject(tableReg(fmt.Sprintf("bad-%d", i), 20000+i), errors.New("no"))
	}
	if tb.rejection("bad-0") != "" || tb.known(kv.Endpoint{IP: "10.0.0.1", Port: 20000}) {
		t.Fatal("the oldest rejected agent is still listed")
	}
	if tb.rejection(fmt.Sprintf("bad-%d", maxRejectedEntries+99)) == "" {
		t.Fatal("the newest rejected agent is not listed")
	}
	for i := range maxDroppedEntries + 50 {
		a, at := fmt.Sprintf("ok-%d", i), kv.Endpoint{IP: "10.0.0.1", Port: 30000 + i}
		if _, err := tb.register(tableReg(a, at.Port)); err != nil {
			t.Fatal(err)
		}
		tb.sawGeneration(at)
		if tb.at(at) != wire.Dialect0522 {
			t.Fatalf("%s: dialect %v after a generation, want 0.5.22", a, tb.at(at))
		}
		if to, ok := tb.drop(a, "gone", true); !ok || to != at {
			t.Fatalf("drop %s: %v %v", a, to, ok)
		}
		if _, ok := tb.drop(a, "again", false); ok {
			t.Fatal("dropped twice")
		}
	}
	by, rejected := tb.counts()
	if len(tb.list()) != maxRejectedEntries+maxDroppedEntries || rejected != maxRejectedEntries || len(by) != 0 {
		t.Fatalf("%d listed (%d rejected, %v accepted), want %d rejected and %d dropped",
			len(tb.list()), rejected, by, maxRejectedEntries, maxDroppedEntries)
	}
}

// Readers never wait on the writers and never see a record change: a table
// read while agents register, upgrade and drop is whole (the race detector
// checks the rest).
func TestDialectTableReadersWhileWriting(t *testing.T) {
	tb := newDialects(wire.DialectUnknown, wire.Dialect0520)
	defer tb.close()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				a, port := fmt.Sprintf("w%d-%d", w, i), 40000+w*1000+i
				_, _ = tb.register(tableReg(a, port))
				tb.sawGeneration(kv.Endpoint{IP: "10.0.0.1", Port: port})
				if tb.acceptedAt(kv.Endpoint{IP: "10.0.0.1", Port: port}) != a {
					t.Errorf("%s not accepted at its endpoint after registering", a)
				}
				tb.drop(a, "gone", false)
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2000 {
			for _, p := range tb.list() {
				if p.Dropped == "" && p.Release != p.Dialect.String() {
					t.Errorf("%s: release %q, dialect %v", p.Agent, p.Release, p.Dialect)
				}
			}
			tb.counts()
		}
	}()
	wg.Wait()
	<-done
	if by, _ := tb.counts(); len(by) != 0 {
		t.Fatalf("accepted after every drop: %v", by)
	}
}
