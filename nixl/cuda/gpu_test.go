package cuda_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/kvxfer/kvxfer/nixl/cuda"
)

// gpu returns the real driver, or skips with the reason: these tests need an
// NVIDIA GPU and KVXFER_GPU=1 (scripts/gpu-check.sh sets it).
func gpu(t *testing.T) cuda.Driver {
	t.Helper()
	if os.Getenv("KVXFER_GPU") != "1" {
		t.Skip("needs an NVIDIA GPU: set KVXFER_GPU=1 on a GPU machine (scripts/gpu-check.sh)")
	}
	d, err := cuda.Open("")
	if err != nil {
		t.Fatalf("KVXFER_GPU=1 but the driver does not load: %v", err)
	}
	return d
}

func TestGPUDriverCopiesAndRanges(t *testing.T) {
	d := gpu(t)
	const n = 1 << 20
	a, err := d.Alloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(0, a)
	b, err := d.Alloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(0, b)
	pat := make([]byte, n)
	for i := range pat {
		pat[i] = byte(i*31 + i>>8)
	}
	if err := d.CopyHtoD(0, a, pat); err != nil {
		t.Fatal(err)
	}
	if err := d.Memset(0, b, 0, n); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyDtoD(0, b+4096, a+4096, n-8192); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := d.CopyDtoH(0, got, b); err != nil {
		t.Fatal(err)
	}
	want := append(append(make([]byte, 4096), pat[4096:n-4096]...), make([]byte, 4096)...)
	if !bytes.Equal(got, want) {
		t.Fatal("device-to-device copy: bytes differ")
	}
	base, size, err := d.AddressRange(0, a+100)
	if err != nil || base != a || size < n {
		t.Fatalf("AddressRange(a+100) = %#x, %d, %v; want %#x, >= %d", base, size, err, a, n)
	}
	if dev, err := d.PointerDevice(0, a); err != nil || dev != 0 {
		t.Fatalf("PointerDevice = %d, %v", dev, err)
	}
	if _, err := d.IpcOpen(0, cuda.Handle{}); err == nil {
		t.Fatal("a zero IPC handle opened")
	}
}

// TestGPUImportFromAnotherProcess: a child process (this test binary)
// allocates and fills device memory and exports it; this process imports it
// through the Importer, reads every byte back to the host, and the child's
// freeing of a second allocation makes that handle refuse to open.
func TestGPUImportFromAnotherProcess(t *testing.T) {
	if os.Getenv("KVXFER_CUDA_EXPORTER") == "1" {
		return
	}
	d := gpu(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestGPUExporterChild$")
	cmd.Env = append(os.Environ(), "KVXFER_CUDA_EXPORTER=1")
	in, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("the exporter child exited before exporting: %v", err)
	}
	var hexLive, hexFreed string
	var n uint64
	if _, err := fmt.Sscanf(line, "EXPORT %s %s %d", &hexLive, &hexFreed, &n); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
	live, _ := hex.DecodeString(hexLive)
	freed, _ := hex.DecodeString(hexFreed)
	im := cuda.NewImporter(d)
	x, err := im.Open(live, 4096, n-4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n-4096)
	if err := d.CopyDtoH(0, got, x.Ptr); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if w := byte((i+4096)*13 + 5); v != w {
			t.Fatalf("imported byte %d = %d, want %d", i+4096, v, w)
		}
	}
	if _, err := im.Open(freed, 0, 64, 0); err == nil {
		t.Fatal("the handle of freed memory opened")
	} else {
		t.Logf("freed handle refused: %v", err)
	}
	if err := im.Close(x); err != nil || im.Handles() != 0 {
		t.Fatalf("close: %v, %d handles", err, im.Handles())
	}
}

func TestGPUExporterChild(t *testing.T) {
	if os.Getenv("KVXFER_CUDA_EXPORTER") != "1" {
		t.Skip("helper process of TestGPUImportFromAnotherProcess")
	}
	d, err := cuda.Open("")
	if err != nil {
		t.Fatal(err)
	}
	const n = 1 << 20
	a, _ := d.Alloc(0, n)
	b, _ := d.Alloc(0, 4096)
	pat := make([]byte, n)
	for i := range pat {
		pat[i] = byte(i*13 + 5)
	}
	if err := d.CopyHtoD(0, a, pat); err != nil {
		t.Fatal(err)
	}
	ha, err := d.IpcGet(0, a)
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := d.IpcGet(0, b)
	d.Free(0, b)
	fmt.Printf("EXPORT %x %x %d\n", ha[:], hb[:], n)
	buf := make([]byte, 1)
	os.Stdin.Read(buf) // until the parent closes stdin
}
