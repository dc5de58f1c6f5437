package control

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// pythonWithNumpy returns an interpreter with numpy, pyzmq and msgpack or
// msgspec: $KVXFER_SHM_PYTHON, else the SGLang 0.5.18 venv; "" when none.
func pythonWithNumpy() string {
	for _, py := range []string{os.Getenv("KVXFER_SHM_PYTHON"), "/opt/kvxfer-sglang/0.5.18/bin/python"} {
		if py != "" && exec.Command(py, "-c", "import numpy, zmq\ntry:\n import msgpack\nexcept ImportError:\n import msgspec").Run() == nil {
			return py
		}
	}
	return ""
}

// TestPythonShm runs python/tests/test_shm.py: KvxferManager and
// KvxferSender over the shared-memory ring and table of a real engine
// (lifecycle, abort and failure_exception, a bad init, a batched poll of
// 1,000 rooms, slot reuse, a torn read retried, a traceparent carried on the
// ring, garbage dropping only its own session).
func TestPythonShm(t *testing.T) {
	py := pythonWithNumpy()
	if py == "" {
		t.Skip("no python with numpy and zmq (make deps-sglang, or set KVXFER_SHM_PYTHON)")
	}
	eng := newEngine(t)
	s := startServer(t, eng, nil)
	for r := uint64(100); r < 200; r++ {
		eng.TransferInfo(r, info(16))
	}
	cmd := exec.Command(py, "-m", "unittest", "-v", "tests.test_shm")
	cmd.Dir = filepath.Join("..", "..", "python")
	cmd.Env = append(os.Environ(), "KVXFER_CONTROL="+s.Endpoint())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	if st := s.ShmStats(); st.DroppedBad != 1 || st.InvalidSends != 1 || st.TracedOpens != 1 || st.IgnoredTraceparents != 1 {
		t.Fatalf("stats %+v", st)
	}
}
