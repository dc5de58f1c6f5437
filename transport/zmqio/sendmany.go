package zmqio

/*
#include <stdlib.h>
#include <zmq.h>

// kx_send_many sends m multipart messages: message j is nframes[j] frames
// taken in turn from data/size. One cgo crossing for all of them.
static int kx_send_many(void *sock, void **data, size_t *size, int *nframes, int m) {
	int f = 0;
	for (int j = 0; j < m; j++) {
		for (int i = 0; i < nframes[j]; i++, f++) {
			if (zmq_send(sock, data[f], size[f], i < nframes[j] - 1 ? ZMQ_SNDMORE : 0) < 0) return -1;
		}
	}
	return 0;
}
*/
import "C"

import (
	"errors"
	"unsafe"

	zmq "github.com/pebbe/zmq4"
)

// SendMany sends msgs, in order, on s (a PUSH socket, blocking when its queue
// is full) in one cgo call: for load generators and benchmarks that need a
// sender much cheaper than the receiver they measure (zmq4 crosses into C once
// per frame). The frames are copied into C memory first.
func SendMany(s *zmq.Socket, msgs [][][]byte) error {
	nf, nb := 0, 0
	for _, m := range msgs {
		nf += len(m)
		for _, f := range m {
			nb += len(f)
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	ptr := C.size_t(unsafe.Sizeof(uintptr(0)))
	data := C.malloc(C.size_t(nf) * ptr)
	size := C.malloc(C.size_t(nf) * C.size_t(unsafe.Sizeof(C.size_t(0))))
	counts := C.malloc(C.size_t(len(msgs)) * C.size_t(unsafe.Sizeof(C.int(0))))
	blob := C.malloc(C.size_t(nb + 1))
	defer C.free(data)
	defer C.free(size)
	defer C.free(counts)
	defer C.free(blob)
	ds, ss := unsafe.Slice((*unsafe.Pointer)(data), nf), unsafe.Slice((*C.size_t)(size), nf)
	cs, bs := unsafe.Slice((*C.int)(counts), len(msgs)), unsafe.Slice((*byte)(blob), nb+1)
	f, off := 0, 0
	for j, m := range msgs {
		cs[j] = C.int(len(m))
		for _, fr := range m {
			copy(bs[off:], fr)
			ds[f], ss[f] = unsafe.Add(blob, off), C.size_t(len(fr))
			f++
			off += len(fr)
		}
	}
	if C.kx_send_many(zmqSocketPtr(s), (*unsafe.Pointer)(data), (*C.size_t)(size), (*C.int)(counts), C.int(len(msgs))) != 0 {
		return errors.New("transport: SendMany: zmq_send failed")
	}
	return nil
}
