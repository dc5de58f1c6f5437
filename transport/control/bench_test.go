package control

import (
	"log/slog"
	"testing"

	"github.com/kvxfer/kvxfer/kv"
)

// nullEngine answers every poll with WaitingForInput at no cost, to measure the
// transport and codec alone.
type nullEngine struct{}

func (nullEngine) Open(uint64)                     {}
func (nullEngine) Init(uint64, int, int)           {}
func (nullEngine) Send(uint64, []int32, [][]int32) {}
func (nullEngine) Abort(uint64)                    {}
func (nullEngine) Clear(uint64)                    {}
func (nullEngine) Poll(rooms []uint64, out []kv.Reply) []kv.Reply {
	out = out[:0]
	for range rooms {
		out = append(out, kv.Reply{Status: kv.StatusWaitingForInput})
	}
	return out
}

func benchRooms(n int) []uint64 {
	rooms := make([]uint64, n)
	for i := range rooms {
		rooms[i] = 1<<62 + uint64(i)*0x9E3779B97F4A7C15>>2 // large ids: 9-byte msgpack ints
	}
	return rooms
}

// BenchmarkPoll1000 is one scheduler iteration's poll of 1,000 queued rooms, round
// trip over ipc: "engine" with the real actors.Engine (rooms opened), "null" with a
// free engine (transport and codec only), "direct" the engine without the API.
func BenchmarkPoll1000(b *testing.B) {
	rooms := benchRooms(1000)
	run := func(b *testing.B, eng Engine) {
		s := startServer(b, eng, nil)
		c := dial(b, s.Endpoint())
		var out []kv.Reply
		var err error
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if out, err = c.Poll(rooms, out); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("null", func(b *testing.B) { run(b, nullEngine{}) })
	b.Run("engine", func(b *testing.B) {
		eng := newEngine(b)
		for _, r := range rooms {
			eng.Open(r)
		}
		run(b, eng)
	})
	b.Run("direct", func(b *testing.B) {
		eng := newEngine(b)
		for _, r := range rooms {
			eng.Open(r)
		}
		var out []kv.Reply
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			out = eng.Poll(rooms, out)
		}
	})
}

// BenchmarkServePoll1000 is the server's side of one such poll without the socket:
// decode the request, call the engine, encode the reply.
func BenchmarkServePoll1000(b *testing.B) {
	req, _ := appendValue(nil, map[string]any{"id": int64(1), "op": "poll", "rooms": func() []any {
		out := []any{}
		for _, r := range benchRooms(1000) {
			out = append(out, r)
		}
		return out
	}()})
	s := &Server{cfg: Config{Engine: nullEngine{}}, log: slog.New(slog.DiscardHandler)}
	b.SetBytes(int64(len(req)))
	b.ReportAllocs()
	var out []byte
	for i := 0; i < b.N; i++ {
		q, err := decodeRequest(req)
		if err != nil {
			b.Fatal(err)
		}
		out = s.handle(out[:0], q, true)
	}
}

// BenchmarkHelloRoundTrip is the floor: the smallest request's round trip over ipc.
func BenchmarkHelloRoundTrip(b *testing.B) {
	s := startServer(b, nullEngine{}, nil)
	c := dial(b, s.Endpoint())
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := c.Hello(nil); err != nil {
			b.Fatal(err)
		}
	}
}
