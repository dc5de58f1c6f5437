package control

import (
	"github.com/kvxfer/kvxfer/kv"
)

// HelloInfo is the server's answer to hello.
type HelloInfo struct {
	Version    int
	Server     string
	Identity   Identity
	PID        int
	MaxMessage int64
}

// Hello checks the protocol version and, when expect is not nil, that the daemon is
// the rank the caller expects (CodeWrongRank otherwise). Call it first: it also proves
// the server is there, since ZMQ connects lazily.
func (c *Client) Hello(expect *Identity) (HelloInfo, error) {
	n := 1
	if expect != nil {
		n = 4
	}
	res, err := c.call(OpHello, n, func(b []byte) []byte {
		b = appendInt(appendStr(b, "version"), Version)
		if expect != nil {
			b = appendInt(appendStr(b, "rank"), int64(expect.Rank))
			b = appendInt(appendStr(b, "pp_rank"), int64(expect.PPRank))
			b = appendInt(appendStr(b, "dp_rank"), int64(expect.DPRank))
		}
		return b
	})
	if err != nil {
		return HelloInfo{}, err
	}
	var h HelloInfo
	err = eachField(res, func(r *reader, key string) error {
		var v int64
		var err error
		switch key {
		case "server":
			h.Server, err = r.readStr()
			return err
		case "name":
			h.Identity.Name, err = r.readStr()
			return err
		case "version", "rank", "pp_rank", "dp_rank", "pid", "max_message":
			v, err = r.readInt()
		default:
			return r.skip()
		}
		switch key {
		case "version":
			h.Version = int(v)
		case "rank":
			h.Identity.Rank = int(v)
		case "pp_rank":
			h.Identity.PPRank = int(v)
		case "dp_rank":
			h.Identity.DPRank = int(v)
		case "pid":
			h.PID = int(v)
		case "max_message":
			h.MaxMessage = v
		}
		return err
	})
	return h, err
}

// RegisterMemory hands a buffer list to the daemon and returns its slot count.
func (c *Client) RegisterMemory(reg *MemoryRegistration) (slots int, err error) {
	res, err := c.call(OpRegisterMemory, 4, func(b []byte) []byte { return appendMemory(b, reg) })
	if err != nil {
		return 0, err
	}
	err = eachField(res, func(r *reader, key string) error {
		if key != "slots" {
			return r.skip()
		}
		v, err := r.readInt()
		slots = int(v)
		return err
	})
	return slots, err
}

// Open is the creation of a room's sender. traceparent ("" for none) is a W3C trace
// context; traced reports whether the daemon joined the room to it.
func (c *Client) Open(roomID uint64, traceparent string) (traced bool, err error) {
	n := 1
	if traceparent != "" {
		n = 2
	}
	res, err := c.call(OpOpen, n, func(b []byte) []byte {
		b = appendUint(appendStr(b, "room"), roomID)
		if traceparent != "" {
			b = appendStr(appendStr(b, "traceparent"), traceparent)
		}
		return b
	})
	if err != nil {
		return false, err
	}
	err = eachField(res, func(r *reader, key string) error {
		if key != "traced" {
			return r.skip()
		}
		traced, err = r.readBool()
		return err
	})
	return traced, err
}

// Init is sender.init(num_pages, aux_index).
func (c *Client) Init(roomID uint64, numPages, auxIndex int) error {
	_, err := c.call(OpInit, 3, func(b []byte) []byte {
		b = appendUint(appendStr(b, "room"), roomID)
		b = appendInt(appendStr(b, "num_pages"), int64(numPages))
		return appendInt(appendStr(b, "aux_index"), int64(auxIndex))
	})
	return err
}

// Send is sender.send(pages, state): one chunk. state may be nil.
func (c *Client) Send(roomID uint64, pages []int32, state [][]int32) error {
	n := 2
	if state != nil {
		n = 3
	}
	_, err := c.call(OpSend, n, func(b []byte) []byte {
		b = appendUint(appendStr(b, "room"), roomID)
		b = appendInt32sBin(appendStr(b, "pages"), pages)
		if state != nil {
			b = appendArrayHeader(appendStr(b, "state"), len(state))
			for _, s := range state {
				if s == nil {
					b = appendNil(b)
				} else {
					b = appendInt32sBin(b, s)
				}
			}
		}
		return b
	})
	return err
}

