package zmqio

/*
#cgo !windows pkg-config: libzmq
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

// kx_rx holds the zmq messages of one drained batch until kx_rx_release:
// the frames are read in place (no copy into Go memory, no cgo crossing per
// frame). frames[i] points into msgs[i]; message m is frames
// [m ? mend[m-1] : 0, mend[m]); trunc[m] is 1 when frames of message m were
// dropped because the batch ran out of room (never within the first
// `headroom` frames of a message).
typedef struct { void *data; size_t size; } kx_frame;
typedef struct {
	zmq_msg_t *msgs;
	kx_frame *frames;
	int *mend;
	unsigned char *trunc;
	int cap, maxmsgs, n;
} kx_rx;

static kx_rx *kx_rx_new(int cap, int maxmsgs) {
	kx_rx *r = calloc(1, sizeof *r);
	if (!r) return NULL;
	r->msgs = calloc(cap, sizeof *r->msgs);
	r->frames = calloc(cap, sizeof *r->frames);
	r->mend = calloc(maxmsgs, sizeof *r->mend);
	r->trunc = calloc(maxmsgs, 1);
	if (!r->msgs || !r->frames || !r->mend || !r->trunc) {
		free(r->msgs); free(r->frames); free(r->mend); free(r->trunc); free(r);
		return NULL;
	}
	r->cap = cap;
	r->maxmsgs = maxmsgs;
	return r;
}

static void kx_rx_release(kx_rx *r) {
	for (int i = 0; i < r->n; i++) zmq_msg_close(&r->msgs[i]);
	r->n = 0;
}

static void kx_rx_free(kx_rx *r) {
	kx_rx_release(r);
	free(r->msgs); free(r->frames); free(r->mend); free(r->trunc); free(r);
}

// kx_send_repeat sends one multipart message (n frames) count times; for the
// ingest benchmarks, so that the sender's cgo crossings do not dominate.
static int kx_send_repeat(void *sock, void **data, size_t *size, int n, int count) {
	for (int c = 0; c < count; c++) {
		for (int i = 0; i < n; i++) {
			if (zmq_send(sock, data[i], size[i], i < n - 1 ? ZMQ_SNDMORE : 0) < 0) return -1;
		}
	}
	return 0;
}

static int kx_sock_type(void *sock) {
	int t = -1;
	size_t n = sizeof t;
	if (zmq_getsockopt(sock, ZMQ_TYPE, &t, &n) != 0) return -1;
	return t;
}

// kx_recv_batch receives whole messages without blocking until none is
// waiting, maxmsgs were received, or fewer than headroom frame slots are
// left. It returns the number of messages; *err is the errno that ended the
// batch (EAGAIN: nothing more waiting), 0 when it ended for lack of room.
static int kx_recv_batch(void *sock, kx_rx *r, int headroom, int *err) {
	int m = 0;
	*err = 0;
	while (m < r->maxmsgs && r->cap - r->n >= headroom) {
		int first = 1, more = 1;
		r->trunc[m] = 0;
		while (more) {
			zmq_msg_t scratch, *msg = r->n < r->cap ? &r->msgs[r->n] : &scratch;
			zmq_msg_init(msg);
			if (zmq_msg_recv(msg, sock, ZMQ_DONTWAIT) < 0) {
				int e = zmq_errno();
				zmq_msg_close(msg);
				if (!first && e == EINTR) continue;
				*err = e;
				if (first) return m;
				// A multipart message is delivered whole; a failure inside one is
				// not expected. Keep what arrived, marked truncated.
				r->trunc[m] = 1;
				r->mend[m] = r->n;
				return m + 1;
			}
			first = 0;
			more = zmq_msg_more(msg);
			if (msg == &scratch) {
				zmq_msg_close(msg);
				r->trunc[m] = 1;
			} else {
				r->frames[r->n].data = zmq_msg_data(msg);
				r->frames[r->n].size = zmq_msg_size(msg);
				r->n++;
			}
		}
		r->mend[m] = r->n;
		m++;
	}
	return m;
}
*/
import "C"

import (
	"syscall"
	"unsafe"

	zmq "github.com/pebbe/zmq4"
)

