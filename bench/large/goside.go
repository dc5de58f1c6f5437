package large

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/libnixl"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"golang.org/x/sys/unix"
)

// goSide is the Go initiator of one geometry: its slab (registered one
// region per buffer, as SGLang registers KV), a second slab for memcpy, the
// target loaded as a peer and SGLang's prepared lists on both sides.
type goSide struct {
	ag         *libnixl.Agent
	src, mdst  []byte
	reg        nixl.RegID
	peer       string
	lList      nixl.ListID
	rList      nixl.ListID
	srcBase    uintptr
	tgtBase    uintptr
	rooms      []Room
	abs        [][2][]nixl.Desc // per room: merged list with absolute addresses
	ids        []nixl.XferID
	st         []nixl.Status
	woke       chan struct{}
	stopWaking func()
	tgtPID     int
}

func (r *runner) goSide(g Geometry, slots, size int, md []byte, tgtAddr uint64) (*goSide, error) {
	gs := &goSide{ag: r.ag, woke: make(chan struct{}, 1)}
	var err error
	if gs.src, err = r.ag.Alloc(size); err != nil {
		return nil, err
	}
	if gs.mdst, err = r.ag.Alloc(size); err != nil {
		r.ag.Free(gs.src)
		return nil, err
	}
	for i := range gs.src {
		gs.src[i] = byte(3 + 131*(i/4096) + 7*i)
	}
	gs.srcBase, gs.tgtBase = nixl.DescOf(gs.src, 0).Addr, uintptr(tgtAddr)
	l, p, err := Geometries(g, slots, uint64(gs.srcBase), tgtAddr)
	if err != nil {
		gs.close()
		return nil, err
	}
	fail := func(err error) (*goSide, error) { gs.close(); return nil, err }
	if gs.reg, err = r.ag.Register(nixl.DRAM, l.KV.Regions()); err != nil {
		return fail(err)
	}
	if gs.peer, err = r.ag.LoadPeer(md); err != nil {
		return fail(err)
	}
	if gs.lList, err = sglang.PrepLocalKV(r.ag, l); err != nil {
		return fail(err)
	}
	if gs.rList, err = r.ag.Prep(gs.peer, nixl.DRAM, sglang.KVDstDescs(l, p)); err != nil {
		return fail(err)
	}
	gs.stopWaking = r.ag.OnProgress(func() {
		select {
		case gs.woke <- struct{}{}:
		default:
		}
	})
	return gs, nil
}

func (gs *goSide) close() {
	if gs.stopWaking != nil {
		gs.stopWaking()
	}
	if gs.lList != 0 {
		gs.ag.ReleaseList(gs.lList)
	}
	if gs.rList != 0 {
		gs.ag.ReleaseList(gs.rList)
	}
	if gs.peer != "" {
		gs.ag.DropPeer(gs.peer)
	}
	if gs.reg != 0 {
		gs.ag.Deregister(gs.reg)
	}
	gs.ag.Free(gs.src)
	gs.ag.Free(gs.mdst)
}

func (gs *goSide) setRooms(rooms []Room) {
	gs.rooms = rooms
	gs.abs = make([][2][]nixl.Desc, len(rooms))
	for i, rm := range rooms {
		s, d := slices.Clone(rm.Src), slices.Clone(rm.Dst)
		for k := range s {
			s[k].Addr += gs.srcBase
			d[k].Addr += gs.tgtBase
		}
		gs.abs[i] = [2][]nixl.Desc{s, d}
	}
}

func (gs *goSide) memcpy(iters int) error {
	for range iters {
		for _, rm := range gs.rooms {
			for k, s := range rm.Src {
				d := rm.Dst[k]
				copy(gs.mdst[d.Addr:uint64(d.Addr)+d.Len], gs.src[s.Addr:uint64(s.Addr)+s.Len])
			}
		}
	}
	return nil
}

var notif = []byte("r")

func (gs *goSide) merged(iters int) error {
	return gs.rounds(iters, func(r nixl.Requests, i int) (nixl.XferID, error) {
		return r.Create(nixl.Write, nixl.DRAM, gs.abs[i][0], gs.peer, nixl.DRAM, gs.abs[i][1], notif)
	})
}

func (gs *goSide) prepped(iters int) error {
	return gs.rounds(iters, func(r nixl.Requests, i int) (nixl.XferID, error) {
		return r.Make(nixl.Write, gs.lList, gs.rooms[i].SrcIdx, gs.rList, gs.rooms[i].DstIdx, notif)
	})
}

