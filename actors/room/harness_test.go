package room

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvxfer/kvxfer/kv"
)

// Test vocabulary shared by the table tests, the explorer and the fuzzer.

var testCfg = DefaultConfig()

// holdCfg holds the last chunk's completion notifications back (kvxferd's
// setting); the explorer and the fuzzer run under it.
var holdCfg = func() Config { c := DefaultConfig(); c.HoldCompletion = true; return c }()

// signalFor is what a pool would hand back for a HoldSignal transfer.
func signalFor(t kv.Transfer) [][]byte {
	if !t.HoldSignal {
		return nil
	}
	return [][]byte{[]byte(fmt.Sprintf("%d_kv_%d_1_0", t.Room, t.Chunk)), []byte(fmt.Sprintf("%d_aux", t.Room))}
}

var (
	epA = kv.Endpoint{IP: "10.0.0.1", Port: 7001}
	epB = kv.Endpoint{IP: "10.0.0.2", Port: 7002}
	epX = kv.Endpoint{IP: "10.0.0.9", Port: 7009}
)

func ti(agent string, from kv.Endpoint, pages []int32, required int) TransferInfo {
	return TransferInfo{Agent: agent, From: from, DstPages: pages, DstAux: 3, Required: required}
}

func dummy(agent string, from kv.Endpoint, required int) TransferInfo {
	return TransferInfo{Agent: agent, From: from, DstAux: 3, Required: required, Dummy: true}
}

func pages(ps ...int32) []int32 { return ps }

// summary renders Effects as one deterministic line, so table cases read like
// the transition table: "post[a:0c0 b:1c0L] pub=Transferring arm=transfer".
func summary(fx Effects) string {
	var parts []string
	if len(fx.Posts) > 0 {
		var ps []string
		for _, t := range fx.Posts {
			s := fmt.Sprintf("%s:%dc%d", t.Agent, t.Seq, t.Chunk)
			if t.Last {
				s += "L"
				if t.HoldSignal {
					s += "h"
				}
				if t.NoKV() {
					s += "nokv"
				}
				if len(t.SrcState) > 0 {
					s += "S"
				}
			}
			ps = append(ps, s)
		}
		parts = append(parts, "post["+strings.Join(ps, " ")+"]")
	}
	if fx.Published {
		s := "pub=" + fx.Status.String()
		if fx.Reason != kv.ReasonNone {
			s += "/" + fx.Reason.String()
		}
		parts = append(parts, s)
	}
	if fx.Reply != nil {
		parts = append(parts, "reply="+fx.Reply.Status.String())
	}
	for _, n := range fx.Notices {
		s := n.Kind.String() + "->" + n.To.String()
		if n.DrainExpired {
			s += "(expired)"
		}
		if n.HasGen {
			s += fmt.Sprintf("(gen=%d)", n.Gen)
		}
		if len(n.Signal) > 0 {
			s += fmt.Sprintf("(signal=%d)", len(n.Signal))
		}
		parts = append(parts, s)
	}
	if fx.Arm.Kind != NoDeadline {
		parts = append(parts, "arm="+fx.Arm.Kind.String())
	}
	if fx.Retire {
		parts = append(parts, "retire")
	}
	if fx.Revived {
		parts = append(parts, "revive")
	}
	if fx.Ignored {
		parts = append(parts, "ignored")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// clone deep-copies the parts of a machine that Step mutates in place.
func (m *Machine) clone() *Machine {
	c := *m
	c.infos = slices.Clone(m.infos)
	c.held = slices.Clone(m.held)
	c.inflight = slices.Clone(m.inflight)
	if m.ab != nil {
		c.ab = &abortLists{ackTo: slices.Clone(m.ab.ackTo), lateTo: slices.Clone(m.ab.lateTo)}
	}
	c.signals = slices.Clone(m.signals)
	return &c
}

// key identifies a machine state for the explorer's memo.
func (m *Machine) key() string {
	c := *m
	c.cfg = nil
	c.ab = nil // by value below, not by address
	ab := abortLists{}
	if m.ab != nil {
		ab = *m.ab
	}
	return fmt.Sprintf("%v %v", c, ab)
}

func msgName(msg Msg) string {
	switch msg := msg.(type) {
	case TransferInfo:
		if msg.Dummy {
			return "TransferInfo(" + msg.Agent + ",dummy)"
		}
		return "TransferInfo(" + msg.Agent + ")"
	case Send:
		return fmt.Sprintf("Send(%d pages)", len(msg.Pages))
	case XferDone:
		if msg.Fail != kv.ReasonNone {
			return fmt.Sprintf("XferDone(%d,%s)", msg.Seq, msg.Fail)
		}
		return fmt.Sprintf("XferDone(%d)", msg.Seq)
	case Deadline:
		return fmt.Sprintf("Deadline(%d)", msg.Gen)
	case PeerLost:
		return "PeerLost(" + msg.Agent + ")"
	case Fail:
		return "Fail(" + msg.Reason.String() + ")"
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", msg), "room.")
}
