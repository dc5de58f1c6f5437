package zmqio

import (
	"reflect"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// SendMany delivers every message whole, frames and order as given (empty
// frames and one-frame messages included).
func TestSendManyDeliversInOrder(t *testing.T) {
	var mu sync.Mutex
	var got [][][]byte
	pull, err := StartPull(IngestConfig{Host: "127.0.0.1"}, func(f [][]byte) {
		mu.Lock()
		got = append(got, f)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pull.Stop()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = zctx.Term() }()
	push, err := zctx.NewSocket(zmq.PUSH)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = push.Close() }()
	_ = push.SetLinger(0)
	if err := push.Connect(pull.Endpoint()); err != nil {
		t.Fatal(err)
	}
	want := [][][]byte{fr("a", "bc", ""), fr("one"), goldenTransferInfoFrames(), fr("", "z")}
	if err := SendMany(push, want); err != nil {
		t.Fatal(err)
	}
	if err := SendMany(push, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	norm := func(ms [][][]byte) [][]string {
		var out [][]string
		for _, m := range ms {
			var s []string
			for _, f := range m {
				s = append(s, string(f))
			}
			out = append(out, s)
		}
		return out
	}
	if !reflect.DeepEqual(norm(got), norm(want)) {
		t.Fatalf("got %q, want %q", norm(got), norm(want))
	}
}
