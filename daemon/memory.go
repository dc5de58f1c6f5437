package daemon

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/kvxfer/kvxfer/actors/xfer"
	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/loopback"
	"github.com/kvxfer/kvxfer/nixl/sglang"
	"github.com/kvxfer/kvxfer/transport/bootstrap"
	"github.com/kvxfer/kvxfer/transport/control"
	"github.com/kvxfer/kvxfer/transport/zmqio"
)

// memory is what the scheduler registered so far.
type memory struct {
	kv, aux  *sglang.Buffers
	state    map[int]*sglang.Buffers
	attached map[string][]byte // shm file -> its mapping
}

// registerMemory is the control API's register_memory: map the scheduler's
// shared memory, and go live once KV, aux and every expected state list are in.
func (d *Daemon) registerMemory(reg *control.MemoryRegistration) error {
	if err := d.beginMem(); err != nil { // no lock is held past here (activate.go)
		return err
	}
	defer d.endMem()
	if err := d.ensureAgent(); err != nil {
		return err
	}
	buf, err := d.mapRegions(reg)
	if err != nil {
		return err
	}
	switch reg.Kind {
	case control.KindKV:
		d.mem.kv = buf
	case control.KindAux:
		d.mem.aux = buf
	default:
		if d.mem.state == nil {
			d.mem.state = map[int]*sglang.Buffers{}
		}
		d.mem.state[reg.Component] = buf
	}
	if d.mem.kv == nil || d.mem.aux == nil || len(d.mem.state) < d.cfg.StateComponents {
		return nil
	}
	local := sglang.Local{KV: *d.mem.kv, Aux: *d.mem.aux}
	for i := range len(d.mem.state) {
		s, ok := d.mem.state[i]
		if !ok {
			return fmt.Errorf("state components must be numbered 0..%d; %d is missing", len(d.mem.state)-1, i)
		}
		local.State = append(local.State, *s)
	}
	return d.activate(local)
}

// ensureAgent creates the NIXL agent once (the caller holds the memBusy turn).
func (d *Daemon) ensureAgent() error {
	if a, _ := d.backend(); a != nil {
		return nil
	}
	name := "kvxferd-" + strconv.Itoa(os.Getpid()) + "-r" + strconv.Itoa(d.cfg.Rank.Sender())
	newAgent := d.cfg.NewAgent
	if newAgent == nil {
		newAgent = func(name string) (Agent, error) { return loopback.New(name, loopback.Options{}) }
	}
	a, err := newAgent(name)
	if err != nil {
		return fmt.Errorf("creating the NIXL agent: %w", err)
	}
	d.mu.Lock()
	d.agent = a
	d.mu.Unlock()
	return nil
}

func (d *Daemon) mapRegions(reg *control.MemoryRegistration) (_ *sglang.Buffers, err error) {
	if err := reg.Validate(); err != nil {
		return nil, err
	}
	var vram vramBatch // CUDA IPC handles this call opened: closed again if it is refused
	defer func() {
		if err != nil {
			vram.release()
		}
	}()
	if d.mem.attached == nil {
		d.mem.attached = map[string][]byte{}
	}
	b := &sglang.Buffers{NumSlots: reg.NumSlots(), Kind: reg.Buffers[0].Mem, DevID: reg.Buffers[0].Dev}
	for i, r := range reg.Buffers {
		if len(r.CUDAIPC) > 0 { // GPU memory: daemon/vram.go
			ptr, err := d.importVRAM(&vram, i, r)
			if err != nil {
				return nil, err
			}
			b.Ptrs, b.ItemLens = append(b.Ptrs, ptr), append(b.ItemLens, r.ItemLen)
			continue
		}
		path := r.Path()
		if r.Memfd != 0 {
			path = "memfd:" + strconv.FormatInt(r.Memfd, 10)
		}
		data, ok := d.mem.attached[path]
		if !ok {
			var err error
			if data, err = d.attach(r); err != nil {
				return nil, fmt.Errorf("buffer %d: %w", i, err)
			}
			d.mem.attached[path] = data
		}
		if r.Offset+r.Length > uint64(len(data)) || r.Offset+r.Length < r.Offset {
			return nil, fmt.Errorf("buffer %d: offset %d + length %d is past the end of %s (%d bytes)", i, r.Offset, r.Length, path, len(data))
		}
		base := uint64(nixl.DescOf(data, 0).Addr)
		b.Ptrs = append(b.Ptrs, base+r.Offset)
		b.ItemLens = append(b.ItemLens, r.ItemLen)
	}
	return b, nil
}

// Activate makes the rank live with memory a Go caller already holds (tests,
// embedding): agent must own or have attached every buffer of local.
func (d *Daemon) Activate(agent Agent, local sglang.Local) error {
	if err := d.beginMem(); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	defer d.endMem()
	d.mu.Lock()
	if d.agent != nil && d.agent != agent {
		d.mu.Unlock()
		return fmt.Errorf("daemon: a different agent was already created by register_memory")
	}
	d.agent = agent
	d.mu.Unlock()
	return d.activate(local)
}