// Batch receive limits: frame slots and messages per drained batch, and the
// frame slots a message is guaranteed (no layout SGLang sends has more than 25
// frames; frames past a message's first rxHeadroom are dropped only when the
// batch runs out of slots, and DecodeInbound ignores frames past its layout).
const (
	rxFrames   = 8192
	rxMessages = 512
	rxHeadroom = 64
)

// rx receives batches of whole messages from a PULL socket in one cgo call
// per batch, with the frames left in libzmq's message buffers until release.
// Owned by the socket's goroutine.
type rx struct {
	sock unsafe.Pointer
	r    *C.kx_rx
	buf  [][]byte // frame slices of the current batch (C memory)
}

// zmqSocketPtr reads the libzmq socket handle out of a pebbe/zmq4 Socket: its
// first field (zmq4 v1.4.0: type Socket struct { soc unsafe.Pointer; ... }).
// newRx checks the result with zmq_getsockopt(ZMQ_TYPE) before using it.
func zmqSocketPtr(s *zmq.Socket) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(s))
}

// newRx returns a batch receiver for a PULL socket, or nil when the socket
// handle cannot be read (the caller then uses zmq4's RecvMessageBytes).
func newRx(s *zmq.Socket) *rx {
	p := zmqSocketPtr(s)
	if p == nil || C.kx_sock_type(p) != C.ZMQ_PULL {
		return nil
	}
	r := C.kx_rx_new(rxFrames, rxMessages)
	if r == nil {
		return nil
	}
	return &rx{sock: p, r: r, buf: make([][]byte, rxFrames)}
}

// recv drains a batch. It returns the number of messages and the error that
// ended it (nil: EAGAIN, or the batch is full and more may be waiting, which
// full reports).
func (x *rx) recv() (n int, full bool, err error) {
	var e C.int
	n = int(C.kx_recv_batch(x.sock, x.r, rxHeadroom, &e))
	frames := unsafe.Slice(x.r.frames, rxFrames)
	for i := range int(x.r.n) {
		if sz := int(frames[i].size); sz > 0 {
			x.buf[i] = unsafe.Slice((*byte)(frames[i].data), sz)
		} else {
			x.buf[i] = x.buf[i][:0:0]
		}
	}
	switch {
	case e == 0:
		return n, true, nil
	case syscall.Errno(e) == syscall.EAGAIN:
		return n, false, nil
	}
	return n, false, zmq.Errno(syscall.Errno(e))
}

// message returns the frames of message m of the current batch (valid until
// release) and whether frames of it were dropped.
func (x *rx) message(m int) ([][]byte, bool) {
	mend := unsafe.Slice(x.r.mend, rxMessages)
	start := 0
	if m > 0 {
		start = int(mend[m-1])
	}
	return x.buf[start:int(mend[m]):int(mend[m])], unsafe.Slice(x.r.trunc, rxMessages)[m] != 0
}

// release closes the batch's zmq messages: every frame slice of it dies.
func (x *rx) release() {
	clear(x.buf[:int(x.r.n)])
	C.kx_rx_release(x.r)
}

func (x *rx) close() {
	if x.r != nil {
		C.kx_rx_free(x.r)
		x.r = nil
	}
}

// sendRepeat sends frames as one message count times on s in one cgo call
// (for the ingest benchmarks: a cheap sender, so the ingest is what is timed).
func sendRepeat(s *zmq.Socket, frames [][]byte, count int) error {
	n := len(frames)
	data := C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(uintptr(0))))
	size := C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.size_t(0))))
	defer C.free(data)
	defer C.free(size)
	ds, ss := unsafe.Slice((*unsafe.Pointer)(data), n), unsafe.Slice((*C.size_t)(size), n)
	var bufs []unsafe.Pointer
	for i, f := range frames {
		p := C.malloc(C.size_t(len(f) + 1))
		bufs = append(bufs, p)
		copy(unsafe.Slice((*byte)(p), len(f)), f)
		ds[i], ss[i] = p, C.size_t(len(f))
	}
	defer func() {
		for _, p := range bufs {
			C.free(p)
		}
	}()
	if C.kx_send_repeat(zmqSocketPtr(s), (*unsafe.Pointer)(data), (*C.size_t)(size), C.int(n), C.int(count)) != 0 {
		return syscall.EIO
	}
	return nil
}
