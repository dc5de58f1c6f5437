package mailbox

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// recorder is a MessageInvoker that records what it handled, in order.
type recorder struct {
	mu      sync.Mutex
	got     []any
	escal   []any
	panicOn any
	onUser  func(any)
}

func (r *recorder) InvokeSystemMessage(m any) { r.add(m) }
func (r *recorder) InvokeUserMessage(m any) {
	if r.onUser != nil {
		r.onUser(m)
	}
	if r.panicOn != nil && m == r.panicOn {
		panic("boom")
	}
	r.add(m)
}
func (r *recorder) EscalateFailure(reason any, m any) {
	r.mu.Lock()
	r.escal = append(r.escal, m)
	r.mu.Unlock()
}
func (r *recorder) add(m any) {
	r.mu.Lock()
	r.got = append(r.got, m)
	r.mu.Unlock()
}
func (r *recorder) list() []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]any(nil), r.got...)
}

// inline runs a scheduled mailbox on the caller's goroutine, at once.
type inline struct{ throughput int }

func (d inline) Schedule(fn func()) { fn() }
func (d inline) Throughput() int    { return d.throughput }

// held queues scheduled runs until the test releases them.
type held struct {
	runs []func()
}

func (d *held) Schedule(fn func()) { d.runs = append(d.runs, fn) }
func (d *held) Throughput() int    { return 300 }
func (d *held) release() {
	for len(d.runs) > 0 {
		fn := d.runs[0]
		d.runs = d.runs[1:]
		fn()
	}
}

type sysMsg struct{ n int }

func TestOrderAndSystemFirst(t *testing.T) {
	r := &recorder{}
	d := &held{}
	m := New()
	m.RegisterHandlers(r, d)
	m.PostUserMessage(1)
	m.PostUserMessage(2)
	m.PostSystemMessage(sysMsg{1})
	m.PostUserMessage(3)
	if len(d.runs) != 1 {
		t.Fatalf("scheduled %d runs for one idle mailbox, want 1", len(d.runs))
	}
	if n := m.UserMessageCount(); n != 3 {
		t.Fatalf("UserMessageCount %d, want 3", n)
	}
	d.release()
	want := []any{sysMsg{1}, 1, 2, 3}
	if got := r.list(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("handled %v, want %v", got, want)
	}
	if n := m.UserMessageCount(); n != 0 {
		t.Fatalf("UserMessageCount %d after the run, want 0", n)
	}
}

// A system message posted while a batch of user messages is being handled
// goes before the rest of the batch.
func TestSystemMessageOvertakesTheBatch(t *testing.T) {
	r := &recorder{}
	m := New()
	r.onUser = func(msg any) {
		if msg == 1 {
			m.PostSystemMessage(sysMsg{9})
		}
	}
	d := &held{}
	m.RegisterHandlers(r, d)
	m.PostUserMessage(1)
	m.PostUserMessage(2)
	d.release()
	want := []any{1, sysMsg{9}, 2}
	if got := r.list(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("handled %v, want %v", got, want)
	}
}

func TestSuspendResume(t *testing.T) {
	r := &recorder{}
	m := New()
	m.RegisterHandlers(r, inline{300})
	m.PostSystemMessage(&actor.SuspendMailbox{})
	m.PostUserMessage(1)
	m.PostUserMessage(2)
	if got := r.list(); len(got) != 0 {
		t.Fatalf("suspended mailbox handled %v", got)
	}
	m.PostSystemMessage(sysMsg{1}) // system messages go on while suspended
	if got := r.list(); fmt.Sprint(got) != fmt.Sprint([]any{sysMsg{1}}) {
		t.Fatalf("handled %v, want the system message alone", got)
	}
	m.PostSystemMessage(&actor.ResumeMailbox{})
	if got := r.list(); fmt.Sprint(got) != fmt.Sprint([]any{sysMsg{1}, 1, 2}) {
		t.Fatalf("after resume handled %v", got)
	}
}

