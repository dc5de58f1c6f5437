package xfer_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// notifSpy records each SendNotifs call instead of sending; the first call
// waits for gate, and agent "bad" is refused.
type notifSpy struct {
	*loopback.Agent
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	calls   []string // "agent:msg,msg,…"
}

func (s *notifSpy) SendNotifs(agent string, msgs [][]byte) error {
	s.once.Do(func() {
		close(s.entered)
		<-s.gate
	})
	parts := make([]string, len(msgs))
	for i, m := range msgs {
		parts[i] = string(m)
	}
	s.mu.Lock()
	s.calls = append(s.calls, fmt.Sprintf("%s:%v", agent, parts))
	s.mu.Unlock()
	if agent == "bad" {
		return nixl.Errorf(nixl.ErrPeerUnknown, "spy: %q", agent)
	}
	return nil
}

func (s *notifSpy) recorded() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// Rooms' completion notifications (Pool.Signal) that queue while the worker
// is busy go out one call per agent, each agent's messages in the order the
// rooms signalled; a call that fails fails exactly the rooms it carried.
func TestSignalsGoOutOneCallPerAgent(t *testing.T) {
	pre := nodeWith(t, "prefill", 3, loopback.Options{})
	spy := &notifSpy{Agent: pre.Agent, entered: make(chan struct{}), gate: make(chan struct{})}
	type failure struct {
		room  uint64
		agent string
		err   error
	}
	var mu sync.Mutex
	var failed []failure
	pool, err := xfer.New(xfer.Config{Agent: spy, Local: &pre.Geo, Actors: 1,
		SignalFailed: func(room uint64, agent string, err error) {
			mu.Lock()
			failed = append(failed, failure{room, agent, err})
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	msg := func(room uint64, k int) []byte { return fmt.Appendf(nil, "r%d.%d", room, k) }

	pool.Signal(1, "a", [][]byte{msg(1, 0)})
	select { // the worker holds room 1's call: the rest queue behind it
	case <-spy.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("room 1's notification never sent")
	}
	agents := map[uint64]string{2: "a", 3: "b", 4: "a", 5: "bad", 6: "b", 7: "a", 8: "bad"}
	for room := uint64(2); room <= 8; room++ {
		pool.Signal(room, agents[room], [][]byte{msg(room, 0), msg(room, 1)})
	}
	close(spy.gate)
	testrig.Eventually(t, 20*time.Second, "four calls", func() bool { return len(spy.recorded()) == 4 })
	want := []string{
		"a:[r1.0]",
		"a:[r2.0 r2.1 r4.0 r4.1 r7.0 r7.1]",
		"b:[r3.0 r3.1 r6.0 r6.1]",
		"bad:[r5.0 r5.1 r8.0 r8.1]",
	}
	if got := spy.recorded(); !slices.Equal(got, want) {
		t.Fatalf("calls:\n%v\nwant\n%v", got, want)
	}
	if err := pool.Barrier(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failed) != 2 || failed[0].room != 5 || failed[1].room != 8 ||
		failed[0].agent != "bad" || !errors.Is(failed[0].err, nixl.ErrPeerUnknown) {
		t.Fatalf("failed signals: %+v", failed)
	}
	if got := spy.recorded(); len(got) != 4 {
		t.Fatalf("more calls after the batch: %v", got)
	}
}

// Signals queued to a worker when the pool closes are still sent: a stop
// would otherwise overtake them (protoactor handles it before queued
// messages), and decode would never hear that those rooms completed.
func TestSignalsQueuedAtCloseAreSent(t *testing.T) {
	pre := nodeWith(t, "prefill", 3, loopback.Options{})
	spy := &notifSpy{Agent: pre.Agent, entered: make(chan struct{}), gate: make(chan struct{})}
	pool, err := xfer.New(xfer.Config{Agent: spy, Local: &pre.Geo, Actors: 1})
	if err != nil {
		t.Fatal(err)
	}
	pool.Signal(1, "a", [][]byte{[]byte("r1")})
	select {
	case <-spy.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("room 1's notification never sent")
	}
	for room := uint64(2); room <= 4; room++ {
		pool.Signal(room, "a", [][]byte{fmt.Appendf(nil, "r%d", room)})
	}
	closed := make(chan struct{})
	go func() {
		pool.Close()
		close(closed)
	}()
	close(spy.gate)
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close never returned")
	}
	want := []string{"a:[r1]", "a:[r2 r3 r4]"}
	if got := spy.recorded(); !slices.Equal(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
}
