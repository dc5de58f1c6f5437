package cuda_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvxfer/kvxfer/nixl/cuda"
)

// TestOpenWithoutTheDriverLibrary: a process without libcuda (every CPU-only
// machine, CI) gets ErrNoGPU naming the library, not a crash; Lazy defers it
// to the first call. On a GPU machine (KVXFER_GPU=1) the real driver is
// loaded instead (gpu_test.go), and Open is once per process.
func TestOpenWithoutTheDriverLibrary(t *testing.T) {
	if os.Getenv("KVXFER_GPU") == "1" {
		t.Skip("KVXFER_GPU=1: this process loads the real driver (Open is once per process)")
	}
	l := cuda.Lazy("/nonexistent/libcuda.so.1")
	_, err := l.DeviceCount()
	if !errors.Is(err, cuda.ErrNoGPU) || !strings.Contains(err.Error(), "/nonexistent/libcuda.so.1") {
		t.Fatalf("DeviceCount without the driver = %v; want ErrNoGPU naming the library", err)
	}
	if _, err := l.IpcOpen(0, cuda.Handle{}); !errors.Is(err, cuda.ErrNoGPU) {
		t.Fatalf("IpcOpen without the driver = %v; want ErrNoGPU", err)
	}
	if _, err := cuda.Open(""); !errors.Is(err, cuda.ErrNoGPU) {
		t.Fatalf("a second Open reports %v; want the first outcome", err)
	}
}

func TestErrorNamesAndCodes(t *testing.T) {
	e := cuda.NewError("cuIpcOpenMemHandle", cuda.ErrInvalidHandle, "")
	if e.Error() != "cuIpcOpenMemHandle: CUDA_ERROR_INVALID_HANDLE (400)" || cuda.Code(e) != 400 {
		t.Fatalf("%q, code %d", e.Error(), cuda.Code(e))
	}
	if cuda.Code(errors.New("x")) != 0 {
		t.Fatal("Code of a non-CUDA error is not 0")
	}
}

// TestOpenReadsKVXFER_LIBCUDA: Open("") loads $KVXFER_LIBCUDA (checked in a
// child process: Open is once per process).
func TestOpenReadsKVXFER_LIBCUDA(t *testing.T) {
	if os.Getenv("KVXFER_CUDA_ENVCHILD") == "1" {
		_, err := cuda.Open("")
		if err == nil || !strings.Contains(err.Error(), "/nonexistent/from-env.so") {
			t.Fatalf("Open with KVXFER_LIBCUDA set: %v", err)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenReadsKVXFER_LIBCUDA$")
	cmd.Env = append(os.Environ(), "KVXFER_CUDA_ENVCHILD=1", "KVXFER_LIBCUDA=/nonexistent/from-env.so")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
