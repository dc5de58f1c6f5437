package daemon

import (
	"errors"
	"fmt"

	"github.com/kvxfer/kvxfer/nixl"
	"github.com/kvxfer/kvxfer/nixl/cuda"
	"github.com/kvxfer/kvxfer/transport/control"
)

// VRAMImporter is an Agent that can open the scheduler's CUDA IPC handles, so
// that register_memory can name GPU buffers (cuda_ipc, offset, length, dev).
// The device pointer it returns is what the daemon registers with NIXL as
// VRAM.
type VRAMImporter interface {
	ImportVRAM(handle []byte, offset, length, dev uint64) (*cuda.Import, error)
	ReleaseVRAM(x *cuda.Import) error
}

// WithCUDAIPC gives an agent (libnixl, or loopback in VRAM mode) the CUDA IPC
// import register_memory needs. drv is normally cuda.Lazy(""): libcuda is
// loaded on the first GPU registration, so kvxferd starts and serves host
// memory on machines without a GPU. Every handle still open is closed after
// the agent closes (it deregisters the memory first).
func WithCUDAIPC(a Agent, drv cuda.Driver) Agent {
	c := &cudaIPC{Agent: a, im: cuda.NewImporter(drv)}
	w, d := progressOf(a)
	switch {
	case w != nil && d != nil:
		return &struct {
			*cudaIPC
			nixl.Waker
			nixl.Dueer
		}{c, w, d}
	case w != nil:
		return &struct {
			*cudaIPC
			nixl.Waker
		}{c, w}
	}
	return c
}

// progressOf returns the agent's optional progress interfaces. A wrapper that
// embeds only the Agent interface hides them, and without them the transfer
// pool cannot park on the agent's wake-ups (it polls every millisecond), so
// the wrappers here pass them on (a Dueer only with a Waker: no backend has
// one without the other). Batch and PollsItself, whose absence is an answer
// of its own, the wrappers implement by asking the agent.
func progressOf(a nixl.Agent) (nixl.Waker, nixl.Dueer) {
	w, _ := a.(nixl.Waker)
	d, _ := a.(nixl.Dueer)
	return w, d
}

type cudaIPC struct {
	Agent
	im *cuda.Importer
}

func (c *cudaIPC) ImportVRAM(handle []byte, offset, length, dev uint64) (*cuda.Import, error) {
	return c.im.Open(handle, offset, length, dev)
}

func (c *cudaIPC) ReleaseVRAM(x *cuda.Import) error { return c.im.Close(x) }

// SendNotifs implements nixl.NotifBatcher (the agent's own, if it has one).
func (c *cudaIPC) SendNotifs(peer string, msgs [][]byte) error {
	return nixl.SendNotifs(c.Agent, peer, msgs)
}

// Batch implements nixl.Batcher: the agent's own batch, if it has one.
func (c *cudaIPC) Batch(fn func(nixl.Requests)) error { return nixl.InBatch(c.Agent, fn) }

// PollsItself implements nixl.SelfPoller: the agent's own answer.
func (c *cudaIPC) PollsItself() bool { return nixl.PollsItself(c.Agent) }

// Close closes the agent, then the handles.
func (c *cudaIPC) Close() error {
	err := c.Agent.Close()
	return errors.Join(err, c.im.CloseAll())
}

// vramBatch is what one register_memory opened: refused registrations close
// it again, so a refusal leaves no handle open.
type vramBatch struct {
	vi VRAMImporter
	xs []*cuda.Import
}

// importVRAM opens buffer i's CUDA IPC handle and returns the device pointer
// of the buffer. Every error says why at registration: no GPU access in
// kvxferd, a device it does not see or the memory is not on, a stale handle,
// a range past the allocation.
func (d *Daemon) importVRAM(b *vramBatch, i int, r control.Region) (uint64, error) {
	vi, ok := d.agent.(VRAMImporter)
	if !ok {
		return 0, fmt.Errorf("buffer %d: CUDA IPC handles need kvxferd's NIXL agent to import GPU memory, and this one (%T) does not; kvxferd's -nixl-backend nixl and loopback both do (docs/vram.md)", i, d.agent)
	}
	x, err := vi.ImportVRAM(r.CUDAIPC, r.Offset, r.Length, r.Dev)
	if err != nil {
		return 0, fmt.Errorf("buffer %d (GPU %d, offset %d, %d bytes): %w", i, r.Dev, r.Offset, r.Length, err)
	}
	b.vi = vi
	b.xs = append(b.xs, x)
	return x.Ptr, nil
}

// release closes everything the batch opened.
func (b *vramBatch) release() {
	for _, x := range b.xs {
		b.vi.ReleaseVRAM(x)
	}
	b.xs = nil
}