// activate makes the rank live: NIXL registration, the pool, the ZMQ PULL
// socket, PUT /route, in that order, with no lock held (the caller holds the
// memBusy turn). The PUT comes last: a decode learns the rank only once the
// rest is up. Whatever fails, everything activate started is undone
// (rollback), so the daemon is as before and a later register_memory may try
// again.
func (d *Daemon) activate(local sglang.Local) (err error) {
	agent, _ := d.backend()
	var rb rollback
	defer func() {
		if err != nil {
			d.rollback(&rb)
		}
	}()
	local.Sender, local.NoKV, local.TPSize, local.MLA = d.cfg.Rank.Sender(), d.cfg.NoKV, d.cfg.Rank.TPSize, d.cfg.MLA
	if err := d.applyTopology(&local); err != nil {
		return err
	}
	if err := local.Validate(); err != nil {
		return err
	}
	sets := []*sglang.Buffers{&local.KV, &local.Aux}
	for i := range local.State {
		sets = append(sets, &local.State[i])
	}
	rb.agent = agent
	rb.regs, err = sglang.RegisterBuffers(agent, sets...)
	if err != nil {
		return fmt.Errorf("registering memory with NIXL: %w", err)
	}
	pool, err := xfer.New(xfer.Config{Agent: agent, Local: &local, Actors: d.cfg.QueueSize, Logger: d.log, Clock: d.cfg.Engine.Clock,
		SignalFailed: d.signalFailed})
	if err != nil {
		return err
	}
	rb.pool = pool
	d.mu.Lock()
	d.pool = pool
	replay := d.replay
	rb.replay = replay
	d.mu.Unlock()
	d.xfers.pool.Store(pool)
	ic := zmqio.IngestConfig{Host: d.cfg.ListenHost, Port: d.cfg.PullPort, Logger: d.log, KeepAlive: d.liveness.ingestKeepAlive()}
	if len(replay) > 0 {
		// On the ingest goroutine (it owns the peer table), before any frame
		// from the socket: a decode's next transfer info finds its agent.
		ic.Before = func() { d.peers.replay(replay) }
	}
	in, err := zmqio.StartIngest(ic, d.peers)
	if err != nil {
		return fmt.Errorf("binding the ZMQ PULL socket: %w", err)
	}
	rb.ingest = in
	d.mu.Lock()
	d.ingest = in
	d.mu.Unlock()
	url := d.cfg.BootstrapURL
	if url == "" && d.bootLn != nil {
		url = d.hostedBootstrapURL() // reachable: never http://0.0.0.0 or http://[::]
	}
	if url != "" {
		r := d.cfg.Rank
		reg := bootstrap.RankRegistration{
			AttnTPSize: r.TPSize, AttnTPRank: r.TPRank, AttnCPSize: r.CPSize, AttnCPRank: r.CPRank,
			AttnDPSize: r.DPSize, AttnDPRank: r.DPRank, PPSize: r.PPSize, PPRank: r.PPRank,
			SystemDPSize: r.DPSize, SystemDPRank: r.DPRank, RankIP: d.cfg.HostIP, RankPort: in.Port(),
			PageSize: d.cfg.PageSize, KVCacheDtype: d.cfg.KVCacheDtype, LoadBalanceMethod: d.cfg.LoadBalanceMethod,
		}
		if err := d.registerRank(d.halt, url, reg, d.registerOptions(url)); err != nil {
			return fmt.Errorf("registering the rank with the bootstrap server %s: %w", url, err)
		}
	}
	d.mu.Lock()
	closing := d.closing
	if !closing {
		d.replay = nil // replayed now; a rollback gives them back
		d.live.Store(true)
	}
	d.mu.Unlock()
	if closing {
		return errors.New("daemon: shutting down")
	}
	if d.cfg.OnLive != nil {
		d.cfg.OnLive(local)
	}
	d.log.Info("rank live", "zmq", in.Endpoint(), "rank_ip", d.cfg.HostIP, "bootstrap", url, "sender", local.Sender,
		"kv_buffers", len(local.KV.Ptrs), "slots", local.KV.NumSlots, "decode_protocol", d.dialectSetting())
	return nil
}

// attach maps the file behind a host region: a memfd the scheduler passed at
// exec, or a named file (checked by the agent).
func (d *Daemon) attach(r control.Region) ([]byte, error) {
	if r.Memfd == 0 {
		return d.agent.Attach(r.Path())
	}
	f, ok := d.cfg.Memfds[int(r.Memfd)]
	if !ok {
		return nil, fmt.Errorf("memfd %d was not passed to kvxferd at start (-memfd %v)", r.Memfd, d.cfg.Memfds.Numbers())
	}
	return d.agent.AttachFile(f)
}
