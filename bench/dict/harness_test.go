package dict

import (
	"context"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/actors/xfer/xfertest"
	"github.com/kvxfer/kvxfer/internal/clock"
	"github.com/kvxfer/kvxfer/kv"
)

// harness is one dict engine over an xfertest pool, a notice log and a fake clock.
type harness struct {
	t     *testing.T
	e     *Engine
	g     *xfertest.Pool
	n     *xfertest.Notices
	clk   *clock.Fake
	hooks *Hooks
}

func newHarness(t *testing.T, v Variant, mod func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, g: xfertest.New(), n: &xfertest.Notices{}, clk: clock.NewFake(time.Unix(1000, 0)), hooks: &Hooks{}}
	cfg := Config{Variant: v, Transfers: h.g, Notifier: h.n, Clock: h.clk, Hooks: h.hooks}
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.e = e
	t.Cleanup(func() {
		h.g.ReleaseAll()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return h
}

// both runs fn against each variant.
func both(t *testing.T, fn func(t *testing.T, h *harness)) {
	for _, v := range []Variant{Upstream, Fixed} {
		t.Run(v.String(), func(t *testing.T) { fn(t, newHarness(t, v, nil)) })
	}
}

var epA = kv.Endpoint{IP: "10.0.0.1", Port: 7001}
var epB = kv.Endpoint{IP: "10.0.0.2", Port: 7002}

func ti(agent string, from kv.Endpoint, n, required int) room.TransferInfo {
	ps := make([]int32, n)
	for i := range ps {
		ps[i] = int32(100 + i)
	}
	return room.TransferInfo{Agent: agent, From: from, DstPages: ps, DstAux: 3, Required: required}
}

func (h *harness) poll(id uint64) kv.Reply { return h.e.Poll([]uint64{id}, nil)[0] }

func (h *harness) want(id uint64, st kv.Status) kv.Reply {
	h.t.Helper()
	r := h.poll(id)
	if r.Status != st {
		h.t.Fatalf("room %d polls %v (%v), want %v", id, r.Status, r.Reason, st)
	}
	return r
}

// ready opens a room and delivers one transfer info (n pages, required 1).
func (h *harness) ready(id uint64, n int) {
	h.e.Open(id)
	h.e.TransferInfo(id, ti("a", epA, n, 1))
	h.e.SettleBootstrap()
}

func (h *harness) leaks() Leaks { return h.e.Leaks() }
