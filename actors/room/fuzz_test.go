package room

import (
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// FuzzStep drives one machine with an arbitrary message sequence decoded from
// the fuzzer's bytes, checks every invariant after every step, then delivers
// the outstanding completions and lets time pass: every room must end
// terminal, drained and retired.
func FuzzStep(f *testing.F) {
	f.Add([]byte{0, 1, 1, 4, 2, 5, 2, 10, 0, 13})
	f.Add([]byte{8, 0, 6, 13})
	f.Add([]byte{0, 1, 2, 2, 2, 4, 3, 5, 1, 5, 2, 7, 10, 0, 12, 0, 13})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, c := New(&holdCfg, 5), &checker{}
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		var trace []string
		for len(data) > 0 && len(trace) < 64 {
			msg := fuzzMsg(next(), next, m, c)
			trace = append(trace, msgName(msg))
			if err := c.step(m, msg); err != nil {
				t.Fatalf("%v\n  sequence: %v", err, trace)
			}
		}
		for _, p := range c.posts {
			if !containsSeq(c.done, p.Seq) {
				if err := c.step(m, XferDone{Seq: p.Seq, Signal: signalFor(p)}); err != nil {
					t.Fatalf("draining: %v\n  sequence: %v", err, trace)
				}
			}
		}
		if err := c.quiesce(m); err != nil {
			t.Fatalf("%v\n  sequence: %v", err, trace)
		}
	})
}

func fuzzMsg(op byte, next func() byte, m *Machine, c *checker) Msg {
	required := int(next()%2) + 1
	switch op % 15 {
	case 0:
		return Open{}
	case 1:
		return ti("a", epA, pages(1, 2, 3, 4), required)
	case 2:
		return ti("b", epB, pages(5, 6, 7, 8), required)
	case 3:
		return dummy("c", epX, required)
	case 4:
		return Init{NumPages: int(next() % 5), AuxIndex: 1}
	case 5:
		return Send{Pages: make([]int32, next()%3)}
	case 6:
		return Poll{}
	case 7:
		return Abort{}
	case 8:
		return DecodeAbort{From: epA}
	case 9:
		return PeerLost{Agent: "a"}
	case 10, 11:
		seq := uint32(next() % 8)
		var signal [][]byte // what the pool hands back for a held transfer
		if len(c.posts) > 0 {
			p := c.posts[int(seq)%len(c.posts)]
			seq, signal = p.Seq, signalFor(p)
		}
		if op%15 == 11 {
			return XferDone{Seq: seq, Fail: kv.ReasonTransferError}
		}
		return XferDone{Seq: seq, Signal: signal}
	case 12:
		_, gen := m.Armed()
		return Deadline{Gen: gen - uint32(next()%2)} // current or stale
	case 13:
		return Clear{}
	default:
		return Fail{Reason: kv.ReasonShutdown}
	}
}
