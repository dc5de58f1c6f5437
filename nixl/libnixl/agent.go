package libnixl

import (
	"encoding/json"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/internal/cores"
	"github.com/kvxfer/kvxfer/nixl"
)

// Environment variables SGLang uses to pick the NIXL backend plugin and its
// init parameters; New honours them when Options leaves the fields empty.
const (
	EnvBackend       = "SGLANG_DISAGGREGATION_NIXL_BACKEND"
	EnvBackendParams = "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS"
)

// syncStrict is NIXL_CAPI_THREAD_SYNC_STRICT: one agent-wide mutex, as SGLang's
// prefill uses. Our own calls are already serialized by the owner goroutine;
// STRICT keeps NIXL's progress thread and any future listener thread safe too.
const syncStrict = 1

// Options configure New. The zero value is SGLang's prefill setup: UCX, its
// params from the environment, progress thread on.
type Options struct {
	// Path is libnixl_capi.so or its directory; "" runs Find.
	Path string
	// Backend is the plugin name; "" means $SGLANG_DISAGGREGATION_NIXL_BACKEND, else "UCX".
	Backend string
	// BackendParams are the plugin's init parameters; nil means the JSON object in
	// $SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS (string to string), else none.
	BackendParams map[string]string
	// NoProgressThread turns NIXL's progress thread off. On transports without
	// hardware RMA (tcp, shm) a target then only progresses inside its own calls.
	NoProgressThread bool
	// ProgressDelay is NIXL's progress-thread delay (nixlAgentConfig
	// pthrDelay): how long the UCX progress thread waits for an event before
	// it progresses again. NIXL's default, 0, makes that thread spin: an idle
	// agent then burns a whole core (BenchmarkIdleCPU: 0.49 of a core on 2
	// loaded cores; 1 ms: 1.8 %; 10 ms: 0.3 %). Default 10 ms. Requests of
	// this agent in flight are progressed by the owner goroutine (Spin), not
	// by that thread, so transfers do not wait for it (BenchmarkInteropWrite).
	ProgressDelay time.Duration
	// Spin: while requests are in flight the owner goroutine polls them back
	// to back (which also makes NIXL send their deferred notifications: the
	// UCX plugin sends a notification only from getXferStatus) and wakes
	// OnProgress pollers when one ends. 0 (default): for as long as any is
	// in flight; positive: only for Spin after the last call, then every
	// PollInterval; negative: only every PollInterval. An idle owner
	// (nothing in flight) blocks and costs nothing.
	Spin time.Duration
	// PollInterval is the owner's polling period when Spin does not apply.
	// Default 1 ms (Go timers below that fire at about 1.1 ms anyway).
	PollInterval time.Duration
	// CloseWait bounds how long Close waits for requests in flight to settle
	// before destroying the agent. Default 5s.
	CloseWait time.Duration
}

// coreFree reports whether spinning is free: a processor has nothing else to
// run (replaced in tests, before their agents start and after they close).
var coreFree = cores.MachineFree

// Agent is a nixl.Agent over the real NIXL library. Every NIXL call runs on one
// owner goroutine locked to its OS thread: the UCX plugin keeps a worker per OS
// thread, and NIXL forbids touching one request from two threads at once.
type Agent struct {
	name string
	opts Options

	calls chan *call
	done  chan struct{}

	closeOnce sync.Once
	closeErr  error

	memMu sync.Mutex
	maps  [][]byte

	st *state // owner goroutine only

	wakers nixl.Wakers // OnProgress
}

var _ nixl.Agent = (*Agent)(nil)

