//go:build !linux

package zmqio

import (
	"errors"

	zmq "github.com/pebbe/zmq4"
)

// fdWait is Linux only (epoll); elsewhere the ingest waits in zmq_poll.
type fdWait struct{}

func newFDWait(...*zmq.Socket) (*fdWait, error) { return nil, errors.New("transport: no epoll") }

func (*fdWait) wait() (uint, error) { return 0, nil }

func (*fdWait) close() {}
