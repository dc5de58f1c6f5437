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
// hint, and an edge: libzmq signals it when a command reaches a socket
// whose previous receive (or ZMQ_EVENTS) took all of them, so a caller reads
// a socket whose fd fired until a receive comes back empty before it waits
// on that socket again.
type fdWait struct {
	ep  *os.File
	rc  syscall.RawConn
	fds []int32 // in the order given to newFDWait
	evs [8]syscall.EpollEvent
}

const epollET = 1 << 31 // EPOLLET as the uint32 of epoll_event.events

func newFDWait(socks ...*zmq.Socket) (*fdWait, error) {
	if len(socks) > 8 {
		return nil, fmt.Errorf("transport: %d sockets: fdWait reports at most 8", len(socks))
	}
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("transport: epoll_create1: %w", err)
	}
	var fds []int32
	fail := func(err error) (*fdWait, error) {
		syscall.Close(epfd)
		return nil, err
	}
	for _, s := range socks {
		fd, err := s.GetFd()
		if err != nil {
			return fail(fmt.Errorf("transport: ZMQ_FD: %w", err))
		}
		fds = append(fds, int32(fd))
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
	return &fdWait{ep: f, rc: rc, fds: fds}, nil
}

// wait returns once a registered fd was signalled since the last wait (at
// once if one was): bit i of fired is the i-th socket given to newFDWait.
func (w *fdWait) wait() (fired uint, err error) {
	var werr error
	err = w.rc.Read(func(fd uintptr) bool {
		n, err := syscall.EpollWait(int(fd), w.evs[:], 0)
		if err != nil && err != syscall.EINTR {
			werr = err
			return true
		}
		for _, ev := range w.evs[:max(n, 0)] {
			for i, f := range w.fds {
				if ev.Fd == f {
					fired |= 1 << i
				}
			}
		}
		return n > 0
	})
	if err != nil {
		return 0, err
	}
	return fired, werr
}

func (w *fdWait) close() { w.ep.Close() }