// Poll answers the status of many rooms in one round trip. out is reused when it has
// the capacity.
func (c *Client) Poll(rooms []uint64, out []kv.Reply) ([]kv.Reply, error) {
	res, err := c.call(OpPoll, 1, func(b []byte) []byte { return appendRooms(b, rooms) })
	if err != nil {
		return out[:0], err
	}
	out = append(out[:0], make([]kv.Reply, len(rooms))...)
	err = eachField(res, func(r *reader, key string) error {
		switch key {
		case "status":
			return readList(r, len(rooms), func(i int) (err error) { out[i].Status, err = readStatus(r); return })
		case "reason":
			return readList(r, len(rooms), func(i int) (err error) { out[i].Reason, err = readReason(r); return })
		case "prefix_len":
			return readList(r, len(rooms), func(i int) error {
				v, err := r.readInt()
				out[i].PrefixLen = int(v)
				return err
			})
		}
		return r.skip()
	})
	return out, err
}

// Abort is sender.abort() for each room.
func (c *Client) Abort(rooms ...uint64) error {
	_, err := c.call(OpAbort, 1, func(b []byte) []byte { return appendRooms(b, rooms) })
	return err
}

// Clear is sender.clear() for each room.
func (c *Client) Clear(rooms ...uint64) error {
	_, err := c.call(OpClear, 1, func(b []byte) []byte { return appendRooms(b, rooms) })
	return err
}

// Lost names rooms a previous kvxferd of this rank held when it was lost; told
// is how many decode endpoints the daemon told of them.
func (c *Client) Lost(rooms ...uint64) (told int, err error) {
	res, err := c.call(OpLost, 1, func(b []byte) []byte { return appendRooms(b, rooms) })
	if err != nil {
		return 0, err
	}
	err = eachField(res, func(r *reader, key string) error {
		if key != "told" {
			return r.skip()
		}
		v, err := r.readInt()
		told = int(v)
		return err
	})
	return told, err
}

// Failure is what failure_exception needs for one room.
type Failure struct {
	Status  kv.Status
	Reason  kv.Reason
	Message string // "" unless Status is Failed
}

// Failure reads why rooms failed; with clear it also clears them, as SGLang's
// failure_exception does.
func (c *Client) Failure(rooms []uint64, clear bool) ([]Failure, error) {
	res, err := c.call(OpFailure, 2, func(b []byte) []byte {
		return appendBool(appendStr(appendRooms(b, rooms), "clear"), clear)
	})
	if err != nil {
		return nil, err
	}
	out := make([]Failure, len(rooms))
	err = eachField(res, func(r *reader, key string) error {
		switch key {
		case "status":
			return readList(r, len(rooms), func(i int) (err error) { out[i].Status, err = readStatus(r); return })
		case "reason":
			return readList(r, len(rooms), func(i int) (err error) { out[i].Reason, err = readReason(r); return })
		case "message":
			return readList(r, len(rooms), func(i int) (err error) { out[i].Message, err = r.readStr(); return })
		}
		return r.skip()
	})
	return out, err
}

// PopDecodePrefixLen returns decode's prefix length (tokens) for each room.
func (c *Client) PopDecodePrefixLen(rooms []uint64) ([]int, error) {
	res, err := c.call(OpPopDecodePrefixLen, 1, func(b []byte) []byte { return appendRooms(b, rooms) })
	if err != nil {
		return nil, err
	}
	out := make([]int, len(rooms))
	err = eachField(res, func(r *reader, key string) error {
		if key != "prefix_len" {
			return r.skip()
		}
		return readList(r, len(rooms), func(i int) error {
			v, err := r.readInt()
			out[i] = int(v)
			return err
		})
	})
	return out, err
}

// Call sends a request built from a generic map (see docs/control-api.md) and returns
// the decoded result; the id is set by the client. It is for tools and for ops the
// typed methods do not cover, such as batch.
func (c *Client) Call(op string, fields map[string]any) (any, error) {
	delete(fields, "id")
	delete(fields, "op")
	var pre []byte
	for _, k := range sortedKeys(fields) {
		var ok bool
		if pre, ok = appendValue(appendStr(pre, k), fields[k]); !ok {
			return nil, errorf(CodeBadRequest, "field %q has a type outside the msgpack subset", k)
		}
	}
	res, err := c.call(op, len(fields), func(b []byte) []byte { return append(b, pre...) })
	if err != nil {
		return nil, err
	}
	return decodeValue(res)
}
