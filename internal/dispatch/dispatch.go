// Package dispatch holds a protoactor dispatcher that runs one actor's
// mailbox on one long-lived goroutine.
//
// protoactor's default dispatcher starts a goroutine each time an idle
// mailbox gets a message. A busy actor (a directory shard, which runs its
// rooms' handlers on its own goroutine, or a transfer worker) goes idle and
// busy thousands of times a second, and every new goroutine starts on a small
// stack that then grows by copying to the depth the actor's handlers need:
// about a tenth of kvxferd's CPU per room in the demo's profile was
// runtime.newstack/copystack under those mailboxes. A Loop keeps one
// goroutine per actor, parked on a channel while the mailbox is idle, so its
// stack is grown once.
package dispatch

import "sync"

// Loop is a dispatcher for exactly one mailbox. The mailbox schedules at
// most one run at a time (it moves idle → running with a compare-and-swap),
// so the channel holds at most one pending run; its buffer leaves room to
// spare so a Schedule never waits for the goroutine.
type Loop struct {
	throughput int
	runs       chan func()
	done       chan struct{}
	start      sync.Once
	stop       sync.Once
}

// NewLoop returns a dispatcher that yields (runtime.Gosched) after
// throughput messages, as protoactor's own dispatchers do.
func NewLoop(throughput int) *Loop {
	return &Loop{throughput: throughput, runs: make(chan func(), 4), done: make(chan struct{})}
}

// Schedule runs fn on the loop's goroutine, started on the first call.
// After Close, fn runs on a goroutine of its own, as with protoactor's
// default dispatcher.
func (l *Loop) Schedule(fn func()) {
	l.start.Do(func() { go l.run() })
	select {
	case <-l.done:
		go fn()
		return
	default:
	}
	select {
	case l.runs <- fn:
	case <-l.done:
		go fn()
	}
}

// Throughput is how many messages the mailbox handles before it yields.
func (l *Loop) Throughput() int { return l.throughput }

// Close ends the goroutine once it is idle; runs still queued are handed to
// goroutines of their own, so no mailbox is left marked running.
func (l *Loop) Close() { l.stop.Do(func() { close(l.done) }) }

func (l *Loop) run() {
	for {
		select {
		case fn := <-l.runs:
			fn()
		case <-l.done:
			for {
				select {
				case fn := <-l.runs:
					go fn()
				default:
					return
				}
			}
		}
	}
}