// A panic is escalated with its message; the messages after it are handled
// by the next run.
func TestPanicEscalatesAndLosesNothingElse(t *testing.T) {
	r := &recorder{panicOn: 2}
	d := &held{}
	m := New()
	m.RegisterHandlers(r, d)
	for i := 1; i <= 4; i++ {
		m.PostUserMessage(i)
	}
	d.release()
	if fmt.Sprint(r.escal) != "[2]" {
		t.Fatalf("escalated %v, want [2]", r.escal)
	}
	// processMessages saw messages left and ran again.
	if got := r.list(); fmt.Sprint(got) != "[1 3 4]" {
		t.Fatalf("handled %v, want [1 3 4]", got)
	}
}

// The run yields every Throughput messages (runtime.Gosched) and still
// handles everything.
func TestThroughputYields(t *testing.T) {
	r := &recorder{}
	d := &held{}
	m := New()
	m.RegisterHandlers(r, inlineThroughput{d, 2})
	for i := range 10 {
		m.PostUserMessage(i)
	}
	d.release()
	if got := r.list(); len(got) != 10 {
		t.Fatalf("handled %d of 10", len(got))
	}
}

type inlineThroughput struct {
	*held
	t int
}

func (d inlineThroughput) Throughput() int { return d.t }

// No allocation per message once the slices have grown.
func TestNoAllocationPerMessage(t *testing.T) {
	m := New()
	m.RegisterHandlers(nopInvoker{}, inline{300})
	for i := range 64 {
		m.PostUserMessage(i) // grow once
	}
	msg := any(struct{}{})
	if n := testing.AllocsPerRun(1000, func() { m.PostUserMessage(msg) }); n != 0 {
		t.Fatalf("%.1f allocations per message, want 0", n)
	}
}

type nopInvoker struct{}

func (nopInvoker) InvokeSystemMessage(any)  {}
func (nopInvoker) InvokeUserMessage(any)    {}
func (nopInvoker) EscalateFailure(any, any) {}

// goDispatcher runs each scheduled run on a goroutine of its own, as
// protoactor's default dispatcher does.
type goDispatcher struct{}

func (goDispatcher) Schedule(fn func()) { go fn() }
func (goDispatcher) Throughput() int    { return 300 }

// Many senders at once: every message handled exactly once, each sender's in
// its order, and never two runs at a time.
func TestConcurrentSenders(t *testing.T) {
	const senders, per = 8, 5000
	type msg struct{ from, seq int }
	var (
		mu      sync.Mutex
		last    = make([]int, senders)
		count   int
		running int
		bad     []string
		done    = make(chan struct{})
	)
	for i := range last {
		last[i] = -1
	}
	inv := &funcInvoker{user: func(x any) {
		mu.Lock()
		running++
		if running > 1 {
			bad = append(bad, "two runs at once")
		}
		mu.Unlock()
		m := x.(msg)
		mu.Lock()
		if m.seq != last[m.from]+1 {
			bad = append(bad, fmt.Sprintf("sender %d: %d after %d", m.from, m.seq, last[m.from]))
		}
		last[m.from] = m.seq
		count++
		if count == senders*per {
			close(done)
		}
		running--
		mu.Unlock()
	}}
	mb := New()
	mb.RegisterHandlers(inv, goDispatcher{})
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				mb.PostUserMessage(msg{s, i})
				if i%97 == 0 {
					runtime.Gosched()
				}
			}
		}()
	}
	wg.Wait()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("handled %d of %d within 30 s", count, senders*per)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("%d violations, first: %s", len(bad), bad[0])
	}
}

type funcInvoker struct{ user func(any) }

func (f *funcInvoker) InvokeSystemMessage(any)  {}
func (f *funcInvoker) InvokeUserMessage(m any)  { f.user(m) }
func (f *funcInvoker) EscalateFailure(any, any) {}

// Under a real actor system: request and response through the mailbox.
func TestUnderProtoactor(t *testing.T) {
	sys := actor.NewActorSystem()
	props := actor.PropsFromFunc(func(ctx actor.Context) {
		if n, ok := ctx.Message().(int); ok {
			ctx.Respond(n * 2)
		}
	}, actor.WithMailbox(Unbounded()))
	pid := sys.Root.Spawn(props)
	for i := range 100 {
		res, err := sys.Root.RequestFuture(pid, i, 5*time.Second).Result()
		if err != nil || res != i*2 {
			t.Fatalf("request %d: %v, %v", i, res, err)
		}
	}
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
}
