package daemon

import (
	"slices"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/internal/testrig"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/transport/control"

	"github.com/kvxfer/kvxfer/nixl/sglang"
)

// TestSenderIsSGLangsTransferSourceRank: the notification sender id is
// SGLang's transfer_source_rank = pp_rank·tp_size + tp_rank, where tp_size and
// tp_rank span the whole TP group, laid out (cp_rank, attn_tp_rank) with
// attn_tp fastest (runtime_context.derive_attention_ranks). Every rank of a
// layout gets a distinct id, CP ranks included.
func TestSenderIsSGLangsTransferSourceRank(t *testing.T) {
	seen := map[int]Rank{}
	for pp := range 2 {
		for cp := range 2 {
			for tp := range 4 {
				r := Rank{TPSize: 4, TPRank: tp, PPSize: 2, PPRank: pp, CPSize: 2, CPRank: cp, DPSize: 1}
				tpSize, tpRank := 4*2, cp*4+tp // SGLang's tp_size, tp_rank
				if got, want := r.Sender(), pp*tpSize+tpRank; got != want {
					t.Fatalf("%+v: sender %d, want %d", r, got, want)
				}
				if o, dup := seen[r.Sender()]; dup {
					t.Fatalf("%+v and %+v share sender %d", r, o, r.Sender())
				}
				seen[r.Sender()] = r
			}
		}
	}
	if got := (Rank{TPSize: 2, TPRank: 1, PPSize: 2, PPRank: 1}).Sender(); got != 3 {
		t.Fatalf("without CP: %d, want pp·tp + tp = 3", got)
	}
}

func TestDummyCPRank(t *testing.T) {
	for _, c := range []struct {
		r     Rank
		all   bool
		dummy bool
	}{
		{Rank{CPSize: 1}, false, false},
		{Rank{CPSize: 2, CPRank: 0}, false, false},
		{Rank{CPSize: 2, CPRank: 1}, false, true},
		{Rank{CPSize: 2, CPRank: 1}, true, false},
	} {
		d := &Daemon{cfg: Config{Rank: c.r, Topology: Topology{AllCPRanks: c.all}}}
		if d.dummyCP() != c.dummy {
			t.Errorf("%+v all=%v: dummy %v", c.r, c.all, d.dummyCP())
		}
		_, wrapped := d.controlEngine(nil).(cpDummyEngine)
		if wrapped != c.dummy {
			t.Errorf("%+v all=%v: control engine wrapped %v", c.r, c.all, wrapped)
		}
	}
}

func TestParseLayerIDs(t *testing.T) {
	if ids, err := ParseLayerIDs(" 0, 1,2 ,3"); err != nil || !slices.Equal(ids, []int{0, 1, 2, 3}) {
		t.Fatalf("%v %v", ids, err)
	}
	if ids, err := ParseLayerIDs(""); err != nil || ids != nil {
		t.Fatalf("empty: %v %v", ids, err)
	}
	for _, bad := range []string{"1,x", "-1", "1,,2"} {
		if _, err := ParseLayerIDs(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestApplyTopology(t *testing.T) {
	d := &Daemon{cfg: Config{Rank: Rank{TPSize: 2, TPRank: 1, PPSize: 2}, PageSize: 16,
		Topology: Topology{KVHeadNum: 4, TotalKVHeads: 8, StartLayer: 3, KVLayerIDs: []int{3, 4, 3, 4}}}}
	var l sglang.Local
	l.KV.Ptrs = []uint64{1, 2, 3, 4}
	if err := d.applyTopology(&l); err != nil {
		t.Fatal(err)
	}
	if l.TPRank != 1 || l.PageSize != 16 || l.PPSize != 2 || l.StartLayer != 3 || l.KVHeadNum != 4 || l.TotalKVHeads != 8 || !slices.Equal(l.KVLayerIDs, []int{3, 4, 3, 4}) {
		t.Fatalf("%+v", l)
	}
	l.KV.Ptrs = l.KV.Ptrs[:2]
	if err := d.applyTopology(&l); err == nil {
		t.Fatal("4 layer ids for 2 KV buffers accepted")
	}
}

// On SGLang's dummy CP rank every room the scheduler opens succeeds after its
// last chunk with no decode at all, over request/reply and over the
// shared-memory ring (whose records reach the engine as a batch), traced or
// not.
func TestDummyCPRankRoomsSucceedWithoutDecode(t *testing.T) {
	d := startDaemonWith(t, func(c *Config) { c.Rank = Rank{CPSize: 2, CPRank: 1} })
	s := newScheduler(t, d)
	if _, err := s.cli.Open(41, ""); err != nil {
		t.Fatal(err)
	}
	s.cli.Init(41, 2, 0)
	s.cli.Send(41, []int32{0, 1}, nil)
	if rep := s.waitTerminal(t, 41); rep.Status != kv.StatusSuccess {
		t.Fatalf("request/reply room: %v/%v, want Success", rep.Status, rep.Reason)
	}
	sh, err := control.AttachShm(s.cli, control.ShmOptions{RingEntries: 16, Slots: 8, IndexWords: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	ids := []uint64{42, 43}
	for i, id := range ids {
		open := func() error { return sh.Open(id) }
		if i == 1 {
			open = func() error { return sh.OpenTraced(id, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") }
		}
		if err := open(); err != nil {
			t.Fatal(err)
		}
		if err := sh.Init(id, 2, i); err != nil {
			t.Fatal(err)
		}
		if err := sh.Send(id, []int32{int32(2 * i), int32(2*i + 1)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var reps []kv.Reply
	testrig.Eventually(t, 20*time.Second, "both ring rooms terminal", func() bool {
		reps, err = sh.Poll(ids, reps)
		return err == nil && reps[0].Status.Terminal() && reps[1].Status.Terminal()
	})
	for i, rep := range reps {
		if rep.Status != kv.StatusSuccess {
			t.Fatalf("ring room %d: %v/%v, want Success", ids[i], rep.Status, rep.Reason)
		}
	}
}
