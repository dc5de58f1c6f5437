package daemon

import (
	"log/slog"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/transport"
)

// links are the PUSH sockets to decode PULL endpoints, dialled on first use.
// Each link's socket is owned by its own goroutine; this map only finds them.
type links struct {
	log *slog.Logger
	mu  sync.Mutex
	by  map[string]*transport.PushLink
}

func newLinks(log *slog.Logger) *links { return &links{log: log, by: map[string]*transport.PushLink{}} }

func (l *links) send(endpoint string, frames [][]byte) error {
	l.mu.Lock()
	link, ok := l.by[endpoint]
	if !ok {
		var err error
		// Flush at close: the last notices of a graceful shutdown must reach decode.
		link, err = transport.DialPush(transport.PushConfig{Endpoint: endpoint, Logger: l.log, FlushTimeout: 2 * time.Second})
		if err != nil {
			l.mu.Unlock()
			return err
		}
		l.by[endpoint] = link
	}
	l.mu.Unlock()
	return link.Send(frames)
}

func (l *links) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ep, link := range l.by {
		link.Close()
		delete(l.by, ep)
	}
}
