package mailbox

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

const (
	idle int32 = iota
	running
)

// Mailbox implements actor.Mailbox.
type Mailbox struct {
	mu      sync.Mutex
	in      []any // user messages posted, oldest first (under mu)
	sys     []any // system messages posted (under mu), from sysHead
	sysHead int
	out     []any // user messages taken by the run, not yet handled (run only)
	next    int   // index of the next message in out (run only)

	userN, sysN atomic.Int32 // posted and not yet handled
	status      atomic.Int32
	suspended   atomic.Bool

	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
	process    func() // m.processMessages, bound once
}

// Unbounded returns a producer of Mailboxes, for actor.WithMailbox.
func Unbounded() actor.MailboxProducer {
	return func() actor.Mailbox { return New() }
}

// New returns an empty mailbox.
func New() *Mailbox {
	m := &Mailbox{}
	m.process = m.processMessages
	return m
}

// PostUserMessage implements actor.Mailbox.
func (m *Mailbox) PostUserMessage(msg any) { m.post(&m.in, &m.userN, msg) }

// PostSystemMessage implements actor.Mailbox.
func (m *Mailbox) PostSystemMessage(msg any) { m.post(&m.sys, &m.sysN, msg) }

// post appends msg to q, counts it and schedules the mailbox. The count
// follows the append: a run that finds it zero has not missed the message,
// it sees it once the mailbox is scheduled again.
func (m *Mailbox) post(q *[]any, n *atomic.Int32, msg any) {
	m.mu.Lock()
	*q = append(*q, msg)
	m.mu.Unlock()
	n.Add(1)
	m.schedule()
}

// RegisterHandlers implements actor.Mailbox.
func (m *Mailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker, m.dispatcher = invoker, dispatcher
}

// Start implements actor.Mailbox.
func (m *Mailbox) Start() {}

// UserMessageCount implements actor.Mailbox.
func (m *Mailbox) UserMessageCount() int { return int(m.userN.Load()) }

func (m *Mailbox) schedule() {
	if m.status.CompareAndSwap(idle, running) {
		m.dispatcher.Schedule(m.process)
	}
}

func (m *Mailbox) processMessages() {
	for {
		m.run()
		m.status.Store(idle)
		// A message posted after the run found its queues empty saw the
		// mailbox running and did not schedule it: take it now.
		sys, user := m.sysN.Load(), m.userN.Load()
		if sys == 0 && (m.suspended.Load() || user == 0) {
			return
		}
		if !m.status.CompareAndSwap(idle, running) {
			return // a poster scheduled it again
		}
	}
}

func (m *Mailbox) run() {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
		}
	}()
	i, t := 0, m.dispatcher.Throughput()
	for {
		if i > t {
			i = 0
			runtime.Gosched()
		}
		i++
		if m.sysN.Load() > 0 {
			if msg = m.popSystem(); msg != nil {
				m.sysN.Add(-1)
				switch msg.(type) {
				case *actor.SuspendMailbox:
					m.suspended.Store(true)
				case *actor.ResumeMailbox:
					m.suspended.Store(false)
				default:
					m.invoker.InvokeSystemMessage(msg)
				}
				continue
			}
		}
		if m.suspended.Load() {
			return
		}
		if msg = m.popUser(); msg == nil {
			return
		}
		m.userN.Add(-1)
		m.invoker.InvokeUserMessage(msg)
	}
}

func (m *Mailbox) popSystem() any {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sysHead == len(m.sys) {
		return nil
	}
	msg := m.sys[m.sysHead]
	m.sys[m.sysHead] = nil
	if m.sysHead++; m.sysHead == len(m.sys) {
		m.sys, m.sysHead = m.sys[:0], 0
	}
	return msg
}

// popUser hands out the run's batch in order, taking everything posted
// since as the next batch once it is done: one lock per batch, and the two
// slices trade places so that neither is reallocated.
func (m *Mailbox) popUser() any {
	if m.next == len(m.out) {
		m.mu.Lock()
		m.in, m.out = m.out[:0], m.in
		m.mu.Unlock()
		m.next = 0
		if len(m.out) == 0 {
			return nil
		}
	}
	msg := m.out[m.next]
	m.out[m.next] = nil
	m.next++
	return msg
}
