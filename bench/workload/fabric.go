package workload

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/kvxfer/kvxfer/actors"
	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/kv"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/kvmem"
	"github.com/kvxfer/kvxfer/nixl/loopback"
)

// Fabric is the transfer layer every engine of a comparison posts through:
// one prefill rank (the actors/xfer pool over a loopback NIXL agent) and two
// decode ranks with SGLang-shaped shared memory, so every write moves real
// bytes. It is built once per process and reused by every run, which only
// changes the latency the decode peers inject.
type Fabric struct {
	Pool    *xfer.Pool
	Prefill *kvmem.Node
	Decode  [2]*kvmem.Node
	Shape   kvmem.Shape
	quit    chan struct{}
	done    chan struct{}
}

var fabricSeq atomic.Int64

// NewFabric allocates the three ranks and the pool.
func NewFabric() (*Fabric, error) {
	sh := kvmem.DefaultShape()
	sh.Layers, sh.Slots, sh.Item = 2, 4096, 256
	tag := fmt.Sprintf("%d-%d", os.Getpid(), fabricSeq.Add(1))
	f := &Fabric{Shape: sh, quit: make(chan struct{}), done: make(chan struct{})}
	var err error
	if f.Prefill, err = kvmem.New("bench-prefill-"+tag, sh, 0, loopback.Options{}); err != nil {
		return nil, err
	}
	if f.Pool, err = xfer.New(xfer.Config{Agent: f.Prefill.Agent, Local: &f.Prefill.Geo}); err != nil {
		f.Prefill.Close()
		return nil, err
	}
	for i := range f.Decode {
		d, err := kvmem.New(fmt.Sprintf("bench-decode%d-%s", i, tag), sh, 0, loopback.Options{})
		if err == nil {
			f.Decode[i] = d
			err = f.addPeer(d)
		}
		if err != nil {
			f.Close()
			return nil, err
		}
	}
	go f.drain()
	return f, nil
}

func (f *Fabric) addPeer(d *kvmem.Node) error {
	md, err := d.Agent.LocalMetadata()
	if err != nil {
		return err
	}
	if _, err := f.Prefill.Agent.LoadPeer(md); err != nil {
		return err
	}
	return f.Pool.AddPeer(d.Peer())
}

// drain is decode's notification loop: it empties the decode agents'
// notification queues so they do not grow for the whole run.
func (f *Fabric) drain() {
	defer close(f.done)
	var buf []nixl.Notif
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-f.quit:
			return
		case <-t.C:
		}
		for _, d := range f.Decode {
			buf, _ = d.Agent.Notifs(buf[:0])
		}
	}
}

// Agent names decode agent i (0 or 1).
func (f *Fabric) Agent(i int) string { return f.Decode[i].Agent.Name() }

// Close stops the pool and releases the ranks' memory.
func (f *Fabric) Close() error {
	select {
	case <-f.quit:
		return nil
	default:
	}
	close(f.quit)
	if f.Decode[0] != nil && f.Decode[1] != nil {
		<-f.done
	}
	var errs []error
	if f.Pool != nil {
		f.Pool.Close()
	}
	for _, d := range f.Decode {
		if d != nil {
			errs = append(errs, d.Close())
		}
	}
	errs = append(errs, f.Prefill.Close())
	return errors.Join(errs...)
}

// Tap wraps a transfer layer to count, for the workload, the writes in
// flight and the late posts: writes of a chunk the scheduler sent after it
// issued the room's abort (P5: a write into pages decode may have freed).
// Chunks sent before the abort were legitimately posted, even if the engine
// got to them after the abort was issued.
type Tap struct {
	Inner    actors.Transfers
	inflight atomic.Int64
	posts    atomic.Int64
	late     atomic.Int64
	aborted  *abortSet
}

func newTap(inner actors.Transfers, aborted *abortSet) *Tap {
	return &Tap{Inner: inner, aborted: aborted}
}

// Post implements actors.Transfers.
func (t *Tap) Post(tr kv.Transfer, done kv.DoneFunc) {
	t.posts.Add(1)
	if t.aborted.after(tr.Room, tr.Chunk) {
		t.late.Add(1)
	}
	t.inflight.Add(1)
	t.Inner.Post(tr, func(r kv.Reason, signal [][]byte) {
		t.inflight.Add(-1)
		done(r, signal)
	})
}

// Notices counts what the engine told decode, by kind.
type Notices struct {
	Failures, Acks atomic.Int64
}

// Notify implements actors.Notifier.
func (n *Notices) Notify(_ uint64, x room.Notice) {
	if x.Kind == room.AbortAck {
		n.Acks.Add(1)
	} else {
		n.Failures.Add(1)
	}
}

// Instant is a transfer layer that completes every write at once and keeps
// nothing (actors/xfer/xfertest records every post, which a long run cannot afford):
// the pure-overhead runs measure the engines around the transfers with it.
type Instant struct{}

// Post implements actors.Transfers.
func (Instant) Post(_ kv.Transfer, done kv.DoneFunc) { done(kv.ReasonNone, nil) }