// New loads libnixl (once per process), creates an agent named name with the
// progress thread on and STRICT thread sync, and creates the backend.
func New(name string, opts Options) (*Agent, error) {
	if name == "" {
		return nil, nixl.Errorf(nixl.ErrInvalid, "libnixl: empty agent name")
	}
	if err := ensureLoaded(opts.Path); err != nil {
		return nil, err
	}
	var err error
	if opts.Backend == "" {
		opts.Backend = os.Getenv(EnvBackend)
	}
	if opts.Backend == "" {
		opts.Backend = "UCX"
	}
	if opts.BackendParams == nil {
		if opts.BackendParams, err = envParams(); err != nil {
			return nil, err
		}
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = time.Millisecond
	}
	if opts.ProgressDelay <= 0 {
		opts.ProgressDelay = 10 * time.Millisecond
	}
	if opts.CloseWait <= 0 {
		opts.CloseWait = 5 * time.Second
	}
	a := &Agent{name: name, opts: opts, calls: make(chan *call), done: make(chan struct{})}
	ready := make(chan error, 1)
	go a.loop(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return a, nil
}

// envParams parses SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS like SGLang does:
// a JSON object of strings.
func envParams() (map[string]string, error) {
	s := os.Getenv(EnvBackendParams)
	if s == "" {
		return map[string]string{}, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, nixl.Errorf(nixl.ErrInvalid, "libnixl: %s must be a JSON object of strings: %v", EnvBackendParams, err)
	}
	return m, nil
}

// loop is the owner goroutine. It never unlocks its OS thread, so the thread
// (and the UCX worker state NIXL keyed to it) ends with the agent.
//
// While requests are in flight it polls them back to back (Options.Spin),
// serving calls in between; with nothing in flight it blocks on the next
// call: no ticker, no cost when idle. On transports
// where the initiator's progress call does the copying (shared memory, cma,
// tcp) that is what moves the bytes; on RDMA it only finds completions sooner.
func (a *Agent) loop(ready chan<- error) {
	runtime.LockOSThread()
	st, err := newState(a.name, a.opts)
	ready <- err
	if err != nil {
		close(a.done)
		return
	}
	a.st = st
	tick := time.NewTicker(a.opts.PollInterval)
	defer tick.Stop()
	var last time.Time
	run := func(c *call) bool {
		c.f()
		c.done <- struct{}{}
		last = time.Now()
		if st.dead {
			close(a.done)
			a.wake()
		}
		return st.dead
	}
	for {
		// The spin takes a core: only while one is free (cores.Free), as the
		// transfer pool's and the ring's. Otherwise the requests in flight
		// are polled every PollInterval, with every call served at once.
		if st.inflight > 0 && (a.opts.Spin == 0 || a.opts.Spin > 0 && time.Since(last) < a.opts.Spin) && coreFree() {
			select {
			case c := <-a.calls:
				if run(c) {
					return
				}
			default:
				if st.progress() {
					a.wake()
				}
			}
			continue
		}
		var tc <-chan time.Time
		if st.inflight > 0 {
			tc = tick.C
		}
		select {
		case c := <-a.calls:
			if run(c) {
				return
			}
		case <-tc:
			if st.progress() {
				a.wake()
			}
		}
	}
}

var _ nixl.Waker = (*Agent)(nil)

// OnProgress implements nixl.Waker: wake is called from the owner goroutine
// when its own polling (Spin, PollInterval) ended a request in flight, and
// when the agent closes. A request that ends inside a caller's Post or Poll
// is seen by that call.
func (a *Agent) OnProgress(wake func()) (stop func()) { return a.wakers.OnProgress(wake) }

func (a *Agent) wake() { a.wakers.Wake() }

// call is one function for the owner goroutine to run; done gets a value
// when it has. Calls are pooled: a call allocates no channel. The caller
// parks on done at once: spinning instead (caller or owner) was measured
// slower on 2 loaded cores, see docs/libnixl.md.
type call struct {
	f    func()
	done chan struct{} // buffered 1
}

var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// do runs f on the owner goroutine and waits for it; ErrClosed once closed.
func (a *Agent) do(f func()) error {
	c := calls.Get().(*call)
	c.f = f
	select {
	case a.calls <- c:
	case <-a.done:
		c.f = nil
		calls.Put(c)
		return nixl.Errorf(nixl.ErrClosed, "libnixl %s", a.name)
	}
	<-c.done
	c.f = nil
	calls.Put(c)
	return nil
}

// Name is the agent's name.
func (a *Agent) Name() string { return a.name }

// Close waits up to Options.CloseWait for requests in flight, releases what it
// can, destroys the NIXL agent and only then unmaps the memory from Alloc.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() {
		err := a.do(func() { a.closeErr = a.st.shutdown(a.opts.CloseWait) })
		if err == nil {
			<-a.done
		}
		a.memMu.Lock()
		for _, m := range a.maps {
			if err := unmap(m); err != nil && a.closeErr == nil {
				a.closeErr = err
			}
		}
		a.maps = nil
		a.memMu.Unlock()
	})
	return a.closeErr
}

// Alloc returns n zeroed bytes of anonymous mmap'd memory (never Go heap, so
// NIXL may keep its address). It stays mapped until Free or Close.
func (a *Agent) Alloc(n int) ([]byte, error) {
	full, err := mmap(n)
	if err != nil {
		return nil, err
	}
	a.memMu.Lock()
	a.maps = append(a.maps, full)
	a.memMu.Unlock()
	return full[:n:n], nil
}

// Free unmaps memory from Alloc. It refuses while a registration lies inside.
func (a *Agent) Free(b []byte) error {
	d := nixl.DescOf(b, 0)
	var inUse bool
	if err := a.do(func() { inUse = a.st.registered(d) }); err != nil {
		return err
	}
	if inUse {
		return nixl.Errorf(nixl.ErrInvalid, "libnixl: Free of registered memory")
	}
	a.memMu.Lock()
	defer a.memMu.Unlock()
	i := slices.IndexFunc(a.maps, func(m []byte) bool { return len(b) > 0 && &m[0] == &b[0] })
	if i < 0 {
		return nixl.Errorf(nixl.ErrInvalid, "libnixl: Free of memory not from Alloc")
	}
	full := a.maps[i]
	a.maps = slices.Delete(a.maps, i, i+1)
	return unmap(full)
}
