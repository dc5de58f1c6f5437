//go:build linux

package zmqio

import (
	"fmt"
	"os"
	"syscall"

	zmq "github.com/pebbe/zmq4"
)

// fdWait parks a goroutine in Go's netpoller until one of some ZeroMQ
// sockets may have an event, instead of in a blocking cgo zmq_poll: a
// goroutine in a C call keeps its processor in a system call until Go's
// sysmon takes it back (20 µs or more later; with one processor nothing else
// in the process runs meanwhile), and every such hand-off costs thread
// wake-ups. It is an epoll instance holding the sockets' ZMQ_FDs
// (edge-triggered: libzmq signals that fd whenever a command reaches the
// socket), itself watched by the netpoller. A ZMQ_FD's readiness is only a
// hint: callers check ZMQ_EVENTS (readable) before each wait and drain
// without waiting, as libzmq's documentation of ZMQ_FD requires.
type fdWait struct {
	ep  *os.File
	rc  syscall.RawConn
	evs [8]syscall.EpollEvent
}

const epollET = 1 << 31 // EPOLLET as the uint32 of epoll_event.events

func newFDWait(socks ...*zmq.Socket) (*fdWait, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("transport: epoll_create1: %w", err)
	}
	fail := func(err error) (*fdWait, error) {
		syscall.Close(epfd)
		return nil, err
	}
	for _, s := range socks {
		fd, err := s.GetFd()
		if err != nil {
			return fail(fmt.Errorf("transport: ZMQ_FD: %w", err))
		}
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | epollET, Fd: int32(fd)}
		if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return fail(fmt.Errorf("transport: epoll_ctl ZMQ_FD: %w", err))
		}
	}
	// Non-blocking before NewFile, so that the file is pollable.
	if err := syscall.SetNonblock(epfd, true); err != nil {
		return fail(err)
	}
	f := os.NewFile(uintptr(epfd), "zmq-fds")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &fdWait{ep: f, rc: rc}, nil
}

// wait returns once a registered fd was signalled since the last wait (at
// once if one was).
func (w *fdWait) wait() error {
	var werr error
	err := w.rc.Read(func(fd uintptr) bool {
		n, err := syscall.EpollWait(int(fd), w.evs[:], 0)
		if err != nil && err != syscall.EINTR {
			werr = err
			return true
		}
		return n > 0
	})
	if err != nil {
		return err
	}
	return werr
}

func (w *fdWait) close() { w.ep.Close() }
