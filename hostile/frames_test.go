package hostile

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/wire"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// attackRoom is the k-th room id an attack uses: above 2^62, where the shared
// workload's rooms (1..2^62) never are, and below 2^63.
func attackRoom(k int) uint64 { return 1<<62 + 1000 + uint64(k) }

// The prefill geometry kvxfer-sched registers (4 layers, 1 KiB pages, the
// default aux items): a decode registration must match it.
const (
	prefillLayers = 4
	prefillItem   = 1024
	prefillSlots  = 4096 // kvxfer-sched's KV pages; the attacks read the last ones
	prefillAux    = 512
)

func auxItems() []uint64 { return kvmem.DefaultShape().AuxItems }

// ---------------------------------------------------------------- ZMQ

// pusher is a raw PUSH socket to kvxferd's PULL port: blocking sends bounded
// by a send timeout, so a flood goes at the daemon's pace.
type pusher struct {
	ctx  *zmq.Context
	sock *zmq.Socket
}

func dialPusher(t *testing.T, port int) *pusher {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	s.SetLinger(0)
	s.SetSndtimeo(5 * time.Second)
	if err := s.Connect(zmqio.TCPEndpoint("127.0.0.1", port)); err != nil {
		t.Fatal(err)
	}
	p := &pusher{ctx: ctx, sock: s}
	t.Cleanup(p.close)
	return p
}

func (p *pusher) send(frames [][]byte) error {
	_, err := p.sock.SendMessage(frames)
	return err
}

func (p *pusher) close() {
	if p.sock != nil {
		p.sock.Close()
		p.ctx.Term()
		p.sock = nil
	}
}

// flood sends n messages built by mk, stopping at the time limit or at the
// first error; it returns how many were sent.
func (p *pusher) flood(n int, limit time.Duration, mk func(i int) [][]byte) (int, error) {
	deadline := time.Now().Add(limit)
	for i := range n {
		if i%256 == 0 && time.Now().After(deadline) {
			return i, fmt.Errorf("time limit %s", limit)
		}
		if err := p.send(mk(i)); err != nil {
			return i, err
		}
	}
	return n, nil
}

// ---------------------------------------------------------------- decode peers

// fakeDecode is a decode rank built in the test process from kvxfer's own
// pieces: a loopback agent with SGLang-shaped memory (its segments are in the
// backend's namespace, as an honest decode's are) and, unless pullPort is
// given, a PULL socket that counts what kvxferd sends it.
type fakeDecode struct {
	node     *kvmem.Node
	pull     *zmqio.Ingest
	port     int
	received atomic.Int64
}

func newFakeDecode(t *testing.T, role string, pullPort int) *fakeDecode {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	sh := kvmem.DefaultShape()
	sh.Layers, sh.Item, sh.Slots, sh.AuxSlots = prefillLayers, prefillItem, 64, 16
	n, err := kvmem.New("hostile-"+role+"-"+hex.EncodeToString(b[:]), sh, 0, loopback.Options{})
	if err != nil {
		t.Fatalf("decode memory: %v", err)
	}
	f := &fakeDecode{node: n, port: pullPort}
	t.Cleanup(func() { n.Close() })
	if pullPort == 0 {
		f.pull, err = zmqio.StartPull(zmqio.IngestConfig{Host: "127.0.0.1"}, func([][]byte) { f.received.Add(1) })
		if err != nil {
			t.Fatal(err)
		}
		f.port = f.pull.Port()
		t.Cleanup(f.pull.Stop)
	}
	return f
}

func (f *fakeDecode) name() string { return f.node.Agent.Name() }

// registration is the 24-frame (SGLang 0.5.23) KV-args registration.
func (f *fakeDecode) registration(t *testing.T) [][]byte {
	t.Helper()
	md, err := f.node.Agent.LocalMetadata()
	if err != nil {
		t.Fatal(err)
	}
	g := f.node.Peer()
	return registrationFrames(f.name(), f.port, md, g.KVPtrs, g.AuxPtrs, g.DstNumSlots)
}

func registrationFrames(agent string, port int, md []byte, kv, aux []uint64, slots int) [][]byte {
	reg := &wire.Registration{
		DecodeIP: "127.0.0.1", DecodePort: port, AgentName: agent, AgentMetadata: md,
		KVDataPtrs: kv, AuxDataPtrs: aux, DecodeTPSize: 1, DstKVItemLen: prefillItem,
		DstNumSlots: slots, HasDstNumSlots: true, HasLayerInfo: true, DCPSize: 1, HasStateDataLens: true,
	}
	for i := range kv {
		reg.KVMemKinds = append(reg.KVMemKinds, wire.MemDRAM)
		reg.KVItemLens = append(reg.KVItemLens, prefillItem)
		reg.KVLayerIDs = append(reg.KVLayerIDs, uint32(i%prefillLayers))
	}
	return reg.Encode()
}

