package daemon

import (
	"log/slog"
	"sync"
	"time"

	"github.com/kvxfer/kvxfer/actors/room"
	"github.com/kvxfer/kvxfer/transport"
)

// links are the PUSH sockets to decode PULL endpoints, dialled when a decode
// registers (or on first use). Each link's socket is owned by its own
// goroutine; this map only finds them. Every link watches its connection: a
// decode whose socket goes away (its process died) is reported to lost.
type links struct {
	log  *slog.Logger
	lost func(room.Endpoint)
	mu   sync.Mutex
	by   map[room.Endpoint]*transport.PushLink
}

func newLinks(log *slog.Logger, lost func(room.Endpoint)) *links {
	return &links{log: log, lost: lost, by: map[room.Endpoint]*transport.PushLink{}}
}

// get returns the link to an endpoint, dialling it first if needed.
func (l *links) get(to room.Endpoint) (*transport.PushLink, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if link, ok := l.by[to]; ok {
		return link, nil
	}
	link, err := transport.DialPush(transport.PushConfig{
		Endpoint: transport.TCPEndpoint(to.IP, to.Port), Logger: l.log,
		// Flush at close: the last notices of a graceful shutdown must reach decode.
		FlushTimeout: 2 * time.Second,
		OnDisconnect: func() { l.lost(to) },
	})
	if err != nil {
		return nil, err
	}
	l.by[to] = link
	return link, nil
}

func (l *links) send(to room.Endpoint, frames [][]byte) error {
	link, err := l.get(to)
	if err != nil {
		return err
	}
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
