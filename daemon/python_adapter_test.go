package daemon

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kvxfer/kvxfer/transport/wire"
)

// TestPythonAdapter runs python/tests/test_sender.py (unittest) against this
// kvxferd: the SGLang-shaped KvxferSender registers memory, aborts a room and
// reads failure_exception, and drives a room to Success through init, send and
// poll while this test plays a decode rank that sends a dummy transfer info.
// Skipped without a Python that has pyzmq and msgpack.
func TestPythonAdapter(t *testing.T) {
	py := os.Getenv("KVXFER_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if err := exec.Command(py, "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skipf("no %s with zmq and msgpack (apt install python3-zmq python3-msgpack, or set KVXFER_PYTHON)", py)
	}
	d := startDaemon(t, wire.DialectUnknown)
	const room = 4711
	cmd := exec.Command(py, "-m", "unittest", "-v", "tests.test_sender")
	cmd.Dir = filepath.Join("..", "python")
	cmd.Env = append(os.Environ(), "KVXFER_CONTROL="+d.ControlEndpoint(), "KVXFER_DUMMY_ROOM="+strconv.Itoa(room))
	out := make(chan []byte, 1)
	errc := make(chan error, 1)
	go func() {
		b, err := cmd.CombinedOutput()
		out <- b
		errc <- err
	}()
	// The rank goes live once Python registered its memory; then decode
	// registers and sends a dummy transfer info for the room Python drives.
	deadline := time.Now().Add(30 * time.Second)
	for !d.Live() {
		if time.Now().After(deadline) {
			t.Fatalf("kvxferd never went live:\n%s", <-out)
		}
		time.Sleep(time.Millisecond)
	}
	dec := newDecode(t, d)
	dummy := &wire.TransferInfo{Room: room, DecodeIP: "127.0.0.1", DecodePort: dec.pull.Port(), AgentName: dec.node.Agent.Name(),
		RequiredDstInfoNum: 1, HasIsDummy: true, DummyFlag: true}
	dec.send(t, dummy.Encode())
	b, err := <-out, <-errc
	if err != nil {
		t.Fatalf("python adapter tests failed: %v\n%s", err, b)
	}
	t.Logf("%s", b)
}