// transferInfo is one room's destination: pages 0..pages-1, aux slot 0.
func transferInfo(agent string, port int, roomID uint64, pages int) [][]byte {
	ti := &wire.TransferInfo{Room: roomID, DecodeIP: "127.0.0.1", DecodePort: port, AgentName: agent,
		DstAuxIndex: 0, RequiredDstInfoNum: 1, HasDecodePrefixLen: true}
	for p := range pages {
		ti.DstKVIndices = append(ti.DstKVIndices, int32(p))
	}
	return ti.Encode()
}

func abortFrames(roomID uint64, ip string, port int, gen uint64) [][]byte {
	a := &wire.Abort{Room: roomID, DecodeIP: ip, DecodePort: port, HasEndpoint: true, Generation: gen, HasGen: gen > 0}
	return a.Encode()
}

// segmentFiles are the regular files of a loopback agent's private directory.
func segmentFiles(t *testing.T, a *loopback.Agent) []string {
	t.Helper()
	ents, err := os.ReadDir(a.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.Type().IsRegular() {
			out = append(out, filepath.Join(a.Dir(), e.Name()))
		}
	}
	return out
}

// ---------------------------------------------------------------- loopback metadata

// canaryMetadata is a loopback metadata blob (nixl/loopback/meta.go, version 1)
// whose only segment file is path: the decode geometry of kvxfer-sched's shape
// (8 KV buffers of slots pages, then the aux buffers, one slot each) laid out
// back to back in that file. It returns the blob, the KV and aux pointers, and
// the bytes the layout needs.
func canaryMetadata(agent, socket, path string, slots int) (blob []byte, kv, aux []uint64, size uint64) {
	const base = 0x7e0000000000
	type reg struct{ addr, len, off uint64 }
	var regs []reg
	off := uint64(0)
	for range 2 * prefillLayers {
		n := uint64(slots * prefillItem)
		regs = append(regs, reg{base + off, n, off})
		kv = append(kv, base+off)
		off += n
	}
	for _, it := range auxItems() {
		regs = append(regs, reg{base + off, it, off})
		aux = append(aux, base+off)
		off += it
	}
	str := func(b []byte, s string) []byte {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		return append(b, s...)
	}
	b := append([]byte("KVXLOOP"), 1)
	b = str(b, agent)
	b = str(b, socket)
	b = binary.LittleEndian.AppendUint16(b, 1)
	b = str(b, path)
	b = binary.LittleEndian.AppendUint64(b, off)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(regs)))
	for _, r := range regs {
		b = append(b, byte(nixl.DRAM))
		b = binary.LittleEndian.AppendUint64(b, 0)
		b = binary.LittleEndian.AppendUint64(b, r.addr)
		b = binary.LittleEndian.AppendUint64(b, r.len)
		b = binary.LittleEndian.AppendUint16(b, 0)
		b = binary.LittleEndian.AppendUint64(b, r.off)
	}
	return b, kv, aux, off
}

// ---------------------------------------------------------------- control

func dialControl(t *testing.T, d *kvxferd) *control.Client {
	t.Helper()
	c, err := control.Dial(d.ctl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Hello(nil); err != nil {
		t.Fatalf("control hello: %v", err)
	}
	return c
}

// pollUntil polls one room until cond or the time limit; it returns the last reply.
func pollUntil(c *control.Client, id uint64, limit time.Duration, cond func(kv.Reply) bool) (kv.Reply, error) {
	deadline := time.Now().Add(limit)
	var out []kv.Reply
	for {
		var err error
		out, err = c.Poll([]uint64{id}, out)
		if err != nil {
			return kv.Reply{}, err
		}
		if cond(out[0]) {
			return out[0], nil
		}
		if time.Now().After(deadline) {
			return out[0], fmt.Errorf("room %d still %s after %s", id, out[0].Status, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// serveRoom plays the scheduler for an attack room whose transfer info was
// sent: it waits for WaitingForInput, inits and sends the given prefill pages
// (aux slot aux), and waits for a terminal status.
func serveRoom(c *control.Client, id uint64, pages []int32, aux int) (kv.Reply, error) {
	rep, err := pollUntil(c, id, 10*time.Second, func(r kv.Reply) bool {
		return r.Status == kv.StatusWaitingForInput || r.Status.Terminal()
	})
	if err != nil || rep.Status.Terminal() {
		return rep, err
	}
	if err := c.Init(id, len(pages), aux); err != nil {
		return rep, fmt.Errorf("init: %w", err)
	}
	if err := c.Send(id, pages, nil); err != nil {
		return rep, fmt.Errorf("send: %w", err)
	}
	return pollUntil(c, id, 20*time.Second, func(r kv.Reply) bool { return r.Status.Terminal() })
}

func replyString(r kv.Reply) string {
	if r.Reason.String() != "" {
		return r.Status.String() + "/" + r.Reason.String()
	}
	return r.Status.String()
}
