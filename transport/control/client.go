package control

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvxfer/kvxfer/kv"
)

// ErrTimeout is returned when the server does not answer within the client's timeout.
// The client stays usable: a late reply is recognised by its id and discarded.
var ErrTimeout = errors.New("kvxfer control: timed out waiting for the reply")

// DefaultTimeout bounds one call.
const DefaultTimeout = 10 * time.Second

// Client is a Go client of the control API: the reference implementation of what the
// Python adapter does, used by tests, benchmarks and tools. It uses a DEALER socket
// (not REQ) so that a timed-out call does not wedge the socket. Calls are serialized by
// a mutex, so a Client may be shared, but one call waits for the previous one: for
// throughput, batch rooms into one call instead.
type Client struct {
	mu      sync.Mutex
	zctx    *zmq.Context
	sock    *zmq.Socket
	poller  *zmq.Poller
	timeout time.Duration
	nextID  uint64
	buf     []byte
	closed  bool
}

// Dial connects to a server endpoint (ipc:// or tcp://). Connecting is asynchronous in
// ZMQ: a missing server shows as ErrTimeout on the first call, so call Hello first.
func Dial(endpoint string) (*Client, error) {
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, err
	}
	sock, err := zctx.NewSocket(zmq.DEALER)
	if err == nil {
		err = sock.SetLinger(0)
	}
	if err == nil {
		err = sock.Connect(endpoint)
	}
	if err != nil {
		if sock != nil {
			sock.Close()
		}
		zctx.Term()
		return nil, fmt.Errorf("kvxfer control: dial %s: %w", endpoint, err)
	}
	c := &Client{zctx: zctx, sock: sock, poller: zmq.NewPoller(), timeout: DefaultTimeout, nextID: 1}
	c.poller.Add(sock, zmq.POLLIN)
	if err := c.setTimeout(DefaultTimeout); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// SetTimeout changes the per-call timeout (send and reply).
func (c *Client) SetTimeout(d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.setTimeout(d)
}

func (c *Client) setTimeout(d time.Duration) error {
	c.timeout = d
	return c.sock.SetSndtimeo(d)
}

// Close closes the socket. It is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	err := c.sock.Close()
	if terr := c.zctx.Term(); err == nil {
		err = terr
	}
	return err
}

// call sends one request (id, op and nfields more fields written by fields) and
// returns the raw msgpack of its result. A server error comes back as *Error.
func (c *Client) call(op string, nfields int, fields func([]byte) []byte) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("kvxfer control: client closed")
	}
	id := c.nextID
	c.nextID++
	b := appendMapHeader(c.buf[:0], nfields+2)
	b = appendUint(appendStr(b, "id"), id)
	b = appendStr(appendStr(b, "op"), op)
	if fields != nil {
		b = fields(b)
	}
	c.buf = b
	if _, err := c.sock.SendMessage([]byte{}, b); err != nil {
		if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
			return nil, ErrTimeout
		}
		return nil, err
	}
	deadline := time.Now().Add(c.timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, ErrTimeout
		}
		polled, err := c.poller.Poll(left)
		if err != nil {
			return nil, err
		}
		if len(polled) == 0 {
			return nil, ErrTimeout
		}
		frames, err := c.sock.RecvMessageBytes(0)
		if err != nil {
			return nil, err
		}
		rep, err := parseReply(frames[len(frames)-1])
		if err != nil {
			return nil, fmt.Errorf("kvxfer control: bad reply to %s: %w", op, err)
		}
		if !rep.hasID || rep.id != id {
			continue // a late reply to a call that timed out
		}
		if !rep.ok {
			return nil, &Error{Code: rep.code, Message: rep.msg}
		}
		return rep.result, nil
	}
}

type reply struct {
	id        uint64
	hasID, ok bool
	result    []byte
	code, msg string
}

func parseReply(b []byte) (reply, error) {
	var rep reply
	err := eachField(b, func(r *reader, key string) error {
		var err error
		switch key {
		case "id":
			if !r.isNil() {
				rep.id, err = r.readUint()
				rep.hasID = err == nil
			}
		case "ok":
			rep.ok, err = r.readBool()
		case "result":
			start := r.off
			err = r.skip()
			rep.result = b[start:r.off]
		case "code":
			rep.code, err = r.readStr()
		case "error":
			rep.msg, err = r.readStr()
		default:
			err = r.skip()
		}
		return err
	})
	return rep, err
}

// eachField walks a msgpack map that spans b; f must consume the value of each key.
func eachField(b []byte, f func(r *reader, key string) error) error {
	r := reader{b: b}
	n, err := r.readMapHeader()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		k, err := r.strBytes()
		if err != nil {
			return err
		}
		if err := f(&r, string(k)); err != nil {
			return fmt.Errorf("%q: %w", k, err)
		}
	}
	if !r.done() {
		return wireError("trailing bytes")
	}
	return nil
}

func appendRooms(b []byte, rooms []uint64) []byte {
	b = appendArrayHeader(appendStr(b, "rooms"), len(rooms))
	for _, r := range rooms {
		b = appendUint(b, r)
	}
	return b
}

// readList reads an array of n elements with f, checking the length.
func readList(r *reader, n int, f func(i int) error) error {
	got, err := r.readArrayHeader()
	if err != nil {
		return err
	}
	if got != n {
		return wireError(fmt.Sprintf("%d elements for %d rooms", got, n))
	}
	for i := 0; i < n; i++ {
		if err := f(i); err != nil {
			return err
		}
	}
	return nil
}

func readStatus(r *reader) (kv.Status, error) {
	v, err := r.readUint()
	if err == nil && v > uint64(kv.StatusSuccess) {
		err = wireError(fmt.Sprintf("status %d", v))
	}
	return kv.Status(v), err
}

func readReason(r *reader) (kv.Reason, error) {
	s, err := r.strBytes()
	if err != nil || len(s) == 0 {
		return kv.ReasonNone, err
	}
	return kv.ParseReason(string(s))
}