// rounds makes and posts one request per room, waits for all of them and
// releases them, iters times, as actors/xfer's pool does with this agent:
// the requests made and posted in one batch (nixl.InBatch: one hop onto
// libnixl's owner thread), polled and the ended ones released in one batch,
// and between polls a park until the agent's owner, which polls its own
// requests (nixl.SelfPoller), sees one end; an agent that does not poll
// itself is polled 16 times back to back before the park.
func (gs *goSide) rounds(iters int, mk func(r nixl.Requests, i int) (nixl.XferID, error)) error {
	selfPolling := nixl.PollsItself(gs.ag)
	var err error
	for range iters {
		gs.ids = gs.ids[:0]
		if berr := nixl.InBatch(gs.ag, func(r nixl.Requests) {
			for i := range gs.rooms {
				var x nixl.XferID
				if x, err = mk(r, i); err != nil {
					return
				}
				gs.ids = append(gs.ids, x)
				if _, err = r.Post(x); err != nil {
					return
				}
			}
		}); berr != nil || err != nil {
			return errors.Join(berr, err)
		}
		gs.st = append(gs.st[:0], make([]nixl.Status, len(gs.ids))...)
		left := slices.Clone(gs.ids)
		deadline := time.Now().Add(60 * time.Second)
		for polls := 0; len(left) > 0; polls++ {
			if berr := nixl.InBatch(gs.ag, func(r nixl.Requests) {
				if err = r.Poll(left, gs.st); err != nil {
					return
				}
				kept := left[:0]
				for i, x := range left {
					switch gs.st[i].State {
					case nixl.Failed:
						err = gs.st[i].Err
						return
					case nixl.Done:
						if err = r.Release(x); err != nil {
							return
						}
					default:
						kept = append(kept, x)
					}
				}
				left = kept
			}); berr != nil || err != nil {
				return errors.Join(berr, err)
			}
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%d requests in flight after 60s", len(left))
			}
			if selfPolling || polls >= 16 {
				select {
				case <-gs.woke:
				case <-time.After(10 * time.Millisecond):
				}
			}
		}
	}
	return nil
}

// attachCma readies the cma engines to write into process pid, the decode
// stand-in whose slab is at tgtBase: one byte written as a probe (the
// kernel refuses a process it may not ptrace).
func (gs *goSide) attachCma(pid int) error {
	l := []unix.Iovec{{Base: &gs.src[0]}}
	l[0].SetLen(1)
	if _, err := unix.ProcessVMWritev(pid, l, []unix.RemoteIovec{{Base: gs.tgtBase, Len: 1}}, 0); err != nil {
		return fmt.Errorf("process_vm_writev into the decode stand-in: %w", err)
	}
	gs.tgtPID = pid
	return nil
}

// cmaPerDesc writes the merged pairs into the decode stand-in with
// process_vm_writev, one call per descriptor: the copy UCX's cma transport
// makes for each put, without NIXL or UCX around it.
func (gs *goSide) cmaPerDesc(iters int) error { return gs.cma(iters, 1) }

// cmaBatched is the same copy with up to 1,024 descriptors (IOV_MAX) per
// call.
func (gs *goSide) cmaBatched(iters int) error { return gs.cma(iters, 1024) }

func (gs *goSide) cma(iters, per int) error {
	var l []unix.Iovec
	var rv []unix.RemoteIovec
	for range iters {
		for i, rm := range gs.rooms {
			d := gs.abs[i][1]
			for k0 := 0; k0 < len(rm.Src); k0 += per {
				l, rv = l[:0], rv[:0]
				want := 0
				for k := k0; k < min(k0+per, len(rm.Src)); k++ {
					s := rm.Src[k]
					v := unix.Iovec{Base: &gs.src[s.Addr]}
					v.SetLen(int(s.Len))
					l = append(l, v)
					rv = append(rv, unix.RemoteIovec{Base: d[k].Addr, Len: int(d[k].Len)})
					want += int(s.Len)
				}
				n, err := unix.ProcessVMWritev(gs.tgtPID, l, rv, 0)
				if err != nil {
					return fmt.Errorf("process_vm_writev: %w", err)
				}
				if n != want { // a partial write: the stand-in's mapping ended early
					return fmt.Errorf("process_vm_writev wrote %d of %d bytes", n, want)
				}
			}
		}
	}
	return nil
}
