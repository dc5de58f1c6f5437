package control

import (
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// futex operations on a word of a MAP_SHARED region (not FUTEX_PRIVATE: the
// waker is another process).
const (
	futexWait = 0
	futexWake = 1
	// sysPidfdOpen is pidfd_open(2): 434 on every architecture (the unified
	// syscall table of Linux 5.3+).
	sysPidfdOpen = 434
)

// futexWaitWord sleeps while *w == val, at most d (the doorbell's safety net;
// a wake-up normally comes from the client). Spurious returns are fine.
func futexWaitWord(w *atomic.Uint32, val uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWakeWord(w *atomic.Uint32) {
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake, 1, 0, 0, 0)
}

// pidWatch is a pidfd registered with Go's poller: Wait returns once the
// process has exited (true) or the watch was closed (false).
type pidWatch struct{ f *os.File }

func watchPid(pid int) (*pidWatch, error) {
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if errno != 0 {
		return nil, errno
	}
	if err := syscall.SetNonblock(int(fd), true); err != nil {
		syscall.Close(int(fd))
		return nil, err
	}
	return &pidWatch{f: os.NewFile(fd, "pidfd")}, nil
}

func (p *pidWatch) Wait() bool {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return false
	}
	first := true
	err = rc.Read(func(uintptr) bool {
		if first {
			first = false
			return false // wait for readable: the process exited
		}
		return true
	})
	return err == nil
}

func (p *pidWatch) Close() { p.f.Close() }
